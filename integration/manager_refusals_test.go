package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/subjects"
)

// refusalEnv is one plane shared by the refusal cases; each case gets its own caller and its
// own manager instance.
type refusalEnv struct {
	t       *testing.T
	p       *testPlane
	account string
}

// refusalCase is one condition the plane must refuse.
type refusalCase struct {
	name string
	// scope is the caller's ledger row; nil means the caller has none.
	scope []string
	// owner is the caller's owner (default ownerA, who prepares the instance).
	owner string
	// state is the instance's state before the request: "" (never prepared), "prepared",
	// "activated", "frozen", "retired" or "deleted".
	state string
	// actor, when set, is the caller's actor (default: a fresh one per case).
	actor func(c *refusalCtx) string
	// build returns the body to send: a map (marshalled), or a string/[]byte sent as is.
	build func(c *refusalCtx) any
	code  string
}

// refusalCtx is what a case's body is built from.
type refusalCtx struct {
	t       *testing.T
	m       *managerKeys
	actor   string
	account string
	prep    material
	act     material
}

func (c *refusalCtx) body(op string) map[string]any { return c.m.body(c.t, op, c.actor) }

func (c *refusalCtx) renewal(op string) map[string]any {
	return renewal(c.body(op), c.act.NextRegistrationProof, c.account, c.act.ProcessEpoch)
}

func (c *refusalCtx) activate() map[string]any {
	b := c.body("activate")
	b["registrationProof"] = c.prep.RegistrationProof
	return b
}

func with(b map[string]any, kv ...any) map[string]any {
	for i := 0; i < len(kv); i += 2 {
		b[kv[i].(string)] = kv[i+1]
	}
	return b
}

func without(b map[string]any, keys ...string) map[string]any {
	for _, k := range keys {
		delete(b, k)
	}
	return b
}

