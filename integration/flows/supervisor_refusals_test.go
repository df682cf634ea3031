package flows

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/subjects"
)

// supRefusal is one request the supervisor's endpoints must refuse.
type supRefusal struct {
	name     string
	endpoint string
	// admin says the caller holds platform-admin (otherwise only supervise).
	admin bool
	// setup prepares the lifecycle the body names: assigned, registered, edited in the store.
	setup func(c *supCase)
	body  func(c *supCase) any
	code  string
	text  func(c *supCase) string
}

// supCase is what a refusal's body is built from: a fresh owner and manager, and what setup
// did.
type supCase struct {
	t  *testing.T
	p  *harness.TestPlane
	pa *harness.PlatformAdmin
	s  *harness.Supervised
}

func (c *supCase) assign()   { c.s.A = mustAssign(c.t, c.pa, c.s, time.Now().Add(time.Hour)) }
func (c *supCase) register() { c.assign(); c.pa.Register(c.s) }

func mustAssign(t *testing.T, pa *harness.PlatformAdmin, s *harness.Supervised, end time.Time) *client.Assignment {
	t.Helper()
	a, err := pa.C.Assign(harness.CallCtx(t), s.AssignBody(end))
	if err != nil {
		t.Fatalf("assign: %v", err)
	}
	return a
}

