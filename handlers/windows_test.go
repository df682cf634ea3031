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
