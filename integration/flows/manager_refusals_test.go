package flows

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// refusalEnv is one plane shared by the refusal cases; each case gets its own caller and its
// own manager instance.
type refusalEnv struct {
	t       *testing.T
	p       *harness.TestPlane
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
	m       *harness.ManagerKeys
	actor   string
	account string
	prep    harness.Material
	act     harness.Material
}

func (c *refusalCtx) body(op string) map[string]any { return c.m.Body(c.t, op, c.actor) }

func (c *refusalCtx) renewal(op string) map[string]any {
	return harness.Renewal(c.body(op), c.act.NextRegistrationProof, c.account, c.act.ProcessEpoch)
}

func (c *refusalCtx) activate() map[string]any {
	b := c.body("activate")
	b["registrationProof"] = c.prep.RegistrationProof
	return b
}

func without(b map[string]any, keys ...string) map[string]any {
	for _, k := range keys {
		delete(b, k)
	}
	return b
}

var supervise = []string{"supervise"}

func refusalCases() []refusalCase {
	sha := "sha256:" + strings.Repeat("ab", 32)
	return []refusalCase{
		// The closed body: every refusal is bad-request naming the field.
		{name: "not JSON", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return "{not json" }, code: "bad-request"},
		{name: "body over 64 KiB", scope: supervise, state: "activated", build: func(c *refusalCtx) any {
			return harness.Marshal(c.t, harness.With(c.renewal("renew"), "pad", strings.Repeat("x", 64<<10)))
		}, code: "bad-request"},
		{name: "top-level array", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return "[" + harness.Marshal(c.t, c.renewal("renew")) + "]" }, code: "bad-request"},
		{name: "unknown key", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return harness.With(c.renewal("renew"), "owner", harness.OwnerB) }, code: "bad-request"},
		{name: "unknown nested key", scope: supervise, state: "activated", build: func(c *refusalCtx) any {
			b := c.renewal("renew")
			b["identities"].(map[string]any)["serve"].(map[string]any)["scope"] = "admin"
			return b
		}, code: "bad-request"},
		{name: "key differing only in case", scope: supervise, state: "activated", build: func(c *refusalCtx) any {
			return harness.With(without(c.renewal("renew"), "v"), "V", 1)
		}, code: "bad-request"},
		{name: "duplicate key", scope: supervise, state: "activated", build: func(c *refusalCtx) any {
			return `{"processEpoch":7,` + harness.Marshal(c.t, c.renewal("renew"))[1:]
		}, code: "bad-request"},
		{name: "null value", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return harness.With(c.renewal("renew"), "registrationProof", nil) }, code: "bad-request"},
		{name: "wrong type", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return harness.With(c.renewal("renew"), "v", "1") }, code: "bad-request"},
		{name: "version 2", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return harness.With(c.renewal("renew"), "v", 2) }, code: "bad-request"},
		{name: "missing kind", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return without(c.renewal("renew"), "kind") }, code: "bad-request"},
		{name: "not a manager-authority kind", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return harness.With(c.renewal("renew"), "kind", "manager-run-revoke") }, code: "bad-request"},
		{name: "unknown operation", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return harness.With(c.renewal("renew"), "operation", "destroy") }, code: "bad-request"},
		{name: "space off grammar", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return harness.With(c.renewal("renew"), "space", "Bad Space") }, code: "bad-request"},
		{name: "actor is not the subject's", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return harness.With(c.renewal("renew"), "actor", "someoneelse") }, code: "bad-request"},
		{name: "instanceId off grammar", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return harness.With(c.renewal("renew"), "instanceId", "short") }, code: "bad-request"},
		{name: "managerLifecycleUid off grammar", scope: supervise, state: "activated", build: func(c *refusalCtx) any {
			return harness.With(c.renewal("renew"), "managerLifecycleUid", strings.ToUpper(c.m.Uid))
		}, code: "bad-request"},
		{name: "requestId off grammar", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return harness.With(c.renewal("renew"), "requestId", "tooshort") }, code: "bad-request"},
		{name: "identity is an account key", scope: supervise, state: "activated", build: func(c *refusalCtx) any {
			b := c.renewal("renew")
			b["identities"].(map[string]any)["executor"] = map[string]any{"id": harness.NewAccountKey(c.t)}
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
		{name: "prepare carries a proof", scope: supervise, state: "prepared", build: func(c *refusalCtx) any { return harness.With(c.body("prepare"), "registrationProof", sha) }, code: "bad-request"},
		{name: "activate without a proof", scope: supervise, state: "prepared", build: func(c *refusalCtx) any { return c.body("activate") }, code: "bad-request"},
		{name: "renew without processEpoch", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return without(c.renewal("renew"), "processEpoch") }, code: "bad-request"},
		{name: "proof off grammar", scope: supervise, state: "activated", build: func(c *refusalCtx) any {
			return harness.With(c.renewal("renew"), "registrationProof", "sha256:XYZ")
		}, code: "bad-request"},
		{name: "negative processEpoch", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return harness.With(c.renewal("renew"), "processEpoch", -1) }, code: "bad-request"},

		// Who may ask.
		{name: "no ledger row", state: "", build: func(c *refusalCtx) any { return c.body("prepare") }, code: "permission-denied"},
		{name: "admin does not imply supervise", scope: []string{"admin"}, build: func(c *refusalCtx) any { return c.body("prepare") }, code: "permission-denied"},
		{name: "platform-admin does not imply supervise", scope: []string{"platform-admin"}, build: func(c *refusalCtx) any { return c.body("prepare") }, code: "permission-denied"},
		{name: "another owner's instance", scope: supervise, owner: harness.OwnerB, state: "activated", build: func(c *refusalCtx) any { return c.body("prepare") }, code: "permission-denied"},
		{name: "another owner renews", scope: supervise, owner: harness.OwnerB, state: "activated", build: func(c *refusalCtx) any { return c.renewal("renew") }, code: "permission-denied"},
		{name: "another instance's supervisor", state: "activated", actor: func(c *refusalCtx) string { return subjects.SupervisorActor(harness.NewManagerKeys(c.t).Iid) },
			build: func(c *refusalCtx) any { return c.renewal("renew") }, code: "permission-denied"},
		{name: "another space", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return harness.With(c.renewal("renew"), "space", "other") }, code: "permission-denied"},
		{name: "another account", scope: supervise, state: "activated", build: func(c *refusalCtx) any {
			return harness.With(c.renewal("renew"), "accountPublicKey", harness.NewAccountKey(c.t))
		}, code: "permission-denied"},
		{name: "activate with a wrong proof", scope: supervise, state: "prepared", build: func(c *refusalCtx) any { return harness.With(c.activate(), "registrationProof", sha) }, code: "permission-denied"},
		{name: "activate with other identities", scope: supervise, state: "prepared", build: func(c *refusalCtx) any {
			b := c.activate()
			b["identities"].(map[string]any)["serve"] = map[string]any{"id": harness.NewUserKey(c.t)}
			return b
		}, code: "permission-denied"},
		{name: "activate another lifecycle", scope: supervise, state: "prepared", build: func(c *refusalCtx) any {
			return harness.With(c.activate(), "managerLifecycleUid", harness.NewManagerKeys(c.t).Uid)
		}, code: "permission-denied"},
		{name: "renew with the registration proof", scope: supervise, state: "activated", build: func(c *refusalCtx) any {
			return harness.With(c.renewal("renew"), "registrationProof", c.prep.RegistrationProof)
		}, code: "permission-denied"},
		{name: "renew other identities with a valid proof", scope: supervise, state: "activated", build: func(c *refusalCtx) any {
			b := c.renewal("renewStandingBundle")
			b["identities"].(map[string]any)["goalWriter"] = map[string]any{"id": harness.NewUserKey(c.t)}
			return b
		}, code: "permission-denied"},

		// The gate.
		{name: "activate an unregistered instance", scope: supervise, build: func(c *refusalCtx) any { return harness.With(c.body("activate"), "registrationProof", sha) }, code: "failed-precondition"},
		{name: "renew on a frozen gate", scope: supervise, state: "frozen", build: func(c *refusalCtx) any { return c.renewal("renew") }, code: "failed-precondition"},
		{name: "prepare on a retired gate", scope: supervise, state: "retired", build: func(c *refusalCtx) any { return c.body("prepare") }, code: "failed-precondition"},
		{name: "activate on a delete marker", scope: supervise, state: "deleted", build: func(c *refusalCtx) any { return c.activate() }, code: "failed-precondition"},
		{name: "prepare on a delete marker", scope: supervise, state: "deleted", build: func(c *refusalCtx) any { return c.body("prepare") }, code: "failed-precondition"},
		{name: "renew on a delete marker", scope: supervise, state: "deleted", build: func(c *refusalCtx) any { return c.renewal("renewStandingBundle") }, code: "failed-precondition"},
		{name: "stale epoch", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return harness.With(c.renewal("renew"), "processEpoch", 5) }, code: "conflict"},

		// Out of scope.
		{name: "renewRunDriver without a hold", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return harness.With(c.renewal("renewRunDriver"), "run", map[string]any{}) }, code: "bad-request"},
		{name: "contractArtifacts", scope: supervise, state: "prepared", build: func(c *refusalCtx) any { return harness.With(c.activate(), "contractArtifacts", []any{}) }, code: "unimplemented"},
		{name: "session operation", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return harness.With(c.renewal("renew"), "operation", "session") }, code: "unimplemented"},
		{name: "a renewal sent as a run attempt", scope: supervise, state: "activated", build: func(c *refusalCtx) any { return harness.With(c.renewal("renew"), "kind", "manager-run-attempt") }, code: "bad-request"},
	}
}

