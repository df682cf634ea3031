package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/subjects"
)

// evictionWatch is a connection made with one duty's credential, watched for the broker
// closing it.
type evictionWatch struct {
	nc     *nats.Conn
	closed chan struct{}
	errs   *asyncErrors
}

// watchDuty connects to url as duty d of s with credential token, and never reconnects: a
// revocation must close it for good.
func watchDuty(t testing.TB, url string, s *supervised, d subjects.Duty, token string) *evictionWatch {
	t.Helper()
	w := &evictionWatch{closed: make(chan struct{}), errs: &asyncErrors{}}
	seed, err := s.m.keys[d].Seed()
	if err != nil {
		t.Fatal(err)
	}
	w.nc, err = nats.Connect(url, nats.UserJWTAndSeed(token, string(seed)),
		nats.CustomInboxPrefix(subjects.InboxPrefix(s.owner, subjects.DutyActor(d, s.m.iid, ""))),
		nats.NoReconnect(), w.errs.option(),
		nats.ClosedHandler(func(*nats.Conn) { close(w.closed) }))
	if err != nil {
		t.Fatalf("connect as %s before the end: %v", d, err)
	}
	t.Cleanup(w.nc.Close)
	flush(t, w.nc)
	return w
}

// wantEvicted fails the test unless the broker closed the connection, saying its
// authentication was revoked.
func (w *evictionWatch) wantEvicted(t testing.TB, d subjects.Duty) {
	t.Helper()
	select {
	case <-w.closed:
	case <-time.After(5 * time.Second):
		t.Fatalf("the %s connection is still open after the end: %v %s %v %v", d, w.nc.Status(), w.nc.ConnectedUrl(), w.nc.LastError(), w.errs.all())
	}
	for _, err := range w.errs.all() {
		if strings.Contains(strings.ToLower(err.Error()), "revoked") {
			return
		}
	}
	if err := w.nc.LastError(); err == nil || !strings.Contains(strings.ToLower(err.Error()), "revoked") {
		t.Errorf("the %s connection: closed with %v (async %v), want the broker's revocation", d, err, w.errs.all())
	}
}

// wantRefusedToConnect fails the test unless the broker at url refuses duty d's credential.
func wantRefusedToConnect(t testing.TB, url string, s *supervised, d subjects.Duty, token string) {
	t.Helper()
	seed, err := s.m.keys[d].Seed()
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(url, nats.UserJWTAndSeed(token, string(seed)), nats.MaxReconnects(0))
	if err == nil {
		nc.Close()
		t.Fatalf("the %s credential connected to %s after the end, want it refused", d, url)
	}
	if !errors.Is(err, nats.ErrAuthorization) && !strings.Contains(strings.ToLower(err.Error()), "revoked") && !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Fatalf("the %s credential at %s: got %v, want an authorization refusal", d, url, err)
	}
}

// wantEndReport checks an end's reply describes the final state of s's end: ended, both
// generations and the gate retired, every key minted for the instance revoked and confirmed,
// and no connection of them left.
func wantEndReport(t testing.TB, s *supervised, r *client.EndReport, minted []string) {
	t.Helper()
	if r.Owner != s.owner || r.InstanceID != s.m.iid || r.LifecycleUID != s.m.uid {
		t.Errorf("end report names %s %s %s, want %s %s %s", r.Owner, r.InstanceID, r.LifecycleUID, s.owner, s.m.iid, s.m.uid)
	}
	if r.Assignment.State != client.StateEnded || r.Assignment.Revision <= s.a.Revision {
		t.Errorf("end report assignment: got %+v, want ended at a revision after %d", r.Assignment, s.a.Revision)
	}
	var duties []string
	for _, g := range r.Retired.Generations {
		duties = append(duties, g.Duty)
	}
	if !slices.Equal(duties, []string{"supervisor", "executor"}) || r.Retired.Gate != "retired" {
		t.Errorf("end report retired: got %+v, want the supervisor and executor generations and the gate", r.Retired)
	}
	if !r.Revoked.Done || !slices.Equal(r.Revoked.NKeys, minted) || r.Revoked.Reason != "" {
		t.Errorf("end report revoked: got %+v, want done with every minted key %v", r.Revoked, minted)
	}
	if !r.Evicted.Complete || r.Evicted.Count != len(minted) {
		t.Errorf("end report evicted: got %+v, want complete for %d keys", r.Evicted, len(minted))
	}
}

