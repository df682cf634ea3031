package testkit

import (
	"testing"
	"time"
)

func TestStretchedNeverNarrowsABoundAndWidensItAtMostFourTimes(t *testing.T) {
	for _, d := range []time.Duration{time.Millisecond, 5 * time.Second} {
		if got := Stretched(d); got < d || got > maxStretch*d {
			t.Errorf("Stretched(%s) = %s, want between %s and %s", d, got, d, maxStretch*d)
		}
	}
}
