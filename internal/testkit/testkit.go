// Package testkit holds what the tests of every package share and no production code imports
// (integration/documents checks that): polling a condition instead of sleeping, the checks of a
// refusal's bounds, an identity provider, and an in-memory bucket and record stream.
package testkit

import (
	"testing"
	"time"
)

// CheckFor calls fn every `every` until it returns nil, and fails the test with fn's last
// error if that has not happened within total. Poll; never sleep and hope.
func CheckFor(t testing.TB, total, every time.Duration, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(total)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not true within %s: %v", total, err)
		}
		time.Sleep(every)
	}
}
