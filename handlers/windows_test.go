package handlers

import (
	"strconv"
	"testing"
	"time"
)

func TestWindowsCountTheLastMinuteAndKeepABoundedSetOfPeers(t *testing.T) {
	w := newWindows()
	t0 := time.Unix(1_800_000_000, 0)
	for i := range 30 {
		w.record("a", t0.Add(time.Duration(i)*time.Second))
	}
	if got := w.count("a", t0.Add(30*time.Second)); got != 30 {
		t.Fatalf("got %d, want 30 in the minute", got)
	}
	if got := w.count("a", t0.Add(75*time.Second)); got != 14 {
		t.Fatalf("75 s on: got %d, want the 14 of the last minute", got)
	}
	if got := w.count("b", t0); got != 0 {
		t.Fatalf("an unseen peer: got %d", got)
	}
	for i := range peerBuckets + 10 {
		w.record("peer-"+strconv.Itoa(i), t0)
	}
	if len(w.byKey) != peerBuckets || w.order.Len() != peerBuckets {
		t.Fatalf("got %d peers kept, want at most %d", len(w.byKey), peerBuckets)
	}
	if w.count("peer-0", t0) != 0 || w.count("peer-"+strconv.Itoa(peerBuckets+9), t0) != 1 {
		t.Fatal("the least recently touched peer was not the one forgotten")
	}
}

func TestAPeerIsAnIPv4AddressOrAnIPv6Slash64(t *testing.T) {
	for addr, want := range map[string]string{
		"203.0.113.7":           "203.0.113.7",
		"::ffff:203.0.113.7":    "203.0.113.7",
		"2001:db8:1:2:3:4:5:6":  "2001:db8:1:2::/64",
		"2001:db8:1:2:ffff::1":  "2001:db8:1:2::/64",
		"[2001:db8:1:3::1]":     "2001:db8:1:3::/64",
		"fe80::1%eth0":          "fe80::/64",
		"not an address":        "not an address",
		"203.0.113.7:443":       "203.0.113.7",
		"[2001:db8:1:2::9]:443": "2001:db8:1:2::/64",
	} {
		if got := peerOf(addr); got != want {
			t.Errorf("peerOf(%q): got %q, want %q", addr, got, want)
		}
	}
}