func marshal(t testing.TB, v any) string {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

var supervise = []string{"supervise"}

func refusalCases() []refusalCase {
	sha := "sha256:" + strings.Repeat("ab", 32)
	return []refusalCase{
		// The closed body: every refusal is bad-request naming the field.
		{name: "not JSON", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return "{not json" }, code: "bad-request"},
		{name: "body over 64 KiB", scope: supervise, state: "activated", build: func(c *refusalCtx) any {
			return marshal(c.t, with(c.renewal("renew"), "pad", strings.Repeat("x", 64<<10)))
		}, code: "bad-request"},
		{name: "top-level array", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return "[" + marshal(c.t, c.renewal("renew")) + "]" }, code: "bad-request"},
		{name: "unknown key", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return with(c.renewal("renew"), "owner", ownerB) }, code: "bad-request"},
		{name: "unknown nested key", scope: supervise, state: "activated", build: func(c *refusalCtx) any {
			b := c.renewal("renew")
			b["identities"].(map[string]any)["serve"].(map[string]any)["scope"] = "admin"
			return b
		}, code: "bad-request"},
		{name: "key differing only in case", scope: supervise, state: "activated", build: func(c *refusalCtx) any {
			return with(without(c.renewal("renew"), "v"), "V", 1)
		}, code: "bad-request"},
		{name: "duplicate key", scope: supervise, state: "activated", build: func(c *refusalCtx) any {
			return `{"processEpoch":7,` + marshal(c.t, c.renewal("renew"))[1:]
		}, code: "bad-request"},
		{name: "null value", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return with(c.renewal("renew"), "registrationProof", nil) }, code: "bad-request"},
		{name: "wrong type", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return with(c.renewal("renew"), "v", "1") }, code: "bad-request"},
		{name: "version 2", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return with(c.renewal("renew"), "v", 2) }, code: "bad-request"},
		{name: "missing kind", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return without(c.renewal("renew"), "kind") }, code: "bad-request"},
		{name: "not a manager-authority kind", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return with(c.renewal("renew"), "kind", "manager-run-revoke") }, code: "bad-request"},
		{name: "unknown operation", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return with(c.renewal("renew"), "operation", "destroy") }, code: "bad-request"},
		{name: "space off grammar", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return with(c.renewal("renew"), "space", "Bad Space") }, code: "bad-request"},
		{name: "actor is not the subject's", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return with(c.renewal("renew"), "actor", "someoneelse") }, code: "bad-request"},
		{name: "instanceId off grammar", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return with(c.renewal("renew"), "instanceId", "short") }, code: "bad-request"},
		{name: "managerLifecycleUid off grammar", scope: supervise, state: "activated", build: func(c *refusalCtx) any {
			return with(c.renewal("renew"), "managerLifecycleUid", strings.ToUpper(c.m.uid))
		}, code: "bad-request"},
		{name: "requestId off grammar", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return with(c.renewal("renew"), "requestId", "tooshort") }, code: "bad-request"},
		{name: "identity is an account key", scope: supervise, state: "activated", build: func(c *refusalCtx) any {
			b := c.renewal("renew")
			b["identities"].(map[string]any)["executor"] = map[string]any{"id": newAccountKey(c.t)}
			return b
		}, code: "bad-request"},
		{name: "identity missing", scope: supervise, state: "activated", build: func(c *refusalCtx) any {
			b := c.renewal("renew")
			delete(b["identities"].(map[string]any), "goalWriter")
			return b
		}, code: "bad-request"},
		{name: "one nkey for two duties", scope: supervise, state: "activated", build: func(c *refusalCtx) any {
			b := c.renewal("renew")
			ids := b["identities"].(map[string]any)
			ids["serve"] = ids["supervisor"]
			return b
		}, code: "bad-request"},
		{name: "prepare carries a proof", scope: supervise, state: "prepared", build: func(c *refusalCtx) any { return with(c.body("prepare"), "registrationProof", sha) }, code: "bad-request"},
		{name: "activate without a proof", scope: supervise, state: "prepared", build: func(c *refusalCtx) any { return c.body("activate") }, code: "bad-request"},
		{name: "renew without processEpoch", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return without(c.renewal("renew"), "processEpoch") }, code: "bad-request"},
		{name: "proof off grammar", scope: supervise, state: "activated", build: func(c *refusalCtx) any {
			return with(c.renewal("renew"), "registrationProof", "sha256:XYZ")
		}, code: "bad-request"},
		{name: "negative processEpoch", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return with(c.renewal("renew"), "processEpoch", -1) }, code: "bad-request"},

		// Who may ask.
		{name: "no ledger row", state: "", build: func(c *refusalCtx) any { return c.body("prepare") }, code: "permission-denied"},
		{name: "admin does not imply supervise", scope: []string{"admin"}, build: func(c *refusalCtx) any { return c.body("prepare") }, code: "permission-denied"},
		{name: "platform-admin does not imply supervise", scope: []string{"platform-admin"}, build: func(c *refusalCtx) any { return c.body("prepare") }, code: "permission-denied"},
		{name: "another owner's instance", scope: supervise, owner: ownerB, state: "activated", build: func(c *refusalCtx) any { return c.body("prepare") }, code: "permission-denied"},
		{name: "another owner renews", scope: supervise, owner: ownerB, state: "activated", build: func(c *refusalCtx) any { return c.renewal("renew") }, code: "permission-denied"},
		{name: "another instance's supervisor", state: "activated", actor: func(c *refusalCtx) string { return subjects.SupervisorActor(newManagerKeys(c.t).iid) },
			build: func(c *refusalCtx) any { return c.renewal("renew") }, code: "permission-denied"},
		{name: "another space", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return with(c.renewal("renew"), "space", "other") }, code: "permission-denied"},
		{name: "another account", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return with(c.renewal("renew"), "accountPublicKey", newAccountKey(c.t)) }, code: "permission-denied"},
		{name: "activate with a wrong proof", scope: supervise, state: "prepared", build: func(c *refusalCtx) any { return with(c.activate(), "registrationProof", sha) }, code: "permission-denied"},
		{name: "activate with other identities", scope: supervise, state: "prepared", build: func(c *refusalCtx) any {
			b := c.activate()
			b["identities"].(map[string]any)["serve"] = map[string]any{"id": newUserKey(c.t)}
			return b
		}, code: "permission-denied"},
		{name: "activate another lifecycle", scope: supervise, state: "prepared", build: func(c *refusalCtx) any {
			return with(c.activate(), "managerLifecycleUid", newManagerKeys(c.t).uid)
		}, code: "permission-denied"},
		{name: "renew with the registration proof", scope: supervise, state: "activated", build: func(c *refusalCtx) any {
			return with(c.renewal("renew"), "registrationProof", c.prep.RegistrationProof)
		}, code: "permission-denied"},
		{name: "renew other identities with a valid proof", scope: supervise, state: "activated", build: func(c *refusalCtx) any {
			b := c.renewal("renewStandingBundle")
			b["identities"].(map[string]any)["goalWriter"] = map[string]any{"id": newUserKey(c.t)}
			return b
		}, code: "permission-denied"},

		// The gate.
		{name: "activate an unregistered instance", scope: supervise, build: func(c *refusalCtx) any { return with(c.body("activate"), "registrationProof", sha) }, code: "failed-precondition"},
		{name: "renew on a frozen gate", scope: supervise, state: "frozen", build: func(c *refusalCtx) any { return c.renewal("renew") }, code: "failed-precondition"},
		{name: "prepare on a retired gate", scope: supervise, state: "retired", build: func(c *refusalCtx) any { return c.body("prepare") }, code: "failed-precondition"},
		{name: "activate on a delete marker", scope: supervise, state: "deleted", build: func(c *refusalCtx) any { return c.activate() }, code: "failed-precondition"},
		{name: "prepare on a delete marker", scope: supervise, state: "deleted", build: func(c *refusalCtx) any { return c.body("prepare") }, code: "failed-precondition"},
		{name: "renew on a delete marker", scope: supervise, state: "deleted", build: func(c *refusalCtx) any { return c.renewal("renewStandingBundle") }, code: "failed-precondition"},
		{name: "stale epoch", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return with(c.renewal("renew"), "processEpoch", 5) }, code: "conflict"},

		// Out of scope.
		{name: "renewRunDriver without a hold", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return with(c.renewal("renewRunDriver"), "run", map[string]any{}) }, code: "bad-request"},
		{name: "contractArtifacts", scope: supervise, state: "prepared", build: func(c *refusalCtx) any { return with(c.activate(), "contractArtifacts", []any{}) }, code: "unimplemented"},
		{name: "session operation", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return with(c.renewal("renew"), "operation", "session") }, code: "unimplemented"},
		{name: "a renewal sent as a run attempt", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return with(c.renewal("renew"), "kind", "manager-run-attempt") }, code: "bad-request"},
	}
}