// endEvicting ends s and fails the test unless the report is complete and the broker closed
// the supervisor's and the executor's connections.
func endEvicting(t testing.TB, pa *platformAdmin, s *supervised, sup, exec *evictionWatch) *client.EndReport {
	t.Helper()
	report, err := pa.end(s)
	if err != nil {
		t.Fatalf("end: %v", err)
	}
	wantEndReport(t, s, report, identityKeys(t, s.m))
	sup.wantEvicted(t, subjects.DutySupervisor)
	exec.wantEvicted(t, subjects.DutyExecutor)
	return report
}

// identityKeys are the five duty keys of m, sorted: what a registered instance's minted
// records name.
func identityKeys(t testing.TB, m *managerKeys) []string {
	t.Helper()
	var out []string
	for _, d := range subjects.StandingDuties {
		out = append(out, m.pub(t, d))
	}
	slices.Sort(out)
	return out
}

// TestSupervisorEndEvictsTheSupervisorAndExecutorAtTheEmbeddedBroker: after supervisor-end
// returns, connections made with the supervisor and the executor credentials have been closed
// by the broker and neither can connect again; supervisor-authority and a re-assign of the
// lifecycle are refused with the ended text; the manager's own renewal is refused (a retired
// gate); a repeat of the end reports the same.
func TestSupervisorEndEvictsTheSupervisorAndExecutorAtTheEmbeddedBroker(t *testing.T) {
	t.Parallel()
	p, pa, s := supervisedPlane(t, nil, time.Now().Add(time.Hour))

	sup := watchDuty(t, p.NATSURL(), s, subjects.DutySupervisor, s.prep.Credentials["supervisor"].JWT)
	exec := watchDuty(t, p.NATSURL(), s, subjects.DutyExecutor, s.prep.Credentials["executor"].JWT)
	// The manager renews itself as its own supervisor while the assignment stands.
	if o := ownRenewal(sup.nc, s, subjects.DutySupervisor, client.OpRenew); o.code != "" {
		t.Fatalf("own renewal before the end: got %s %q", o.code, o.message)
	}

	report := endEvicting(t, pa, s, sup, exec)
	for _, d := range []subjects.Duty{subjects.DutySupervisor, subjects.DutyExecutor} {
		wantRefusedToConnect(t, p.NATSURL(), s, d, s.prep.Credentials[string(d)].JWT)
	}
	wantRefusedToConnect(t, p.NATSURL(), s, subjects.DutyServe, s.act.Credentials["serve"].JWT)

	before := storeSeqs(t, p)
	_, err := pa.authority(s, client.OpRenew)
	wantRefusalOf(t, "supervisor-authority after the end", err, "permission-denied", endedText(s.owner))
	_, err = pa.c.Assign(callCtx(t), s.assignBody(time.Now().Add(time.Hour)))
	wantRefusalOf(t, "re-assigning the ended lifecycle", err, "permission-denied", endedText(s.owner))
	wantUnwritten(t, p, "refusals after the end", before)

	// The manager's own renewal, from a connection the broker still accepts (its owner's
	// caller credential cannot be the supervisor's principal, so the plane sees a renewal by a
	// principal with supervise of the owner).
	grant(t, p, s.owner, "cli", "supervise")
	cli := callerConn(t, p, s.owner, "cli")
	o := ask(t, cli, s.owner, "cli", subjects.EndpointManagerAuthority,
		renewal(s.m.body(t, "renew", "cli"), s.act.NextRegistrationProof, p.Account(), s.act.ProcessEpoch))
	if o.code != "failed-precondition" || !strings.Contains(o.message, "retired") {
		t.Fatalf("manager-authority renewal after the end: got %s %q, want failed-precondition naming the retired gate", o.code, o.message)
	}

	again, err := pa.end(s)
	if err != nil {
		t.Fatalf("repeated end: %v", err)
	}
	if fmt.Sprintf("%+v", again) != fmt.Sprintf("%+v", report) {
		t.Errorf("repeated end: got %+v, want the first report %+v", again, report)
	}
	rec := lastDecision(t, p, "ended", ownerP, "admin")
	if rec.InstanceID != s.m.iid || rec.Message != "the engagement is over" {
		t.Errorf("ended record: got %+v, want the instance and the reason", rec)
	}
}