// TestManagerAuthorityRefusesAndWritesNothing: every refusal has its code, carries no
// credential, leaves every fence and every minted record as it was, and is recorded `refused`.
func TestManagerAuthorityRefusesAndWritesNothing(t *testing.T) {
	// A first prepare holds its slot of the endpoint's pool until the account's next signing,
	// about a second: a slot for each registration the owner may have under way at once.
	p := harness.StartPlane(t, func(c *service.Config) { c.Workers = 8 })
	env := &refusalEnv{t: t, p: p, account: p.Keys().Data.Public()}
	harness.Grant(t, p, harness.OwnerA, "prepper", "supervise")
	prepper := harness.CallerConn(t, p, harness.OwnerA, "prepper")

	cases := refusalCases()
	if len(cases) < 30 {
		t.Fatalf("got %d refusal conditions, want at least 30", len(cases))
	}
	// Every case's instance is registered first, all at once; then each case is asked alone, so
	// that nothing but its own request can move the stores it checks.
	var ms []*harness.ManagerKeys
	var activate []bool
	ctxs := make([]*refusalCtx, len(cases))
	for i, rc := range cases {
		ctxs[i] = &refusalCtx{m: harness.NewManagerKeys(t), account: env.account, actor: fmt.Sprintf("c%d", i)}
		if rc.state != "" {
			ms, activate = append(ms, ctxs[i].m), append(activate, rc.state != "prepared")
		}
	}
	preps, acts := harness.RegisterAll(t, prepper, harness.OwnerA, "prepper", ms, activate)
	for i, j := 0, 0; i < len(cases); i++ {
		if cases[i].state != "" {
			ctxs[i].prep, ctxs[i].act = preps[j], acts[j]
			j++
		}
	}
	for i, rc := range cases {
		t.Run(rc.name, func(t *testing.T) {
			c := ctxs[i]
			c.t = t
			if rc.state == "frozen" || rc.state == "retired" || rc.state == "deleted" {
				setGate(t, p, c.m.Iid, rc.state)
			}
			owner := harness.OwnerA
			if rc.owner != "" {
				owner = rc.owner
			}
			if rc.actor != nil {
				c.actor = rc.actor(c)
			}
			if rc.scope != nil {
				harness.Grant(t, p, owner, c.actor, rc.scope...)
			}
			nc := harness.CallerConn(t, p, owner, c.actor)
			body := rc.build(c)

			authBefore, mintedBefore := harness.LastSeq(t, p, subjects.AuthBucket(harness.TestSpace)), harness.LastSeq(t, p, subjects.MintedStream(harness.TestSpace))
			o := harness.Ask(t, nc, owner, c.actor, subjects.EndpointManagerAuthority, body)
			if o.Code != rc.code {
				t.Fatalf("got %q (%d) %q, want %q", o.Code, o.Numeric, o.Message, rc.code)
			}
			if len(o.Material.Credentials) != 0 || strings.Contains(string(o.Msg.Data), `"jwt"`) {
				t.Fatalf("a refusal carried credentials: %s", o.Msg.Data)
			}
			if got := o.Msg.Header.Get("Nats-Service-Error"); !strings.HasPrefix(got, rc.code+": ") {
				t.Errorf("got Nats-Service-Error %q, want it to start %q", got, rc.code+": ")
			}
			if after := harness.LastSeq(t, p, subjects.AuthBucket(harness.TestSpace)); after != authBefore {
				t.Errorf("the fence bucket moved from %d to %d; a refusal must change no fence", authBefore, after)
			}
			if after := harness.LastSeq(t, p, subjects.MintedStream(harness.TestSpace)); after != mintedBefore {
				t.Errorf("the minted stream moved from %d to %d; a refusal before signing mints nothing", mintedBefore, after)
			}
			d := harness.LastDecision(t, p, "refused", owner, c.actor)
			if d.Code != rc.code || d.Endpoint != subjects.EndpointManagerAuthority || d.Caller != subjects.Principal(owner, c.actor) {
				t.Errorf("got refused record %+v, want code %s from %s", d, rc.code, subjects.Principal(owner, c.actor))
			}
		})
	}
}

// setGate rewrites the manager gate of iid into state ("frozen" or "retired", with a
// retirement op) or leaves a delete marker ("deleted"), as a fence writer or an operator would.
func setGate(t testing.TB, p *harness.TestPlane, iid, state string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, js := harness.PlaneConn(t, p.Keys(), p.NATSURL())
	kv, err := js.KeyValue(ctx, subjects.AuthBucket(harness.TestSpace))
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
	row["nonce"] = harness.NewRequestID(t)
	if _, err := kv.Update(ctx, key, []byte(harness.Marshal(t, row)), e.Revision()); err != nil {
		t.Fatalf("set gate %s %s: %v", key, state, err)
	}
}
