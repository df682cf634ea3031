package flows

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/subjects"
)

// shortAssignment is an end nine to ten seconds from now, in whole seconds: time for a
// supervised prepare, activate and renewals on a loaded machine (four seconds were not, under
// the race detector beside two burners: the duty's credential, clamped to the end, expired before
// its own renewal was sent), and a wait after that the tests run in parallel.
func shortAssignment() time.Time { return time.Unix(time.Now().Unix()+10, 0) }

// waitPast polls until the clock is past end (no sleep and hope).
func waitPast(t testing.TB, end time.Time) {
	t.Helper()
	testkit.CheckFor(t, time.Until(end)+10*time.Second, 50*time.Millisecond, func() error {
		if !time.Now().After(end.Add(time.Second)) {
			return fmt.Errorf("now is %s, the assignment ends at %s", time.Now().Format(time.TimeOnly), end.Format(time.TimeOnly))
		}
		return nil
	})
}

// wantClamped fails the test unless every credential of materials expires at the end at the
// latest, and so does each material.
func wantClamped(t testing.TB, end time.Time, materials ...*client.Material) {
	t.Helper()
	n := 0
	for duty, all := range claimsOf(t, materials...) {
		for _, uc := range all {
			n++
			if uc.Expires == 0 || uc.Expires > end.Unix() {
				t.Errorf("%s credential %s: exp %d, want at most the assignment's end %d", duty, uc.Subject, uc.Expires, end.Unix())
			}
		}
	}
	for _, m := range materials {
		if m.ExpiresAt > end.UnixMilli() {
			t.Errorf("%s material: expiresAt %d ms, want at most %d", m.Operation, m.ExpiresAt, end.UnixMilli())
		}
	}
	if n == 0 {
		t.Fatal("no credential to check")
	}
}

// TestEveryCredentialIssuedUnderAnAssignmentExpiresByItsEnd: prepare, activate, renew and
// renewStandingBundle through supervisor-authority issue credentials for all five duties, each
// decoded to an exp no later than the assignment's expiresAt; once it has passed, renew and
// prepare are refused and write nothing, and the credentials no longer connect.
func TestEveryCredentialIssuedUnderAnAssignmentExpiresByItsEnd(t *testing.T) {
	harness.Long(t, "waits out an assignment's end")
	t.Parallel()
	end := shortAssignment()
	p, pa, s := harness.SupervisedPlane(t, nil, end)
	renewed, err := pa.Authority(s, client.OpRenew)
	if err != nil {
		t.Fatalf("supervised renew: %v", err)
	}
	bundle, err := pa.Authority(s, client.OpRenewStandingBundle)
	if err != nil {
		t.Fatalf("supervised renewStandingBundle: %v", err)
	}
	harness.WantDuties(t, "renewStandingBundle", *bundle, "supervisor", "executor", "serve", "goalWriter", "sessionLedger")
	wantClamped(t, end, s.Prep, s.Act, renewed, bundle)
	// Accepted while the assignment stands; cut off by the broker at its end.
	live := harness.WatchDuty(t, p.NATSURL(), s, subjects.DutySupervisor, bundle.Credentials["supervisor"].JWT)

	waitPast(t, end)
	select {
	case <-live.Closed:
	case <-time.After(5 * time.Second):
		t.Errorf("the supervisor's connection outlived its credential")
	}
	before := harness.StoreSeqs(t, p)
	for _, op := range []string{client.OpRenew, client.OpPrepare} {
		_, err := pa.Authority(s, op)
		harness.WantRefusalOf(t, "supervised "+op+" after the end", err, "permission-denied", "platform supervisor lifecycle has ended for owner "+s.Owner)
	}
	harness.WantUnwritten(t, p, "supervised mints after the end", before)
	for duty, c := range bundle.Credentials {
		seed, err := s.M.Keys[subjects.Duty(duty)].Seed()
		if err != nil {
			t.Fatal(err)
		}
		if nc, err := nats.Connect(p.NATSURL(), nats.UserJWTAndSeed(c.JWT, string(seed)), nats.MaxReconnects(0)); err == nil {
			nc.Close()
			t.Errorf("the %s credential connected after the assignment's end", duty)
		}
	}
}

