package main

import (
	"strings"
	"testing"

	"github.com/cotal-ai/authplane/internal/bench"
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
