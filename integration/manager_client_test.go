package integration

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/subjects"
)

// managerKeys is what a manager process holds: five duty nkeys it generated itself, its
// instance id and lifecycle (client.NewManager). Only public keys ever go to the plane.
type managerKeys struct {
	client.Manager
	iid, uid string
	keys     map[subjects.Duty]nkeys.KeyPair
}

func newManagerKeys(t testing.TB) *managerKeys {
	t.Helper()
	m, keys, err := client.NewManager()
	if err != nil {
		t.Fatal(err)
	}
	return &managerKeys{Manager: m, iid: m.InstanceID, uid: m.LifecycleUID, keys: keys}
}

func (m *managerKeys) pub(t testing.TB, d subjects.Duty) string {
	t.Helper()
	p, err := m.keys[d].PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (m *managerKeys) identities(t testing.TB) map[string]any {
	ids := map[string]any{}
	for _, d := range subjects.StandingDuties {
		ids[string(d)] = map[string]any{"id": m.pub(t, d)}
	}
	return ids
}

// newRequestID returns a fresh request id: 24 base64url characters.
func newRequestID(t testing.TB) string {
	b := make([]byte, 18)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// body builds a manager-service-authority request for operation op sent by actor, as a map a
// test can bend into a refusal. For a renewal, proof and epoch come from the material the
// manager was given.
func (m *managerKeys) body(t testing.TB, op, actor string) map[string]any {
	return map[string]any{
		"v": 1, "kind": "manager-service-authority", "operation": op,
		"space": testSpace, "actor": actor,
		"instanceId": m.iid, "managerLifecycleUid": m.uid,
		"requestId":  newRequestID(t),
		"identities": m.identities(t),
	}
}

// renewal adds what a renewal carries: the current proof, the account and the epoch.
func renewal(b map[string]any, proof, account string, epoch uint64) map[string]any {
	b["registrationProof"] = proof
	b["accountPublicKey"] = account
	b["processEpoch"] = epoch
	return b
}

// material is the reply to a manager-service-authority request.
type material = client.Material

// outcome is what came back from one request: a material or a refusal, and the answer as it
// came over the wire.
type outcome struct {
	msg      *nats.Msg
	material material
	code     string // the refusal code, "" on success
	numeric  int
	message  string
}

// principalClient is the client of principal owner.actor on nc, whose inbox prefix must be the
// principal's.
func principalClient(nc *nats.Conn, owner, actor string) (*client.Client, error) {
	return client.New(nc, testSpace, owner, actor)
}

// ask sends body on endpoint as owner.actor over nc (which must use that principal's inbox
// prefix) through the client package, and decodes the answer. body is marshalled, or sent as
// is if a string or []byte.
func ask(t testing.TB, nc *nats.Conn, owner, actor, endpoint string, body any) outcome {
	t.Helper()
	o := askAsync(nc, owner, actor, endpoint, body)
	if o.code == "transport" {
		t.Fatalf("request %s as %s: %s", endpoint, subjects.Principal(owner, actor), o.message)
	}
	return o
}

// mustMint asks and fails the test unless the answer carries credentials.
func mustMint(t testing.TB, nc *nats.Conn, owner, actor string, body any) material {
	t.Helper()
	o := ask(t, nc, owner, actor, subjects.EndpointManagerAuthority, body)
	if o.code != "" {
		t.Fatalf("got refusal %s (%d): %s, want material", o.code, o.numeric, o.message)
	}
	return o.material
}

// dutyConn connects as duty d of manager m with the credential in mat (JWT) and the seed only
// the manager holds, using the principal's inbox prefix.
func dutyConn(t testing.TB, p *testPlane, m *managerKeys, owner string, d subjects.Duty, jwt string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	seed, err := m.keys[d].Seed()
	if err != nil {
		t.Fatal(err)
	}
	actor := subjects.DutyActor(d, m.iid, "")
	all := append([]nats.Option{
		nats.UserJWTAndSeed(jwt, string(seed)),
		nats.CustomInboxPrefix(subjects.InboxPrefix(owner, actor)),
		nats.MaxReconnects(0),
	}, opts...)
	nc, err := nats.Connect(p.NATSURL(), all...)
	if err != nil {
		t.Fatalf("connect as %s %s: %v", d, subjects.Principal(owner, actor), err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// registered prepares and activates manager m for owner through the client of caller conn nc
// (a principal with supervise) and returns both materials.
func registered(t testing.TB, nc *nats.Conn, owner, actor string, m *managerKeys) (prep, act material) {
	t.Helper()
	c, err := principalClient(nc, owner, actor)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	p, err := c.Prepare(ctx, m.Manager)
	if err != nil {
		t.Fatalf("prepare: %v", err)
	}
	a, err := c.Activate(ctx, m.Manager, p.RegistrationProof)
	if err != nil {
		t.Fatalf("activate: %v", err)
	}
	return *p, *a
}

// askAsync is ask for any goroutine: a failure to get an answer comes back as the outcome's
// code "transport" instead of failing the test from the wrong goroutine.
func askAsync(nc *nats.Conn, owner, actor, endpoint string, body any) outcome {
	return askWithin(15*time.Second, nc, owner, actor, endpoint, body)
}

// askWithin is askAsync giving up after timeout.
func askWithin(timeout time.Duration, nc *nats.Conn, owner, actor, endpoint string, body any) outcome {
	c, err := principalClient(nc, owner, actor)
	if err != nil {
		return outcome{code: "transport", message: err.Error()}
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	msg, err := c.Request(ctx, endpoint, body)
	if err != nil {
		return outcome{code: "transport", message: err.Error()}
	}
	o := outcome{msg: msg}
	data, err := client.Decode(msg)
	var r *client.Refusal
	switch {
	case errors.As(err, &r):
		o.code, o.numeric, o.message = r.Code, r.Numeric, r.Message
		return o
	case err != nil:
		return outcome{code: "transport", message: err.Error()}
	}
	if err := json.Unmarshal(data, &o.material); err != nil {
		return outcome{code: "transport", message: err.Error()}
	}
	return o
}