// TestASupervisedManagerRenewingItselfIsClampedToItsAssignmentAndRefusedAfterIt: the gate of a
// supervised prepare carries supervisedUntil, so the instance's own supervisor and executor
// renewing through manager-authority, and a person of its owner with supervise, are clamped to
// the assignment; after it they are refused, with no end called.
func TestASupervisedManagerRenewingItselfIsClampedToItsAssignmentAndRefusedAfterIt(t *testing.T) {
	harness.Long(t, "waits out an assignment's end")
	t.Parallel()
	end := shortAssignment()
	p, _, s := harness.SupervisedPlane(t, nil, end)
	harness.Grant(t, p, s.Owner, "cli", "supervise")
	person := harness.CallerConn(t, p, s.Owner, "cli")
	quiet := (&harness.AsyncErrors{}).Option() // their expiry is expected
	supConn := harness.DutyConn(t, p, s.M, s.Owner, subjects.DutySupervisor, s.Prep.Credentials["supervisor"].JWT, quiet)
	execConn := harness.DutyConn(t, p, s.M, s.Owner, subjects.DutyExecutor, s.Prep.Credentials["executor"].JWT, quiet)

	var got []*client.Material
	for _, tt := range []struct {
		nc *nats.Conn
		d  subjects.Duty
		op string
	}{{supConn, subjects.DutySupervisor, client.OpRenew}, {supConn, subjects.DutySupervisor, client.OpRenewStandingBundle}, {execConn, subjects.DutyExecutor, client.OpRenew}} {
		o := harness.OwnRenewal(tt.nc, s, tt.d, tt.op)
		if o.Code != "" {
			t.Fatalf("%s %s of its own: got %s %q", tt.d, tt.op, o.Code, o.Message)
		}
		got = append(got, &o.Material)
	}
	o := harness.Ask(t, person, s.Owner, "cli", subjects.EndpointManagerAuthority,
		harness.Renewal(s.M.Body(t, "renewStandingBundle", "cli"), s.Act.NextRegistrationProof, p.Account(), s.Act.ProcessEpoch))
	if o.Code != "" {
		t.Fatalf("the owner's renewal: got %s %q", o.Code, o.Message)
	}
	wantClamped(t, end, append(got, &o.Material)...)

	waitPast(t, end)
	before := harness.StoreSeqs(t, p)
	// Its own supervisor's principal, on a connection the broker still takes (a caller
	// credential of that principal: its own minted one has expired).
	ownPrincipal := subjects.SupervisorActor(s.M.Iid)
	own := harness.CallerConn(t, p, s.Owner, ownPrincipal)
	if o := harness.OwnRenewal(own, s, subjects.DutySupervisor, client.OpRenew); o.Code != "permission-denied" ||
		!strings.Contains(o.Message, "platform supervisor lifecycle has ended for owner "+s.Owner) {
		t.Errorf("its own renewal after the end: got %s %q, want permission-denied: the lifecycle has ended", o.Code, o.Message)
	}
	o = harness.Ask(t, person, s.Owner, "cli", subjects.EndpointManagerAuthority,
		harness.Renewal(s.M.Body(t, "renew", "cli"), s.Act.NextRegistrationProof, p.Account(), s.Act.ProcessEpoch))
	if o.Code != "permission-denied" || !strings.Contains(o.Message, "it issues nothing") {
		t.Errorf("the owner's renewal after the end: got %s %q, want permission-denied: the assignment issues nothing", o.Code, o.Message)
	}
	harness.WantUnwritten(t, p, "renewals after the end", before)
}