// TestSupervisorEndRevokesOnAThreeNodeCluster: against a three-node cluster with R3 stores,
// the end's push goes through `$SYS` to every server: the supervisor and executor, connected
// to two different servers, are closed by their brokers, no server takes their credentials
// again, and a server restarted afterwards still refuses them.
func TestSupervisorEndRevokesOnAThreeNodeCluster(t *testing.T) {
	t.Parallel()
	c := startCluster(t, testSpace, 3)
	_, pa, s := supervisedPlane(t, againstCluster(c), time.Now().Add(time.Hour))

	sup := watchDuty(t, c.URL(1), s, subjects.DutySupervisor, s.prep.Credentials["supervisor"].JWT)
	exec := watchDuty(t, c.URL(2), s, subjects.DutyExecutor, s.prep.Credentials["executor"].JWT)

	endEvicting(t, pa, s, sup, exec)
	for i := range 3 {
		for _, d := range []subjects.Duty{subjects.DutySupervisor, subjects.DutyExecutor} {
			wantRefusedToConnect(t, c.URL(i), s, d, s.prep.Credentials[string(d)].JWT)
		}
	}

	c.restart(t, 2)
	for _, d := range []subjects.Duty{subjects.DutySupervisor, subjects.DutyExecutor} {
		wantRefusedToConnect(t, c.URL(2), s, d, s.prep.Credentials[string(d)].JWT)
	}
}

// writeAssignment rewrites owner's assignment row in the store with plane-account rights, as
// another writer would; it returns the row's new revision.
func writeAssignment(t testing.TB, p *testPlane, owner string, edit func(row map[string]any)) uint64 {
	t.Helper()
	ctx := callCtx(t)
	kv, err := p.JS(t).KeyValue(ctx, subjects.PlatformBucket(testSpace))
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
	p, pa, s := supervisedPlane(t, nil, time.Now().Add(time.Hour))
	if _, err := pa.end(s); err != nil {
		t.Fatalf("end: %v", err)
	}

	writeGate(t, p, s.m.iid, func(row map[string]any) {
		row["state"] = "open"
		delete(row, "op")
		row["nonce"] = newRequestID(t)
	})
	s.a.Revision = writeAssignment(t, p, s.owner, func(row map[string]any) {
		row["state"] = "assigned"
		row["nonce"] = newRequestID(t)
	})
	before := storeSeqs(t, p)
	for _, op := range []string{client.OpActivate, client.OpRenew, client.OpRenewStandingBundle, client.OpPrepare} {
		_, err := pa.authority(s, op)
		wantRefusalOf(t, "supervised "+op+" of the ended lifecycle", err, "permission-denied", endedText(s.owner))
	}
	own := callerConn(t, p, s.owner, subjects.SupervisorActor(s.m.iid))
	if o := ownRenewal(own, s, subjects.DutySupervisor, client.OpRenew); o.code != "permission-denied" || !strings.Contains(o.message, endedText(s.owner)) {
		t.Errorf("its own renewal: got %s %q, want permission-denied with the ended text", o.code, o.message)
	}
	wantUnwritten(t, p, "mints of the ended lifecycle", before)
}
