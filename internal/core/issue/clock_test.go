package issue_test

import (
	"context"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/issue"
)

// TestACredentialWhoseExpiryPassedWhileItWasMintedIsWithheld: the clock steps forward while a
// mint is recorded (before its commit) or while it commits. To a credential's expiry or past
// it, nothing leaves: unavailable, the mint discarded, and no fence committed if the step came
// before the commit. Short of it, the credentials leave as signed.
func TestACredentialWhoseExpiryPassedWhileItWasMintedIsWithheld(t *testing.T) {
	for _, tt := range []struct {
		name       string
		step       time.Duration
		committing bool       // the step comes during the commit, not before it
		want       fault.Code // "" = issued
	}{
		{"a step short of the hour they live", 59 * time.Minute, false, ""},
		{"a step to their last second", time.Hour, false, fault.Unavailable},
		{"a step past it", 25 * time.Hour, false, fault.Unavailable},
		{"a step past it as the mint commits", 25 * time.Hour, true, fault.Unavailable},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			e.now = time.Unix(e.now.Unix(), 0) // at the start of a second
			plan := e.plan(t)                  // two credentials that live an hour
			step := func() { e.now = e.now.Add(tt.step) }
			if tt.committing {
				e.fences.Fault = func(string) (error, bool) { step(); return nil, true }
			} else {
				plan.Hook = func(context.Context, []issue.Credential) error { step(); return nil }
			}
			got, err := e.p.Issue(ctx(t), plan)
			if tt.want == "" {
				if err != nil || len(got.Credentials) != 2 || got.Earliest() <= e.now.Unix() {
					t.Fatalf("got %v, %v; want both credentials, expiring after the clock's %d", got, err, e.now.Unix())
				}
				return
			}
			e.wantDiscarded(t, got, err, tt.want)
			if !tt.committing {
				e.unchanged(t, e.first, e.first.Revision)
				e.unchanged(t, e.second, e.second.Revision)
			}
		})
	}
}
