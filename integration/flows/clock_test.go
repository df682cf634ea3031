package flows

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// TestNoCredentialLeavesWhoseExpiryPassedWhileItWasMinted: the plane's clock (a test clock
// through service.Config.Now: the wall clock cannot be moved here) steps forward while a
// renewal is between its `minted` records and its commit. To the executor's five minutes or
// past the supervisor's standing day, nothing leaves: `unavailable` with no credential, the
// mint recorded `discarded`, no fence moved. Short of both, the credentials leave, expiring
// after the plane's clock; and a renewal after any step is issued on the new time.
func TestNoCredentialLeavesWhoseExpiryPassedWhileItWasMinted(t *testing.T) {
	t.Parallel()
	clock := &harness.FakeClock{}
	var step atomic.Int64 // the step the next mint takes before its commit
	p := harness.StartPlane(t, func(c *service.Config) {
		c.Now = clock.Now
		c.Hooks = &service.Hooks{BeforeCommit: func() { clock.Advance(time.Duration(step.Swap(0))) }}
	})
	r := harness.NewRegisteredManager(t, p)
	wantLive := func(what string, mat harness.Material) {
		t.Helper()
		if len(mat.Credentials) != 2 {
			t.Fatalf("%s: got %d credentials, want the supervisor's and the executor's", what, len(mat.Credentials))
		}
		for duty, c := range mat.Credentials {
			if now := clock.Now().Unix(); c.Exp <= now {
				t.Errorf("%s: the %s credential expires at %d, already passed on the plane's clock (%d)", what, duty, c.Exp, now)
			}
		}
	}

	for _, tt := range []struct {
		name   string
		step   time.Duration
		issued bool
	}{
		{"a minute, within both lives", time.Minute, true},
		{"five minutes, the executor's life", 5 * time.Minute, false},
		{"a day and an hour, past the supervisor's", 25 * time.Hour, false},
	} {
		body := r.Renewal(t, "renew")
		before := harness.StoreSeqs(t, p).Except(subjects.MintedStream(harness.TestSpace))
		step.Store(int64(tt.step))
		o := harness.Ask(t, r.Cli, harness.OwnerA, "cli", subjects.EndpointManagerAuthority, body)
		if tt.issued {
			if o.Code != "" {
				t.Fatalf("%s: got %s %q, want the credentials", tt.name, o.Code, o.Message)
			}
			wantLive(tt.name, o.Material)
			continue
		}
		if o.Code != "unavailable" || len(o.Material.Credentials) != 0 || !strings.Contains(o.Message, "the clock passed") {
			t.Errorf("%s: got %q %q with %d credentials, want unavailable saying the clock passed an expiry, and none", tt.name, o.Code, o.Message, len(o.Material.Credentials))
		}
		harness.WantUnwritten(t, p, tt.name, before)
		if d := harness.LastDecision(t, p, "discarded", harness.OwnerA, "cli"); d.RequestID != body["requestId"] || d.Code != "unavailable" {
			t.Errorf("%s: got discarded record %+v, want request %s discarded unavailable", tt.name, d, body["requestId"])
		}
		wantLive(tt.name+", then a renewal on the new time", harness.MustMint(t, r.Cli, harness.OwnerA, "cli", r.Renewal(t, "renew")))
	}
}

// TestAClockStepPastAnAssignmentsEndIssuesNothingUnderIt: the plane's clock steps past a
// platform supervisor assignment's end: a supervised renewal, through supervisor-authority and
// the manager's own, is refused `permission-denied`, and nothing is written. (Past an end the
// wall clock reached, TestASupervisedManagerRenewingItselfIsClampedToItsAssignmentAndRefusedAfterIt.)
func TestAClockStepPastAnAssignmentsEndIssuesNothingUnderIt(t *testing.T) {
	t.Parallel()
	clock := &harness.FakeClock{}
	p, pa, s := harness.SupervisedPlane(t, func(c *service.Config) { c.Now = clock.Now }, time.Now().Add(time.Hour))
	own := harness.DutyConn(t, p, s.M, s.Owner, subjects.DutySupervisor, s.Prep.Credentials["supervisor"].JWT)
	clock.Advance(time.Hour + time.Minute)

	before := harness.StoreSeqs(t, p)
	_, err := pa.Authority(s, client.OpRenew)
	harness.WantRefusalOf(t, "a supervised renewal past the assignment's end", err, "permission-denied", "ended")
	if o := harness.OwnRenewal(own, s, subjects.DutySupervisor, client.OpRenew); o.Code != "permission-denied" || len(o.Material.Credentials) != 0 {
		t.Errorf("the manager's own renewal past the assignment's end: got %q %q with %d credentials, want permission-denied and none", o.Code, o.Message, len(o.Material.Credentials))
	}
	harness.WantUnwritten(t, p, "renewals past the assignment's end", before)
}
