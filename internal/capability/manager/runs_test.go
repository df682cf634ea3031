package manager

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/internal/core/audit"
	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/subjects"
)

// runBody is a run request of kind with the env's current proof, plus the run's own key.
func (env *engineEnv) runBody(t *testing.T, kind, proof string, key string, value any) []byte {
	t.Helper()
	b := map[string]any{
		"v": 1, "kind": kind, "space": "default", "actor": "cli",
		"instanceId": env.iid, "managerLifecycleUid": strings.Repeat("l", 26),
		"requestId": strings.Repeat("r", 22), "identities": env.ids,
		"registrationProof": proof, "accountPublicKey": env.e.Account, "processEpoch": 0,
		key: value,
	}
	data, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// cli is the caller every test of this file sends as.
var cli = Caller{Owner: testOwner, Actor: "cli"}

// admittedRun admits a run started by testOwner.starter and returns its id.
func (env *engineEnv) admittedRun(t *testing.T, proof string) string {
	t.Helper()
	runID := client.NewRunID()
	subject := subjects.RunStart{Space: "default", Route: subjects.RouteOne, Owner: testOwner, Actor: "starter",
		UID: strings.Repeat("u", 26), Generation: "1", Nonce: runID[4:20]}.Subject()
	if _, _, err := env.e.Admit(ctx(t), cli, audit.Request{}, env.runBody(t, client.KindRunAdmission, proof, "run", client.RunStart{RunID: runID, Subject: subject})); err != nil {
		t.Fatal(err)
	}
	return runID
}

// newAttempt is an attempt of run at epoch and token with fresh keys.
func newAttempt(t *testing.T, runID string, n uint64) client.Attempt {
	return client.Attempt{RunID: runID, TakeoverID: strings.Repeat("a", 15) + string(rune('0'+n)), Epoch: n, FencingToken: n,
		DriverID: newKey(t, nkeys.CreateUser), MediatorID: newKey(t, nkeys.CreateUser)}
}

// A run mint paused between signing and committing while the run is revoked is refused
// permission-denied "revoked", and the run fence stays revoked: an attempt, and a renewal.
func TestARunMintPausedAcrossARevocationIsRefused(t *testing.T) {
	for _, op := range []string{"attempt", "renewRunDriver"} {
		t.Run(op, func(t *testing.T) {
			env := newEngineEnv(t)
			proof := env.registered(t)
			runID := env.admittedRun(t, proof)
			a := newAttempt(t, runID, 1)
			var request []byte
			if op == "attempt" {
				request = env.runBody(t, client.KindRunAttempt, proof, "attempt", a)
			} else {
				rm, _, err := env.e.Attempt(ctx(t), cli, audit.Request{}, env.runBody(t, client.KindRunAttempt, proof, "attempt", a))
				if err != nil {
					t.Fatal(err)
				}
				status, err := json.Marshal(client.RunStatus{V: 1, Kind: client.KindRunStatus, Space: "default", RunID: runID,
					State: client.RunRunning, Holder: rm.Hold.Holder, Epoch: 1, FencingToken: 1})
				if err != nil {
					t.Fatal(err)
				}
				if _, _, err := env.e.ReportStatus(ctx(t), Caller{Owner: testOwner, Actor: subjects.RunActor(runID)}, audit.Request{}, status); err != nil {
					t.Fatal(err)
				}
				hold := rm.Hold
				request = env.request(t, OpRenewRunDriver, "registrationProof", proof, "accountPublicKey", env.e.Account, "processEpoch", 0, "run", hold)
			}
			revoke := env.runBody(t, client.KindRunRevoke, proof, "revoke", client.Revoke{RunID: runID, Reason: "stop"})
			env.e.Pipeline.BeforeCommit = func() {
				env.e.Pipeline.BeforeCommit = nil
				if _, _, err := env.e.RevokeRun(ctx(t), cli, audit.Request{}, revoke); err != nil {
					t.Errorf("revoke: %v", err)
				}
			}
			var err error
			if op == "attempt" {
				_, _, err = env.e.Attempt(ctx(t), cli, audit.Request{}, request)
			} else {
				_, _, err = env.e.ServiceAuthority(ctx(t), cli, audit.Request{}, request)
			}
			if fault.CodeOf(err) != fault.PermissionDenied || !strings.Contains(err.Error(), "revoked") {
				t.Fatalf("got %v, want permission-denied: revoked", err)
			}
			rf, err := env.e.runFenceOf(runID).Observe(ctx(t))
			if err != nil || !rf.Row.Revoked {
				t.Fatalf("the run fence: got %+v, %v; want it revoked", rf, err)
			}
		})
	}
}
