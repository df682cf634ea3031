package manager

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/issue"
)

func userKey(t testing.TB) string { return newKey(t, nkeys.CreateUser) }

func accountKey(t testing.TB) string { return newKey(t, nkeys.CreateAccount) }

func newKey(t testing.TB, create func() (nkeys.KeyPair, error)) string {
	t.Helper()
	kp, err := create()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

func identities(t testing.TB) client.Identities {
	return client.Identities{
		Supervisor: client.Identity{ID: userKey(t)}, Executor: client.Identity{ID: userKey(t)}, Serve: client.Identity{ID: userKey(t)},
		GoalWriter: client.Identity{ID: userKey(t)}, SessionLedger: client.Identity{ID: userKey(t)},
	}
}

func TestIdentitiesDigestDependsOnWhichKeyHoldsWhichDuty(t *testing.T) {
	ids := identities(t)
	swapped := ids
	swapped.Serve, swapped.GoalWriter = ids.GoalWriter, ids.Serve
	if IdentitiesDigest(ids) == IdentitiesDigest(swapped) {
		t.Fatal("swapping two duties' keys kept the digest; a proof would then mint serve rights for the goal writer's key")
	}
	again := ids
	if IdentitiesDigest(ids) != IdentitiesDigest(again) {
		t.Fatal("the digest is not deterministic")
	}
}

func TestProofsBindEveryFieldAndTheirLabel(t *testing.T) {
	key := []byte(strings.Repeat("k", 32))
	row := issue.GateRow{ProcessEpoch: 3, RegistrationRevision: 4, Registration: &issue.Registration{LifecycleUID: "l", IdentitiesDigest: "d"}}
	base := proof(key, labelCurrent, "s", "o", "i", row)
	variants := map[string]string{
		"label":    proof(key, labelRegistration, "s", "o", "i", row),
		"space":    proof(key, labelCurrent, "t", "o", "i", row),
		"owner":    proof(key, labelCurrent, "s", "p", "i", row),
		"instance": proof(key, labelCurrent, "s", "o", "j", row),
		"key":      proof([]byte(strings.Repeat("x", 32)), labelCurrent, "s", "o", "i", row),
	}
	for _, mutate := range []struct {
		name string
		f    func(r *issue.GateRow)
	}{
		{"epoch", func(r *issue.GateRow) { r.ProcessEpoch++ }},
		{"revision", func(r *issue.GateRow) { r.RegistrationRevision++ }},
		{"lifecycle", func(r *issue.GateRow) { r.Registration = &issue.Registration{LifecycleUID: "m", IdentitiesDigest: "d"} }},
		{"identities", func(r *issue.GateRow) { r.Registration = &issue.Registration{LifecycleUID: "l", IdentitiesDigest: "e"} }},
	} {
		r := row
		mutate.f(&r)
		variants[mutate.name] = proof(key, labelCurrent, "s", "o", "i", r)
	}
	for name, p := range variants {
		if proofEqual(p, base) {
			t.Errorf("changing the %s kept the proof", name)
		}
	}
	if !proofEqual(base, proof(key, labelCurrent, "s", "o", "i", row)) {
		t.Fatal("the proof is not deterministic")
	}
	// The preparer is not bound: the instance's own duties renew with the same proof.
	r := row
	r.Registration = &issue.Registration{LifecycleUID: "l", IdentitiesDigest: "d", PreparedBy: "someone.else"}
	if !proofEqual(base, proof(key, labelCurrent, "s", "o", "i", r)) {
		t.Fatal("the proof names a caller; the instance's own duties could not renew")
	}
}

func TestParseKeysPerOperation(t *testing.T) {
	ids := identities(t)
	base := func(op string) map[string]any {
		return map[string]any{
			"v": 1, "kind": Kind, "operation": op, "space": "default", "actor": "cli",
			"instanceId": strings.Repeat("a", 26), "managerLifecycleUid": strings.Repeat("b", 26),
			"requestId": strings.Repeat("r", 22), "identities": ids,
		}
	}
	proofValue := "sha256:" + strings.Repeat("0", 64)
	cases := []struct {
		name string
		body map[string]any
		code fault.Code
	}{
		{"prepare", base(OpPrepare), ""},
		{"activate", with(base(OpActivate), "registrationProof", proofValue), ""},
		{"renew", with(base(OpRenew), "registrationProof", proofValue, "accountPublicKey", accountKey(t), "processEpoch", 0), ""},
		{"activate with an epoch", with(base(OpActivate), "registrationProof", proofValue, "processEpoch", 0), fault.BadRequest},
		{"activate with an account", with(base(OpActivate), "registrationProof", proofValue, "accountPublicKey", accountKey(t)), fault.BadRequest},
		{"renew without an account", with(base(OpRenew), "registrationProof", proofValue, "processEpoch", 0), fault.BadRequest},
		{"renew with a user key as account", with(base(OpRenew), "registrationProof", proofValue, "accountPublicKey", userKey(t), "processEpoch", 0), fault.BadRequest},
		{"prepare with run", with(base(OpPrepare), "run", map[string]any{}), fault.BadRequest},
		{"retire", with(base("retire"), "registrationProof", proofValue), fault.Unimplemented},
		{"transferReader key", with(base(OpPrepare), "transferReader", map[string]any{}), fault.Unimplemented},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			data, err := json.Marshal(c.body)
			if err != nil {
				t.Fatal(err)
			}
			_, err = Parse(data)
			if got := codeOf(err); got != c.code {
				t.Fatalf("got %q (%v), want %q", got, err, c.code)
			}
		})
	}
}

func codeOf(err error) fault.Code {
	if err == nil {
		return ""
	}
	return fault.CodeOf(err)
}

func with(b map[string]any, kv ...any) map[string]any {
	for i := 0; i < len(kv); i += 2 {
		b[kv[i].(string)] = kv[i+1]
	}
	return b
}
