package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/internal/bench"
	"github.com/cotal-ai/authplane/service"
)

// TestTheBenchTablePrintsTheDisksCeilingsAndTheRatiosToThem: the table has a row for the
// synced-write ceiling (with the time of one write) and for a synced stream at one and at N
// publishers, and each operation's ratio to them beside its ratio to the echo.
func TestTheBenchTablePrintsTheDisksCeilingsAndTheRatiosToThem(t *testing.T) {
	var out strings.Builder
	printReport(&out, &bench.Report{Requesters: 32, CeilingEchoPerS: 30000, CeilingMintPerS: 45000,
		Disk:       &bench.Disk{SyncedWritesPerS: 5000, SyncedWriteUs: 200, StreamPerS: 4000, StreamConcurrentPerS: 6000, Publishers: 32},
		Operations: []bench.Phase{{Op: "renew", RequestsPerS: 3000, RatioToEcho: 0.1, RatioToSync: 0.6, RatioToStream: 0.5}}})
	text := out.String()
	for _, want := range []string{"÷sync", "÷stream", "synced write (ceiling)", "5000", "200 µs a write",
		"synced stream, 1 at once", "synced stream, 32 at once", "0.100    0.000    0.600    0.500"} {
		if !strings.Contains(text, want) {
			t.Errorf("the table lacks %q:\n%s", want, text)
		}
	}
}

// TestTheOwnersPhaseFillsTheSpaceAndAnotherOwnersEndStillRevokes: in a space lowered to 30
// live instances, 12 owners each try their quota of 4 and one more; the space fills to exactly
// its capacity, the owners past it are refused resource-exhausted, and the instance of another
// owner, registered before the fill, is ended with the broker's revocation confirmed, after
// which the broker refuses its supervisor credential. The table prints the phase.
func TestTheOwnersPhaseFillsTheSpaceAndAnotherOwnersEndStillRevokes(t *testing.T) {
	b := bench.Config{Phases: []string{bench.PhaseOwners}, Owners: 12, Requesters: 1, Duration: time.Second, Workers: 8,
		Ops: bench.Operations, EndFill: []int{0}, EndConcurrency: []int{1}, EndRounds: 1, Storm: []int{1}}
	cfg := service.Defaults()
	cfg.Dir, cfg.Workers, cfg.MaxInstancesPerOwner = t.TempDir(), b.Workers, 4
	cfg.Hooks = &service.Hooks{SignersCapacity: 30}
	benchPlane(&cfg, b)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	plane, err := service.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer plane.Close()
	r, err := measure(ctx, plane, cfg.MaxConnections, cfg.MaxInstancesPerOwner, cfg.Dir, b)
	if err != nil {
		t.Fatal(err)
	}
	o := r.Owners
	if o == nil || o.Capacity != 30 || o.Quota != 4 {
		t.Fatalf("the owners phase: %+v; want a space of 30 and a quota of 4", o)
	}
	if o.Live != 30 || o.Prepares+1+o.Listed != 30 || o.In < 6 || o.Refused["resource-exhausted: capacity"] < 1 {
		t.Errorf("the fill: %d live, %d registered by %d owners (%s), %d listed of refused prepares, refused %v; want the space's 30, at least 6 owners in, and refusals past it",
			o.Live, o.Prepares, o.In, bench.HeldText(o.Held), o.Listed, o.Refused)
	}
	if o.Listed > 0 && (o.ListedS < 0 || o.ListedS > 60) {
		t.Errorf("%d keys of prepares refused after their key was listed were still listed %.1f s after the owners stopped (-1: 3 min); want them taken off at once, not by the sweep", o.Listed, o.ListedS)
	}
	for n := range o.Held {
		if n > o.Quota {
			t.Errorf("an owner holds %d instances, past its quota of %d", n, o.Quota)
		}
	}
	if !o.EndDone || !o.CredsRefused {
		t.Errorf("another owner's end at the full space: done %v (refused %q), its credential refused by the broker %v; want both", o.EndDone, o.EndRefused, o.CredsRefused)
	}
	var out strings.Builder
	printReport(&out, r)
	for _, want := range []string{"12 owners, quota 4 each, space of 30: 30 live instances", "owners in:", "another owner's end: done"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the table lacks %q:\n%s", want, out.String())
		}
	}
}