// raw is v as a JSON object a case can bend.
func raw(t *testing.T, v any) map[string]any {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func (c *supCase) assignBody() map[string]any {
	b := raw(c.t, c.s.AssignBody(time.Now().Add(time.Hour)))
	b["v"], b["kind"] = 1, client.KindAssign
	return b
}

func (c *supCase) authorityBody(op string) map[string]any { return raw(c.t, c.pa.Body(c.s, op)) }

func (c *supCase) endBody() map[string]any {
	return map[string]any{"v": 1, "kind": client.KindEnd, "owner": c.s.Owner, "instanceId": c.s.M.Iid, "lifecycleUid": c.s.M.Uid, "reason": "done"}
}

func fixed(s string) func(*supCase) string { return func(*supCase) string { return s } }

func supRefusals() []supRefusal {
	assign, authority, end := subjects.EndpointSupervisorAssign, subjects.EndpointSupervisorAuthority, subjects.EndpointSupervisorEnd
	ended := func(c *supCase) string { return endedText(c.s.Owner) }
	noAssignment := func(c *supCase) string { return "owner " + c.s.Owner + " has no platform supervisor assignment" }
	editAssignment := func(edit func(map[string]any)) func(*supCase) {
		return func(c *supCase) {
			c.register()
			c.s.A.Revision = writeAssignment(c.t, c.p, c.s.Owner, func(row map[string]any) { edit(row); row["nonce"] = harness.NewRequestID(c.t) })
		}
	}
	return []supRefusal{
		// supervisor-assign
		{name: "assign without platform-admin", endpoint: assign, body: func(c *supCase) any { return c.assignBody() }, code: "permission-denied", text: fixed(`needs scope "platform-admin"`)},
		{name: "assign to a platform owner", endpoint: assign, admin: true, body: func(c *supCase) any { return harness.With(c.assignBody(), "owner", harness.OwnerP) }, code: "bad-request", text: fixed("field owner")},
		{name: "assign with an unknown key", endpoint: assign, admin: true, body: func(c *supCase) any { return harness.With(c.assignBody(), "scope", []string{"supervise"}) }, code: "bad-request", text: fixed("field scope: unknown field")},
		{name: "assign ending in the past", endpoint: assign, admin: true, body: func(c *supCase) any { return harness.With(c.assignBody(), "expiresAt", time.Now().Unix()-1) }, code: "bad-request", text: fixed("field expiresAt: want a time in the future")},
		{name: "assign past --max-assignment-ttl", endpoint: assign, admin: true, body: func(c *supCase) any {
			return harness.With(c.assignBody(), "expiresAt", time.Now().Add(31*24*time.Hour).Unix())
		}, code: "bad-request", text: fixed("--max-assignment-ttl")},
		{name: "assign with no end", endpoint: assign, admin: true, body: func(c *supCase) any { return without(c.assignBody(), "expiresAt") }, code: "bad-request", text: fixed("field expiresAt: want a time in the future")},
		{name: "assign over an assignment in force", endpoint: assign, admin: true, setup: (*supCase).assign,
			body: func(c *supCase) any {
				return harness.With(c.assignBody(), "lifecycleUid", harness.NewManagerKeys(c.t).Uid)
			},
			code: "failed-precondition", text: func(c *supCase) string {
				return "owner " + c.s.Owner + " has a platform supervisor assignment in force"
			}},
		{name: "assign an instance another owner registered", endpoint: assign, admin: true, setup: func(c *supCase) {
			harness.Grant(c.t, c.p, harness.OwnerB, "cli", "supervise")
			harness.Registered(c.t, harness.CallerConn(c.t, c.p, harness.OwnerB, "cli"), harness.OwnerB, "cli", c.s.M)
		}, body: func(c *supCase) any { return c.assignBody() }, code: "permission-denied", text: func(c *supCase) string { return "instance " + c.s.M.Iid + " is registered to another owner" }},

		// supervisor-authority, in the original's order
		{name: "authority with a request not the CLI's", endpoint: authority, admin: true, setup: (*supCase).assign,
			body: func(c *supCase) any {
				b := c.authorityBody(client.OpPrepare)
				b["request"].(map[string]any)["actor"] = "admin"
				return b
			}, code: "bad-request", text: fixed(`field request.actor: want "cli"`)},
		{name: "authority with a bad inner request", endpoint: authority, admin: true, setup: (*supCase).assign,
			body: func(c *supCase) any {
				b := c.authorityBody(client.OpPrepare)
				b["request"].(map[string]any)["instanceId"] = "BAD"
				return b
			}, code: "bad-request", text: fixed("field request.instanceId")},
		{name: "authority without platform-admin, before the assignment is read", endpoint: authority, body: func(c *supCase) any { return c.authorityBody(client.OpPrepare) },
			code: "permission-denied", text: fixed(`needs scope "platform-admin"`)},
		{name: "authority with no assignment", endpoint: authority, admin: true, body: func(c *supCase) any { return c.authorityBody(client.OpPrepare) },
			code: "permission-denied", text: noAssignment},
		{name: "authority under an assignment of another space", endpoint: authority, admin: true, setup: editAssignment(func(row map[string]any) { row["space"] = "other" }),
			body: func(c *supCase) any { return c.authorityBody(client.OpRenew) }, code: "permission-denied", text: fixed("names another owner, space or account")},
		{name: "authority at another revision", endpoint: authority, admin: true, setup: (*supCase).register,
			body: func(c *supCase) any {
				return harness.With(c.authorityBody(client.OpRenew), "assignmentRevision", c.s.A.Revision+100)
			},
			code: "permission-denied", text: fixed("is not the revision of")},
		{name: "authority of an ended assignment at another revision: ended first", endpoint: authority, admin: true,
			setup: func(c *supCase) { c.register(); endOrFail(c) },
			body: func(c *supCase) any {
				return harness.With(c.authorityBody(client.OpRenew), "assignmentRevision", c.s.A.Revision+100)
			},
			code: "permission-denied", text: ended},
		{name: "authority under an assignment wider than supervise", endpoint: authority, admin: true,
			setup: editAssignment(func(row map[string]any) { row["scope"] = []string{"supervise", "admin"} }),
			body:  func(c *supCase) any { return c.authorityBody(client.OpRenew) }, code: "permission-denied", text: fixed(`does not grant exactly "supervise"`)},
		{name: "authority for another instance", endpoint: authority, admin: true, setup: (*supCase).assign,
			body: func(c *supCase) any {
				b := c.authorityBody(client.OpPrepare)
				b["request"].(map[string]any)["instanceId"] = harness.NewManagerKeys(c.t).Iid
				return b
			}, code: "permission-denied", text: fixed("the request's space, instance and lifecycle are not those of owner")},
		{name: "authority for another lifecycle", endpoint: authority, admin: true, setup: (*supCase).assign,
			body: func(c *supCase) any {
				b := c.authorityBody(client.OpPrepare)
				b["request"].(map[string]any)["managerLifecycleUid"] = harness.NewManagerKeys(c.t).Uid
				return b
			}, code: "permission-denied", text: fixed("the request's space, instance and lifecycle are not those of owner")},

		// supervisor-end
		{name: "end without platform-admin", endpoint: end, setup: (*supCase).register, body: func(c *supCase) any { return c.endBody() },
			code: "permission-denied", text: fixed(`needs scope "platform-admin"`)},
		{name: "end with no reason", endpoint: end, admin: true, setup: (*supCase).register, body: func(c *supCase) any { return harness.With(c.endBody(), "reason", " ") },
			code: "bad-request", text: fixed("field reason")},
		{name: "end with a reason over 256 bytes", endpoint: end, admin: true, setup: (*supCase).register,
			body: func(c *supCase) any { return harness.With(c.endBody(), "reason", strings.Repeat("x", 257)) }, code: "bad-request", text: fixed("field reason")},
		{name: "end with no assignment", endpoint: end, admin: true, body: func(c *supCase) any { return c.endBody() }, code: "permission-denied", text: noAssignment},
		{name: "end of another lifecycle", endpoint: end, admin: true, setup: (*supCase).register,
			body: func(c *supCase) any {
				return harness.With(c.endBody(), "lifecycleUid", harness.NewManagerKeys(c.t).Uid)
			},
			code: "failed-precondition", text: fixed("instanceId and lifecycleUid are not those of owner")},
		{name: "end of an instance another owner registered", endpoint: end, admin: true, setup: func(c *supCase) {
			c.assign()
			harness.Grant(c.t, c.p, harness.OwnerB, "cli", "supervise")
			harness.Registered(c.t, harness.CallerConn(c.t, c.p, harness.OwnerB, "cli"), harness.OwnerB, "cli", c.s.M)
		}, body: func(c *supCase) any { return c.endBody() }, code: "permission-denied", text: func(c *supCase) string { return "instance " + c.s.M.Iid + " is registered to another owner" }},
	}
}

func endOrFail(c *supCase) {
	c.t.Helper()
	if _, err := c.pa.End(c.s); err != nil {
		c.t.Fatalf("end: %v", err)
	}
}

// TestSupervisorEndpointsRefuseWithTheirTextsAndWriteNothing: each case is refused with its
// code and text, the refusal is recorded, and nothing but the record is written.
func TestSupervisorEndpointsRefuseWithTheirTextsAndWriteNothing(t *testing.T) {
	t.Parallel()
	p := harness.StartPlane(t, nil)
	admin := harness.NewPlatformAdmin(t, p, "admin")
	harness.Grant(t, p, harness.OwnerP, "nobody", "supervise") // supervise does not imply platform-admin
	nobody := harness.CallerConn(t, p, harness.OwnerP, "nobody")
	for _, tt := range supRefusals() {
		t.Run(tt.name, func(t *testing.T) {
			c := &supCase{t: t, p: p, pa: admin, s: &harness.Supervised{Owner: harness.NewOwner(t), M: harness.NewManagerKeys(t)}}
			c.s.A = &client.Assignment{Revision: 1}
			if tt.setup != nil {
				tt.setup(c)
			}
			nc, actor := admin.Nc, "admin"
			if !tt.admin {
				nc, actor = nobody, "nobody"
			}
			before := harness.StoreSeqs(t, p)
			o := harness.Ask(t, nc, harness.OwnerP, actor, tt.endpoint, tt.body(c))
			if want := tt.text(c); o.Code != tt.code || !strings.Contains(o.Message, want) {
				t.Fatalf("got %s %q, want %s containing %q", o.Code, o.Message, tt.code, want)
			}
			harness.WantUnwritten(t, p, tt.name, before)
			if rec := harness.LastDecision(t, p, "refused", harness.OwnerP, actor); rec.Code != tt.code || rec.Endpoint != tt.endpoint {
				t.Errorf("refused record: got %+v, want %s on %s", rec, tt.code, tt.endpoint)
			}
		})
	}
}
