package flows

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/subjects"
)

// TestSupervisorEndEvictsTheSupervisorAndExecutorAtTheEmbeddedBroker: after supervisor-end
// returns, connections made with the supervisor and the executor credentials have been closed
// by the broker and neither can connect again; supervisor-authority and a re-assign of the
// lifecycle are refused with the ended text; the manager's own renewal is refused (a retired
// gate); a repeat of the end reports the same.
func TestSupervisorEndEvictsTheSupervisorAndExecutorAtTheEmbeddedBroker(t *testing.T) {
	t.Parallel()
	p, pa, s := harness.SupervisedPlane(t, nil, time.Now().Add(time.Hour))

	sup := harness.WatchDuty(t, p.NATSURL(), s, subjects.DutySupervisor, s.Prep.Credentials["supervisor"].JWT)
	exec := harness.WatchDuty(t, p.NATSURL(), s, subjects.DutyExecutor, s.Prep.Credentials["executor"].JWT)
	// The manager renews itself as its own supervisor while the assignment stands.
	if o := harness.OwnRenewal(sup.Nc, s, subjects.DutySupervisor, client.OpRenew); o.Code != "" {
		t.Fatalf("own renewal before the end: got %s %q", o.Code, o.Message)
	}

	report := harness.EndEvicting(t, pa, s, sup, exec)
	for _, d := range []subjects.Duty{subjects.DutySupervisor, subjects.DutyExecutor} {
		harness.WantRefusedToConnect(t, p.NATSURL(), s, d, s.Prep.Credentials[string(d)].JWT)
	}
	harness.WantRefusedToConnect(t, p.NATSURL(), s, subjects.DutyServe, s.Act.Credentials["serve"].JWT)

	before := harness.StoreSeqs(t, p)
	_, err := pa.Authority(s, client.OpRenew)
	harness.WantRefusalOf(t, "supervisor-authority after the end", err, "permission-denied", endedText(s.Owner))
	_, err = pa.C.Assign(harness.CallCtx(t), s.AssignBody(time.Now().Add(time.Hour)))
	harness.WantRefusalOf(t, "re-assigning the ended lifecycle", err, "permission-denied", endedText(s.Owner))
	harness.WantUnwritten(t, p, "refusals after the end", before)

	// The manager's own renewal, from a connection the broker still accepts (its owner's
	// caller credential cannot be the supervisor's principal, so the plane sees a renewal by a
	// principal with supervise of the owner).
	harness.Grant(t, p, s.Owner, "cli", "supervise")
	cli := harness.CallerConn(t, p, s.Owner, "cli")
	o := harness.Ask(t, cli, s.Owner, "cli", subjects.EndpointManagerAuthority,
		harness.Renewal(s.M.Body(t, "renew", "cli"), s.Act.NextRegistrationProof, p.Account(), s.Act.ProcessEpoch))
	if o.Code != "failed-precondition" || !strings.Contains(o.Message, "retired") {
		t.Fatalf("manager-authority renewal after the end: got %s %q, want failed-precondition naming the retired gate", o.Code, o.Message)
	}

	again, err := pa.End(s)
	if err != nil {
		t.Fatalf("repeated end: %v", err)
	}
	if fmt.Sprintf("%+v", again) != fmt.Sprintf("%+v", report) {
		t.Errorf("repeated end: got %+v, want the first report %+v", again, report)
	}
	rec := harness.LastDecision(t, p, "ended", harness.OwnerP, "admin")
	if rec.InstanceID != s.M.Iid || rec.Message != "the engagement is over" {
		t.Errorf("ended record: got %+v, want the instance and the reason", rec)
	}
}

// writeAssignment rewrites owner's assignment row in the store with plane-account rights, as
// another writer would; it returns the row's new revision.
func writeAssignment(t testing.TB, p *harness.TestPlane, owner string, edit func(row map[string]any)) uint64 {
	t.Helper()
	ctx := harness.CallCtx(t)
	kv, err := p.JS(t).KeyValue(ctx, subjects.PlatformBucket(harness.TestSpace))
	if err != nil {
		t.Fatal(err)
	}
	key := subjects.AssignmentKey(owner)
	e, err := kv.Get(ctx, key)
	if err != nil {
		t.Fatalf("read %s: %v", key, err)
	}
	var row map[string]any
	if err := json.Unmarshal(e.Value(), &row); err != nil {
		t.Fatal(err)
	}
	edit(row)
	value, err := json.Marshal(row)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := kv.Update(ctx, key, value, e.Revision())
	if err != nil {
		t.Fatalf("write %s: %v", key, err)
	}
	return rev
}

// TestAnEndedLifecycleStaysEndedWhenItsGateAndAssignmentAreRewritten: the end retired the
// generations, so they refuse on their own. A writer with plane-account rights puts the gate
// back to open and the assignment back to assigned: activate, renew and prepare through
// supervisor-authority, and the manager's own renewal, are still refused with the ended text,
// and nothing is minted.
func TestAnEndedLifecycleStaysEndedWhenItsGateAndAssignmentAreRewritten(t *testing.T) {
	t.Parallel()
	p, pa, s := harness.SupervisedPlane(t, nil, time.Now().Add(time.Hour))
	if _, err := pa.End(s); err != nil {
		t.Fatalf("end: %v", err)
	}

	harness.WriteGate(t, p, s.M.Iid, func(row map[string]any) {
		row["state"] = "open"
		delete(row, "op")
		row["nonce"] = harness.NewRequestID(t)
	})
	s.A.Revision = writeAssignment(t, p, s.Owner, func(row map[string]any) {
		row["state"] = "assigned"
		row["nonce"] = harness.NewRequestID(t)
	})
	before := harness.StoreSeqs(t, p)
	for _, op := range []string{client.OpActivate, client.OpRenew, client.OpRenewStandingBundle, client.OpPrepare} {
		_, err := pa.Authority(s, op)
		harness.WantRefusalOf(t, "supervised "+op+" of the ended lifecycle", err, "permission-denied", endedText(s.Owner))
	}
	own := harness.CallerConn(t, p, s.Owner, subjects.SupervisorActor(s.M.Iid))
	if o := harness.OwnRenewal(own, s, subjects.DutySupervisor, client.OpRenew); o.Code != "permission-denied" || !strings.Contains(o.Message, endedText(s.Owner)) {
		t.Errorf("its own renewal: got %s %q, want permission-denied with the ended text", o.Code, o.Message)
	}
	harness.WantUnwritten(t, p, "mints of the ended lifecycle", before)
}
