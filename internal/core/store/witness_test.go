package store

import (
	"testing"
	"time"
)

// A witness stream's samples count as pushed out exactly the run-starts gone while younger
// than the stream's age, never one that aged out, and each only once.
func TestWitnessSamplesCountOnlyRunStartsPushedOutBeforeTheirAge(t *testing.T) {
	const age = 5 * time.Minute
	t0 := time.Unix(1_800_000_000, 0)
	type sample struct {
		at          time.Duration
		first, last uint64
		want        uint64 // counted by this sample
	}
	for _, tt := range []struct {
		name    string
		samples []sample
	}{
		{"a stream never written", []sample{{0, 0, 0, 0}, {10 * time.Second, 0, 0, 0}}},
		{"run-starts that age out", []sample{{0, 1, 0, 0}, {time.Minute, 1, 40, 0}, {7 * time.Minute, 41, 40, 0}}},
		{"a flood past the budget", []sample{{0, 0, 0, 0}, {10 * time.Second, 25, 40, 24}, {20 * time.Second, 25, 40, 0}}},
		// Run-starts there at a sample may be older than the age by the next: never counted.
		{"a flood past the budget of a stream that held some", []sample{{0, 1, 3, 0}, {10 * time.Second, 25, 40, 21}}},
		{"a flood, then its survivors age out", []sample{
			{0, 0, 0, 0}, {10 * time.Second, 25, 40, 24}, {6 * time.Minute, 41, 40, 0}, {7 * time.Minute, 41, 40, 0},
		}},
		{"a flood that goes on across samples", []sample{
			{0, 0, 0, 0}, {10 * time.Second, 11, 26, 10}, {20 * time.Second, 31, 46, 20}, {30 * time.Second, 31, 46, 0},
		}},
		{"what was gone before the first sample is not counted", []sample{{0, 101, 116, 0}, {10 * time.Second, 101, 116, 0}}},
		{"a stream made again starts over", []sample{{0, 0, 0, 0}, {10 * time.Second, 25, 40, 24}, {20 * time.Second, 0, 0, 0}, {30 * time.Second, 11, 20, 10}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var w witnessWatch
			for i, s := range tt.samples {
				if got := w.observe(t0.Add(s.at), s.first, s.last, age); got != s.want {
					t.Fatalf("sample %d (first %d, last %d at %s): counted %d, want %d", i, s.first, s.last, s.at, got, s.want)
				}
			}
		})
	}
}
