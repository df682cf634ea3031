package integration

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// pausePoint holds the next mint that reaches the commit fence until released.
type pausePoint struct {
	armed   atomic.Bool
	reached chan struct{}
	release chan struct{}
}

func newPausePoint() *pausePoint {
	return &pausePoint{reached: make(chan struct{}), release: make(chan struct{})}
}

// hook is the plane's BeforeCommit: it holds exactly one mint, the first after arm.
func (pp *pausePoint) hook() {
	if pp.armed.CompareAndSwap(true, false) {
		close(pp.reached)
		<-pp.release
	}
}

func (pp *pausePoint) wait(t testing.TB) {
	t.Helper()
	select {
	case <-pp.reached:
	case <-time.After(10 * time.Second):
		t.Fatal("no mint reached the commit fence")
	}
}

// pausedPlane starts a plane whose next armed mint pauses before its commit, with one manager
// registered by ownerA.cli (who holds supervise).
func pausedPlane(t *testing.T) (*pausePoint, *testPlane, *nats.Conn, *managerKeys, material) {
	t.Helper()
	pp := newPausePoint()
	p := startPlane(t, func(c *service.Config) {
		c.Workers = 4
		c.Hooks = &service.Hooks{BeforeCommit: pp.hook}
	})
	grant(t, p, ownerA, "cli", "supervise")
	cli := callerConn(t, p, ownerA, "cli")
	m := newManagerKeys(t)
	_, act := registered(t, cli, ownerA, "cli", m)
	return pp, p, cli, m, act
}

// TestCommitFenceDiscardsAMintWhoseGateMovedBeforeItsCommit: a mint paused between signing and
// committing while a re-registration lands is refused, returns no credential, and leaves
// `minted` followed by `discarded`.
func TestCommitFenceDiscardsAMintWhoseGateMovedBeforeItsCommit(t *testing.T) {
	t.Parallel()
	pp, p, cli, m, act := pausedPlane(t)
	account := p.Account()

	pp.armed.Store(true)
	body := renewal(m.body(t, "renewStandingBundle", "cli"), act.NextRegistrationProof, account, 0)
	requestID := body["requestId"].(string)
	result := make(chan outcome, 1)
	go func() {
		result <- askAsync(cli, ownerA, "cli", subjects.EndpointManagerAuthority, body)
	}()
	pp.wait(t)
	// A fence writer lands: the gate's epoch advances, as a re-registration advances it. (It is
	// written to the store directly: a request on the bus could be queued behind the paused
	// worker.)
	writeGate(t, p, m.iid, func(row map[string]any) {
		row["processEpoch"] = 1
		row["registrationRevision"] = 2
		row["nonce"] = newRequestID(t)
	})
	close(pp.release)

	o := <-result
	if o.code != "conflict" || len(o.material.Credentials) != 0 {
		t.Fatalf("the paused mint: got %q %q with %d credentials, want conflict and none", o.code, o.message, len(o.material.Credentials))
	}
	// It was recorded minted (before its commit) and then discarded.
	for _, d := range []subjects.Duty{subjects.DutyServe, subjects.DutyGoalWriter, subjects.DutySessionLedger} {
		var rec mintedRecord
		readRecord(t, p, subjects.MintedStream(testSpace), subjects.MintedSubject(testSpace, m.iid, m.pub(t, d)), &rec)
		if rec.RequestID != requestID || rec.Duty != string(d) {
			t.Errorf("minted record of %s: got request %s duty %s, want %s %s", d, rec.RequestID, rec.Duty, requestID, d)
		}
	}
	dec := lastDecision(t, p, "discarded", ownerA, "cli")
	if dec.RequestID != requestID || dec.Code != "conflict" || len(dec.Credentials) != 5 {
		t.Errorf("got discarded record %+v, want request %s, conflict, five credentials", dec, requestID)
	}
}

// TestCommitFenceRetriesWhenOnlyAnotherMintCommitted: a mint whose CAS loses to another mint's
// commit (the gate's content unchanged) retries and succeeds.
func TestCommitFenceRetriesWhenOnlyAnotherMintCommitted(t *testing.T) {
	t.Parallel()
	pp, p, cli, m, act := pausedPlane(t)
	account := p.Account()
	before := gateRevision(t, p, m.iid)

	pp.armed.Store(true)
	result := make(chan outcome, 1)
	go func() {
		result <- askAsync(cli, ownerA, "cli", subjects.EndpointManagerAuthority, renewal(m.body(t, "renew", "cli"), act.NextRegistrationProof, account, 0))
	}()
	pp.wait(t)
	// Another mint commits: the gate rewritten with the bytes it had, at a new revision.
	writeGate(t, p, m.iid, nil)
	if after := gateRevision(t, p, m.iid); after == before {
		t.Fatalf("the other commit did not land on the gate (revision still %d)", after)
	}
	close(pp.release)
	if o := <-result; o.code != "" || len(o.material.Credentials) != 2 {
		t.Fatalf("the paused renewal: got %q %q, want its two credentials", o.code, o.message)
	}
}
