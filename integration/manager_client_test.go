package integration

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/internal/instance"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// managerKeys is what a manager process holds: five duty nkeys it generated itself, its
// instance id and lifecycle. Only public keys ever go to the plane.
type managerKeys struct {
	iid, uid string
	keys     map[subjects.Duty]nkeys.KeyPair
}

func newManagerKeys(t testing.TB) *managerKeys {
	t.Helper()
	m := &managerKeys{iid: instance.NewUID(), uid: instance.NewUID(), keys: map[subjects.Duty]nkeys.KeyPair{}}
	for _, d := range subjects.StandingDuties {
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		m.keys[d] = kp
	}
	return m
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

func newRequestID(t testing.TB) string {
	b := make([]byte, 18)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// body builds a manager-service-authority request for operation op sent by actor. For a
// renewal, proof and epoch come from the material the manager was given.
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
type material struct {
	V           int    `json:"v"`
	Kind        string `json:"kind"`
	Operation   string `json:"operation"`
	Owner       string `json:"owner"`
	Actors      map[string]string
	Credentials map[string]struct {
		JWT string `json:"jwt"`
		Exp int64  `json:"exp"`
	} `json:"credentials"`
	IssuedAt              int64  `json:"issuedAt"`
	ExpiresAt             int64  `json:"expiresAt"`
	RegistrationProof     string `json:"registrationProof"`
	NextRegistrationProof string `json:"nextRegistrationProof"`
	RequestID             string `json:"requestId"`
	InstanceID            string `json:"instanceId"`
	ManagerLifecycleUID   string `json:"managerLifecycleUid"`
	AccountPublicKey      string `json:"accountPublicKey"`
	ProcessEpoch          uint64 `json:"processEpoch"`
}

// outcome is what came back from one request: a material or a refusal.
type outcome struct {
	msg      *nats.Msg
	material material
	code     string // the refusal code, "" on success
	numeric  string
	message  string
}

// ask sends body on endpoint as owner.actor over nc (which must use that principal's inbox
// prefix) and decodes the answer. body is marshalled, or sent as is if a string or []byte.
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
		t.Fatalf("got refusal %s (%s): %s, want material", o.code, o.numeric, o.message)
	}
	return o.material
}

// dutyConn connects as duty d of manager m with the credential in mat (JWT) and the seed only
// the manager holds, using the principal's inbox prefix.
func dutyConn(t testing.TB, p *service.Plane, m *managerKeys, owner string, d subjects.Duty, jwt string, opts ...nats.Option) *nats.Conn {
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

// registered prepares and activates manager m for owner through caller conn nc (a principal
// with supervise) and returns both materials.
func registered(t testing.TB, nc *nats.Conn, owner, actor string, m *managerKeys) (prep, act material) {
	t.Helper()
	prep = mustMint(t, nc, owner, actor, m.body(t, "prepare", actor))
	b := m.body(t, "activate", actor)
	b["registrationProof"] = prep.RegistrationProof
	act = mustMint(t, nc, owner, actor, b)
	return prep, act
}

// askAsync is ask for any goroutine: a failure to get an answer comes back as the outcome's
// code "transport" instead of failing the test from the wrong goroutine.
func askAsync(nc *nats.Conn, owner, actor, endpoint string, body any) outcome {
	var data []byte
	switch b := body.(type) {
	case []byte:
		data = b
	case string:
		data = []byte(b)
	default:
		var err error
		if data, err = json.Marshal(body); err != nil {
			return outcome{code: "transport", message: err.Error()}
		}
	}
	msg, err := nc.Request(subjects.EndpointSubject(testSpace, endpoint, owner, actor), data, 15*time.Second)
	if err != nil {
		return outcome{code: "transport", message: err.Error()}
	}
	o := outcome{msg: msg}
	if code := msg.Header.Get("Nats-Service-Error-Code"); code != "" {
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		if err := json.Unmarshal(msg.Data, &e); err != nil {
			return outcome{code: "transport", message: err.Error()}
		}
		o.code, o.numeric, o.message = e.Error.Code, code, e.Error.Message
		return o
	}
	if err := json.Unmarshal(msg.Data, &o.material); err != nil {
		return outcome{code: "transport", message: err.Error()}
	}
	return o
}

// readRecord decodes the newest message on subject of stream into v.
func readRecord(t testing.TB, p *service.Plane, stream, subject string, v any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	data, err := p.Stores().LastRecord(ctx, stream, subject)
	if err != nil {
		t.Fatalf("read %s from %s: %v", subject, stream, err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("decode %s: %v", subject, err)
	}
}

// gateRevision is the KV revision of the manager gate of iid.
func gateRevision(t testing.TB, p *service.Plane, iid string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	e, err := p.Stores().Auth.Get(ctx, subjects.GateKey("manager", iid))
	if err != nil {
		t.Fatalf("read gate of %s: %v", iid, err)
	}
	return e.Revision
}