// TestManagerAuthorityRefusesAndWritesNothing: every refusal has its code, carries no
// credential, leaves every fence and every minted record as it was, and is recorded `refused`.
func TestManagerAuthorityRefusesAndWritesNothing(t *testing.T) {
	p := startPlane(t, nil)
	env := &refusalEnv{t: t, p: p, account: p.Keys().Data.Public()}
	grant(t, p, ownerA, "prepper", "supervise")
	prepper := callerConn(t, p, ownerA, "prepper")

	cases := refusalCases()
	if len(cases) < 30 {
		t.Fatalf("got %d refusal conditions, want at least 30", len(cases))
	}
	for i, rc := range cases {
		t.Run(rc.name, func(t *testing.T) {
			c := &refusalCtx{t: t, m: newManagerKeys(t), account: env.account, actor: fmt.Sprintf("c%d", i)}
			switch rc.state {
			case "prepared":
				c.prep = mustMint(t, prepper, ownerA, "prepper", c.m.body(t, "prepare", "prepper"))
			case "activated", "frozen", "retired", "deleted":
				c.prep, c.act = registered(t, prepper, ownerA, "prepper", c.m)
			}
			if rc.state == "frozen" || rc.state == "retired" || rc.state == "deleted" {
				setGate(t, p, c.m.iid, rc.state)
			}
			owner := ownerA
			if rc.owner != "" {
				owner = rc.owner
			}
			if rc.actor != nil {
				c.actor = rc.actor(c)
			}
			if rc.scope != nil {
				grant(t, p, owner, c.actor, rc.scope...)
			}
			nc := callerConn(t, p, owner, c.actor)
			body := rc.build(c)

			authBefore, mintedBefore := lastSeq(t, p, subjects.AuthBucket(testSpace)), lastSeq(t, p, subjects.MintedStream(testSpace))
			o := ask(t, nc, owner, c.actor, subjects.EndpointManagerAuthority, body)
			if o.code != rc.code {
				t.Fatalf("got %q (%d) %q, want %q", o.code, o.numeric, o.message, rc.code)
			}
			if len(o.material.Credentials) != 0 || strings.Contains(string(o.msg.Data), `"jwt"`) {
				t.Fatalf("a refusal carried credentials: %s", o.msg.Data)
			}
			if got := o.msg.Header.Get("Nats-Service-Error"); !strings.HasPrefix(got, rc.code+": ") {
				t.Errorf("got Nats-Service-Error %q, want it to start %q", got, rc.code+": ")
			}
			if after := lastSeq(t, p, subjects.AuthBucket(testSpace)); after != authBefore {
				t.Errorf("the fence bucket moved from %d to %d; a refusal must change no fence", authBefore, after)
			}
			if after := lastSeq(t, p, subjects.MintedStream(testSpace)); after != mintedBefore {
				t.Errorf("the minted stream moved from %d to %d; a refusal before signing mints nothing", mintedBefore, after)
			}
			d := lastDecision(t, p, "refused", owner, c.actor)
			if d.Code != rc.code || d.Endpoint != subjects.EndpointManagerAuthority || d.Caller != subjects.Principal(owner, c.actor) {
				t.Errorf("got refused record %+v, want code %s from %s", d, rc.code, subjects.Principal(owner, c.actor))
			}
		})
	}
}

// setGate rewrites the manager gate of iid into state ("frozen" or "retired", with a
// retirement op) or leaves a delete marker ("deleted"), as a fence writer or an operator would.
func setGate(t testing.TB, p *testPlane, iid, state string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, js := planeConn(t, p.Keys(), p.NATSURL())
	kv, err := js.KeyValue(ctx, subjects.AuthBucket(testSpace))
	if err != nil {
		t.Fatal(err)
	}
	key := subjects.GateKey("manager", iid)
	e, err := kv.Get(ctx, key)
	if err != nil {
		t.Fatalf("read gate %s: %v", key, err)
	}
	if state == "deleted" {
		if err := kv.Delete(ctx, key); err != nil {
			t.Fatalf("delete gate %s: %v", key, err)
		}
		return
	}
	var row map[string]any
	if err := json.Unmarshal(e.Value(), &row); err != nil {
		t.Fatal(err)
	}
	row["state"] = state
	row["op"] = map[string]any{"opId": strings.Repeat("a", 26), "kind": "retirement"}
	row["nonce"] = newRequestID(t)
	if _, err := kv.Update(ctx, key, []byte(marshal(t, row)), e.Revision()); err != nil {
		t.Fatalf("set gate %s %s: %v", key, state, err)
	}
}
