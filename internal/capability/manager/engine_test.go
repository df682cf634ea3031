package manager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/internal/core/audit"
	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/internal/core/store"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/subjects"
)

const testOwner = "u_aaaaaaaaaaaaaaaaaaaaaaaaaa"

type engineEnv struct {
	e       *Engine
	gates   *testkit.KV
	records *testkit.Stream
	ids     client.Identities
	iid     string
}

func newEngineEnv(t *testing.T) *engineEnv {
	t.Helper()
	acct, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	acctPub, err := acct.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	signer, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	iss, err := issue.NewIssuer(acctPub, signer, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ProofKey(signer)
	if err != nil {
		t.Fatal(err)
	}
	actors := testkit.NewKV()
	row, err := json.Marshal(ActorRow{V: 1, Owner: testOwner, Actor: "cli", Scope: []string{Supervise}})
	if err != nil {
		t.Fatal(err)
	}
	actors.Put(subjects.ActorKey(testOwner, "cli"), row)
	env := &engineEnv{gates: testkit.NewKV(), records: testkit.NewStream(), ids: identities(t), iid: strings.Repeat("i", 26)}
	pipeline := &issue.Pipeline{Issuer: iss, Audit: audit.New("default", env.records, slog.New(slog.DiscardHandler), time.Now), Claims: &issue.Claims{KV: env.gates}, Now: time.Now}
	// The fence bucket's commits group, as the plane's do.
	env.e = &Engine{Space: "default", Account: acctPub, Gates: fence.Group(env.gates), Ledger: actors, Pipeline: pipeline,
		Admissions: testkit.NewKV(), Statuses: testkit.NewKV(), Witness: witnessAll{},
		ProofKey: key, StandingTTL: 24 * time.Hour, MaxInstancesPerOwner: 3}
	return env
}

// witnessAll witnesses every run-start: the unit tests of runs are not about the witness.
type witnessAll struct{}

func (witnessAll) Witnessed(context.Context, string) (bool, error) { return true, nil }

func (witnessAll) OpenWitness(context.Context, string) {}

func (env *engineEnv) request(t *testing.T, op string, extra ...any) []byte {
	t.Helper()
	b := with(map[string]any{
		"v": 1, "kind": Kind, "operation": op, "space": "default", "actor": "cli",
		"instanceId": env.iid, "managerLifecycleUid": strings.Repeat("l", 26),
		"requestId": strings.Repeat("r", 22), "identities": env.ids,
	}, extra...)
	data, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func (env *engineEnv) serve(t *testing.T, data []byte) (*client.Material, error) {
	t.Helper()
	return env.serveWithin(t, 2*time.Second, data)
}

// serveWithin is serve with the request's deadline d.
func (env *engineEnv) serveWithin(t *testing.T, d time.Duration, data []byte) (*client.Material, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	reply, _, err := env.e.ServiceAuthority(ctx, Caller{Owner: testOwner, Actor: "cli"}, audit.Request{}, data)
	if err != nil {
		return nil, err
	}
	return reply.(*client.Material), nil
}

// recorded returns the minted records and the audit decisions written so far.
func (env *engineEnv) recorded(t *testing.T) (minted int, decisions []audit.Decision) {
	t.Helper()
	for _, m := range env.records.Msgs() {
		if strings.Contains(m.Subject, ".minted.") {
			minted++
			continue
		}
		var d audit.Decision
		if err := json.Unmarshal(m.Data, &d); err != nil {
			t.Fatal(err)
		}
		decisions = append(decisions, d)
	}
	return minted, decisions
}

// registered prepares and activates the instance and returns the proof renewals need.
func (env *engineEnv) registered(t *testing.T) string {
	t.Helper()
	prep, err := env.serve(t, env.request(t, OpPrepare))
	if err != nil {
		t.Fatal(err)
	}
	act, err := env.serve(t, env.request(t, OpActivate, "registrationProof", prep.RegistrationProof))
	if err != nil {
		t.Fatal(err)
	}
	return act.NextRegistrationProof
}

// wantDiscarded checks a refusal that signed first: its code, no material, the gate bucket
// untouched since before, and one `discarded` record naming every credential signed.
func (env *engineEnv) wantDiscarded(t *testing.T, m *client.Material, err error, code fault.Code, before uint64, creds int) {
	t.Helper()
	if m != nil || fault.CodeOf(err) != code {
		t.Fatalf("got %v, %v; want no material and %s", m, err, code)
	}
	if after := env.gates.Revision(); after != before {
		t.Errorf("the gates moved from revision %d to %d; nothing may commit", before, after)
	}
	_, decisions := env.recorded(t)
	if len(decisions) != 1 || decisions[0].Decision != audit.Discarded ||
		decisions[0].Code != string(code) || len(decisions[0].Credentials) != creds {
		t.Fatalf("got decisions %+v, want one discarded %s with %d credentials", decisions, code, creds)
	}
}

// failMinted makes every later `minted` record fail with cause, as a full or unreachable
// stream would.
func (env *engineEnv) failMinted(cause error) {
	env.records.Fault = func(subject string) (error, bool) {
		if strings.Contains(subject, ".minted.") {
			return cause, false
		}
		return nil, true
	}
}

func TestAMintWhoseMintedRecordCannotBeWrittenIsNeverCommitted(t *testing.T) {
	for _, c := range []struct {
		cause error
		code  fault.Code
	}{
		{errors.New("nats: connection closed"), fault.Unavailable},
		{fmt.Errorf("maximum bytes exceeded: %w", store.ErrFull), fault.ResourceExhausted},
	} {
		t.Run(string(c.code), func(t *testing.T) {
			t.Run("prepare", func(t *testing.T) {
				env := newEngineEnv(t)
				env.failMinted(c.cause)
				m, err := env.serve(t, env.request(t, OpPrepare))
				env.wantDiscarded(t, m, err, c.code, 0, 2)
			})
			t.Run("renewStandingBundle", func(t *testing.T) {
				env := newEngineEnv(t)
				proof := env.registered(t)
				before := env.gates.Revision()
				env.failMinted(c.cause)
				m, err := env.serve(t, env.request(t, OpRenewStandingBundle, "registrationProof", proof, "accountPublicKey", env.e.Account, "processEpoch", 0))
				env.wantDiscarded(t, m, err, c.code, before, 5)
			})
		})
	}
}

func TestAFencedPlaneDiscardsAMintBeforeItsCommit(t *testing.T) {
	env := newEngineEnv(t)
	proof := env.registered(t)
	before := env.gates.Revision()
	env.e.Pipeline.Fenced = func() bool { return true }
	m, err := env.serve(t, env.request(t, OpRenew, "registrationProof", proof, "accountPublicKey", env.e.Account, "processEpoch", 0))
	env.wantDiscarded(t, m, err, fault.Unavailable, before, 2)
}

func TestAGateWithADeleteMarkerSignsNothing(t *testing.T) {
	for _, op := range []string{OpPrepare, OpActivate, OpRenew} {
		t.Run(op, func(t *testing.T) {
			env := newEngineEnv(t)
			proof := env.registered(t)
			env.gates.Delete(subjects.GateKey(subjects.GateEndpointManager, env.iid))
			before := env.gates.Revision()
			mintedBefore, _ := env.recorded(t)
			extra := []any{"registrationProof", proof, "accountPublicKey", env.e.Account, "processEpoch", 0}
			switch op {
			case OpPrepare:
				extra = nil
			case OpActivate:
				extra = extra[:2]
			}
			_, err := env.serve(t, env.request(t, op, extra...))
			if fault.CodeOf(err) != fault.FailedPrecondition {
				t.Fatalf("got %v, want failed-precondition", err)
			}
			minted, decisions := env.recorded(t)
			if minted != mintedBefore || env.gates.Revision() != before || len(decisions) != 0 {
				t.Fatalf("a refusal before signing wrote minted records (%d→%d), moved the gates (%d→%d) or recorded %v",
					mintedBefore, minted, before, env.gates.Revision(), decisions)
			}
		})
	}
}

func TestPrepareRetriesAFirstCreateOfUnknownOutcome(t *testing.T) {
	env := newEngineEnv(t)
	env.gates.Fault = testkit.FailOnce(false)
	m, err := env.serve(t, env.request(t, OpPrepare))
	if err != nil || len(m.Credentials) != 2 || m.ProcessEpoch != 0 {
		t.Fatalf("got %v, %v; want the prepare to land at epoch 0", m, err)
	}
}

// newInstance points env at a fresh instance with fresh keys, for tests that register several.
func (env *engineEnv) newInstance(t *testing.T) {
	env.iid, env.ids = subjects.NewUID(), identities(t)
}

func TestAnOwnerAtItsQuotaCannotRegisterAnotherInstance(t *testing.T) {
	env := newEngineEnv(t) // quota 3
	var iids []string
	for range 3 {
		env.newInstance(t)
		if _, err := env.serve(t, env.request(t, OpPrepare)); err != nil {
			t.Fatal(err)
		}
		iids = append(iids, env.iid)
	}
	mintedBefore, _ := env.recorded(t)
	before := env.gates.Revision()
	env.newInstance(t)
	_, err := env.serve(t, env.request(t, OpPrepare))
	if fault.CodeOf(err) != fault.ResourceExhausted || !strings.Contains(err.Error(), "--max-instances-per-owner") {
		t.Fatalf("a fourth instance: got %v, want resource-exhausted naming the quota", err)
	}
	if minted, _ := env.recorded(t); minted != mintedBefore || env.gates.Revision() != before {
		t.Fatal("a refusal at the quota minted or wrote")
	}
	// Re-registering one of its instances is not a new one.
	env.iid = iids[0]
	if _, err := env.serve(t, env.request(t, OpPrepare)); err != nil {
		t.Fatalf("re-registering an instance at the quota: %v", err)
	}
	// A retired instance frees its slot.
	g, err := issue.GateOf(env.gates, subjects.GateEndpointManager, iids[1]).Observe(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	retired := g.Row
	retired.State, retired.Op = issue.GateRetired, &issue.GateOp{OpID: "end", Kind: issue.OpRetirement}
	if _, err := g.Write(ctx(t), retired); err != nil {
		t.Fatal(err)
	}
	env.newInstance(t)
	if _, err := env.serve(t, env.request(t, OpPrepare)); err != nil {
		t.Fatalf("after retiring one: got %v, want the new instance registered", err)
	}
}

func TestTheQuotaHoldsInTheCommitWhenTwoRegistrationsRace(t *testing.T) {
	env := newEngineEnv(t) // quota 3
	for range 2 {
		env.newInstance(t)
		if _, err := env.serve(t, env.request(t, OpPrepare)); err != nil {
			t.Fatal(err)
		}
	}
	// The first of two new instances is paused before its commit while the second takes the
	// last slot: both passed the check before signing; only one may commit.
	env.newInstance(t)
	first := env.request(t, OpPrepare)
	firstIID := env.iid
	env.newInstance(t)
	second := env.request(t, OpPrepare)
	var secondErr error
	env.e.Pipeline.BeforeCommit = func() {
		env.e.Pipeline.BeforeCommit = nil
		_, secondErr = env.serve(t, second)
	}
	_, err := env.serve(t, first)
	if secondErr != nil {
		t.Fatalf("the second registration: %v", secondErr)
	}
	if fault.CodeOf(err) != fault.ResourceExhausted {
		t.Fatalf("the paused registration: got %v, want resource-exhausted at its commit", err)
	}
	if g, err := issue.GateOf(env.gates, subjects.GateEndpointManager, firstIID).Observe(ctx(t)); err != nil || !g.Absent() {
		t.Fatalf("the refused instance's gate: got %+v, %v; want none", g, err)
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	t.Cleanup(cancel)
	return c
}

// TestAnOwnersInstancesRowAtTheFlagsMaximumFitsAndHoldsTheQuota: at --max-instances-per-owner's
// largest value, an owner's `instances` row with every slot taken and the most registrations
// pending decodes, fits in one 1 MiB broker message, and refuses one more instance.
func TestAnOwnersInstancesRowAtTheFlagsMaximumFitsAndHoldsTheQuota(t *testing.T) {
	env := newEngineEnv(t)
	env.e.MaxInstancesPerOwner = MaxInstancesPerOwner
	row := instances{V: 1, Owner: testOwner, IDs: []string{}, Pending: []pending{}}
	lapsed := time.Now().Add(-time.Hour).UnixMilli() // their registrations committed long ago
	for i := range MaxInstancesPerOwner {
		iid := subjects.NewUID()
		row.IDs = append(row.IDs, iid)
		if i < MaxPending {
			row.Pending = append(row.Pending, pending{InstanceID: iid, Token: subjects.NewNonce(), Until: lapsed})
		}
		g, err := issue.GateOf(env.gates, subjects.GateEndpointManager, iid).Observe(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		open := issue.GateRow{State: issue.GateOpen, Generation: 1, RegistrationRevision: 1, Principal: subjects.Principal(testOwner, subjects.ServeActor(iid))}
		if _, err := g.Write(ctx(t), open); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(row.IDs)
	data, err := json.Marshal(row)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) > maxInstancesRow || len(data) > 1<<20 {
		t.Fatalf("the row at the maximum is %d bytes: over its bound %d or a 1 MiB message", len(data), maxInstancesRow)
	}
	env.gates.Put(subjects.InstancesKey(testOwner), data)
	if _, err := instancesOf(env.gates, testOwner).Observe(ctx(t)); err != nil {
		t.Fatalf("the row at the maximum does not decode: %v", err)
	}
	env.newInstance(t)
	// The refusal reads every instance's gate: give it the plane's default --request-timeout
	// (5 s), widened on a loaded machine, where the race detector's reads of 10,000 gates
	// outlasted 2 s.
	within := testkit.Stretched(5 * time.Second)
	if _, err := env.serveWithin(t, within, env.request(t, OpPrepare)); fault.CodeOf(err) != fault.ResourceExhausted || !strings.Contains(err.Error(), "--max-instances-per-owner") {
		t.Fatalf("one more instance past the maximum: got %v, want resource-exhausted naming the quota", err)
	}
}

// opened records the owners whose witness was opened, and how many records had been written
// when it was.
type opened struct {
	witnessAll
	env    *engineEnv
	owners []string
	before []int
}

func (o *opened) OpenWitness(_ context.Context, owner string) {
	o.owners = append(o.owners, owner)
	o.before = append(o.before, len(o.env.records.Msgs()))
}

// Every mint of a serve duty (activate, renewStandingBundle) opens its owner's witness before
// it signs: no manager can receive a run-start its owner's witness does not capture. The
// other mints leave it alone.
func TestEveryServeMintOpensItsOwnersWitnessFirst(t *testing.T) {
	env := newEngineEnv(t)
	w := &opened{env: env}
	env.e.Witness = w
	prep, err := env.serve(t, env.request(t, OpPrepare))
	if err != nil {
		t.Fatal(err)
	}
	if len(w.owners) != 0 {
		t.Fatalf("prepare opened the witness (%v), want only the mints of a serve duty to", w.owners)
	}
	minted, _ := env.recorded(t)
	act, err := env.serve(t, env.request(t, OpActivate, "registrationProof", prep.RegistrationProof))
	if err != nil {
		t.Fatal(err)
	}
	current := []any{"registrationProof", act.NextRegistrationProof, "accountPublicKey", env.e.Account, "processEpoch", 0}
	if _, err := env.serve(t, env.request(t, OpRenew, current...)); err != nil {
		t.Fatal(err)
	}
	if _, err := env.serve(t, env.request(t, OpRenewStandingBundle, current...)); err != nil {
		t.Fatal(err)
	}
	if len(w.owners) != 2 || w.owners[0] != testOwner || w.owners[1] != testOwner {
		t.Fatalf("got the witness opened for %v, want the manager's owner %s once by activate and once by renewStandingBundle", w.owners, testOwner)
	}
	if w.before[0] != minted {
		t.Errorf("activate opened the witness after %d records, want before its own (%d before it)", w.before[0], minted)
	}
}
