package races

import (
	"testing"

	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/subjects"
)

// TestCommitFenceDiscardsAMintWhoseGateMovedBeforeItsCommit: a mint paused between signing and
// committing while a re-registration lands is refused, returns no credential, and leaves
// `minted` followed by `discarded`.
func TestCommitFenceDiscardsAMintWhoseGateMovedBeforeItsCommit(t *testing.T) {
	t.Parallel()
	pp, p, cli, m, act := harness.PausedPlane(t)
	account := p.Account()

	pp.Armed.Store(true)
	body := harness.Renewal(m.Body(t, "renewStandingBundle", "cli"), act.NextRegistrationProof, account, 0)
	requestID := body["requestId"].(string)
	result := make(chan harness.Outcome, 1)
	go func() {
		result <- harness.AskAsync(cli, harness.OwnerA, "cli", subjects.EndpointManagerAuthority, body)
	}()
	pp.Wait(t)
	// A fence writer lands: the gate's epoch advances, as a re-registration advances it. (It is
	// written to the store directly: a request on the bus could be queued behind the paused
	// worker.)
	harness.WriteGate(t, p, m.Iid, func(row map[string]any) {
		row["processEpoch"] = 1
		row["registrationRevision"] = 2
		row["nonce"] = harness.NewRequestID(t)
	})
	close(pp.Release)

	o := <-result
	if o.Code != "conflict" || len(o.Material.Credentials) != 0 {
		t.Fatalf("the paused mint: got %q %q with %d credentials, want conflict and none", o.Code, o.Message, len(o.Material.Credentials))
	}
	// It was recorded minted (before its commit) and then discarded.
	var keys []string
	for _, d := range subjects.StandingDuties {
		keys = append(keys, m.Pub(t, d))
	}
	var rec harness.MintedRecord
	harness.ReadRecord(t, p, subjects.MintedStream(harness.TestSpace), subjects.MintedSubject(harness.TestSpace, m.Iid, keys), &rec)
	if rec.RequestID != requestID || len(rec.Credentials) != 5 {
		t.Errorf("minted record of the bundle: got request %s with %d credentials, want %s with five", rec.RequestID, len(rec.Credentials), requestID)
	}
	for _, d := range subjects.StandingDuties {
		if c, ok := rec.Of(m.Pub(t, d)); !ok || c.Duty != string(d) {
			t.Errorf("minted record of the bundle: got %+v for %s, want its %s credential", c, m.Pub(t, d), d)
		}
	}
	dec := harness.LastDecision(t, p, "discarded", harness.OwnerA, "cli")
	if dec.RequestID != requestID || dec.Code != "conflict" || len(dec.Credentials) != 5 {
		t.Errorf("got discarded record %+v, want request %s, conflict, five credentials", dec, requestID)
	}
}

// TestCommitFenceRetriesWhenOnlyAnotherMintCommitted: a mint whose CAS loses to another mint's
// commit (the gate's content unchanged) retries and succeeds.
func TestCommitFenceRetriesWhenOnlyAnotherMintCommitted(t *testing.T) {
	t.Parallel()
	pp, p, cli, m, act := harness.PausedPlane(t)
	account := p.Account()
	before := gateRevision(t, p, m.Iid)

	pp.Armed.Store(true)
	result := make(chan harness.Outcome, 1)
	go func() {
		result <- harness.AskAsync(cli, harness.OwnerA, "cli", subjects.EndpointManagerAuthority, harness.Renewal(m.Body(t, "renew", "cli"), act.NextRegistrationProof, account, 0))
	}()
	pp.Wait(t)
	// Another mint commits: the gate rewritten with the bytes it had, at a new revision.
	harness.WriteGate(t, p, m.Iid, nil)
	if after := gateRevision(t, p, m.Iid); after == before {
		t.Fatalf("the other commit did not land on the gate (revision still %d)", after)
	}
	close(pp.Release)
	if o := <-result; o.Code != "" || len(o.Material.Credentials) != 2 {
		t.Fatalf("the paused renewal: got %q %q, want its two credentials", o.Code, o.Message)
	}
}
