package manager

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/internal/fault"
	"github.com/cotal-ai/authplane/internal/ledger"
	"github.com/cotal-ai/authplane/internal/mint"
	"github.com/cotal-ai/authplane/internal/records"
	"github.com/cotal-ai/authplane/internal/store"
	"github.com/cotal-ai/authplane/internal/store/storetest"
	"github.com/cotal-ai/authplane/subjects"
)

// fakeRecorder keeps what the engine records, and can refuse the minted records.
type fakeRecorder struct {
	mu        sync.Mutex
	mintedErr error
	minted    int
	decisions []records.Decision
}

func (f *fakeRecorder) RecordMinted(_ context.Context, _ records.Request, creds []records.Credential) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.mintedErr != nil {
		return f.mintedErr
	}
	f.minted += len(creds)
	return nil
}

func (f *fakeRecorder) LogMinted(records.Request, []records.Credential) {}

func (f *fakeRecorder) Record(_ context.Context, d records.Decision) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.decisions = append(f.decisions, d)
}

const testOwner = "u_aaaaaaaaaaaaaaaaaaaaaaaaaa"

type engineEnv struct {
	e     *Engine
	gates *storetest.KV
	rec   *fakeRecorder
	ids   Identities
	iid   string
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
	iss, err := mint.NewIssuer(acctPub, signer, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ProofKey(signer)
	if err != nil {
		t.Fatal(err)
	}
	actors := storetest.New()
	row, err := json.Marshal(ledger.Row{V: 1, Owner: testOwner, Actor: "cli", Scope: []string{ledger.Supervise}})
	if err != nil {
		t.Fatal(err)
	}
	actors.Put(subjects.ActorKey(testOwner, "cli"), row)
	env := &engineEnv{gates: storetest.New(), rec: &fakeRecorder{}, ids: identities(t), iid: strings.Repeat("i", 26)}
	env.e = &Engine{Space: "default", Account: acctPub, Gates: env.gates, Ledger: actors, Issuer: iss,
		ProofKey: key, Records: env.rec, StandingTTL: 24 * time.Hour, Now: time.Now}
	return env
}

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

func (env *engineEnv) serve(t *testing.T, data []byte) (*Material, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return env.e.ServiceAuthority(ctx, Caller{Owner: testOwner, Actor: "cli"}, data, &records.Request{})
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
func (env *engineEnv) wantDiscarded(t *testing.T, m *Material, err error, code fault.Code, before uint64, creds int) {
	t.Helper()
	if m != nil || fault.CodeOf(err) != code {
		t.Fatalf("got %v, %v; want no material and %s", m, err, code)
	}
	if !fault.As(err).Recorded {
		t.Error("the refusal is not marked recorded; the handler would record it again as refused")
	}
	if after := env.gates.Revision(); after != before {
		t.Errorf("the gates moved from revision %d to %d; nothing may commit", before, after)
	}
	if len(env.rec.decisions) != 1 || env.rec.decisions[0].Decision != records.Discarded ||
		env.rec.decisions[0].Code != string(code) || len(env.rec.decisions[0].Credentials) != creds {
		t.Fatalf("got decisions %+v, want one discarded %s with %d credentials", env.rec.decisions, code, creds)
	}
}

func TestAMintWhoseMintedRecordCannotBeWrittenIsNeverCommitted(t *testing.T) {
	for _, c := range []struct {
		cause error
		code  fault.Code
	}{
		{fmt.Errorf("timeout: %w", store.ErrUnknownOutcome), fault.Unavailable},
		{fmt.Errorf("maximum bytes exceeded: %w", store.ErrFull), fault.ResourceExhausted},
	} {
		t.Run(string(c.code), func(t *testing.T) {
			t.Run("prepare", func(t *testing.T) {
				env := newEngineEnv(t)
				env.rec.mintedErr = c.cause
				m, err := env.serve(t, env.request(t, OpPrepare))
				env.wantDiscarded(t, m, err, c.code, 0, 2)
			})
			t.Run("renewStandingBundle", func(t *testing.T) {
				env := newEngineEnv(t)
				proof := env.registered(t)
				before := env.gates.Revision()
				env.rec.mintedErr = c.cause
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
	env.e.Fenced = func() bool { return true }
	m, err := env.serve(t, env.request(t, OpRenew, "registrationProof", proof, "accountPublicKey", env.e.Account, "processEpoch", 0))
	env.wantDiscarded(t, m, err, fault.Unavailable, before, 2)
}

func TestAGateWithADeleteMarkerSignsNothing(t *testing.T) {
	for _, op := range []string{OpPrepare, OpActivate, OpRenew} {
		t.Run(op, func(t *testing.T) {
			env := newEngineEnv(t)
			proof := env.registered(t)
			env.gates.Delete(subjects.GateKey(subjects.GateEndpointManager, env.iid))
			before, mintedBefore := env.gates.Revision(), env.rec.minted
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
			if env.rec.minted != mintedBefore || env.gates.Revision() != before || len(env.rec.decisions) != 0 {
				t.Fatalf("a refusal before signing wrote minted records (%d→%d), moved the gates (%d→%d) or recorded %v",
					mintedBefore, env.rec.minted, before, env.gates.Revision(), env.rec.decisions)
			}
		})
	}
}

func TestPrepareRetriesAFirstCreateOfUnknownOutcome(t *testing.T) {
	env := newEngineEnv(t)
	env.gates.Fault = storetest.FailOnce(false)
	m, err := env.serve(t, env.request(t, OpPrepare))
	if err != nil || len(m.Credentials) != 2 || m.ProcessEpoch != 0 {
		t.Fatalf("got %v, %v; want the prepare to land at epoch 0", m, err)
	}
}
