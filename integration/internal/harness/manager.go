package harness

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/internal/platform/space"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/subjects"
)

// ManagerKeys is what a manager process holds: five duty nkeys it generated itself, its
// instance id and lifecycle (client.NewManager). Only public keys ever go to the plane.
type ManagerKeys struct {
	client.Manager
	Iid, Uid string
	Keys     map[subjects.Duty]nkeys.KeyPair
}

func NewManagerKeys(t testing.TB) *ManagerKeys {
	t.Helper()
	m, keys, err := client.NewManager()
	if err != nil {
		t.Fatal(err)
	}
	return &ManagerKeys{Manager: m, Iid: m.InstanceID, Uid: m.LifecycleUID, Keys: keys}
}

func (m *ManagerKeys) Pub(t testing.TB, d subjects.Duty) string {
	t.Helper()
	p, err := m.Keys[d].PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (m *ManagerKeys) IdentityMap(t testing.TB) map[string]any {
	ids := map[string]any{}
	for _, d := range subjects.StandingDuties {
		ids[string(d)] = map[string]any{"id": m.Pub(t, d)}
	}
	return ids
}

// NewRequestID returns a fresh request id: 24 base64url characters.
func NewRequestID(t testing.TB) string {
	b := make([]byte, 18)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// Body builds a manager-service-authority request for operation op sent by actor, as a map a
// test can bend into a refusal. For a renewal, proof and epoch come from the material the
// manager was given.
func (m *ManagerKeys) Body(t testing.TB, op, actor string) map[string]any {
	return map[string]any{
		"v": 1, "kind": "manager-service-authority", "operation": op,
		"space": TestSpace, "actor": actor,
		"instanceId": m.Iid, "managerLifecycleUid": m.Uid,
		"requestId":  NewRequestID(t),
		"identities": m.IdentityMap(t),
	}
}

// Renewal adds what a renewal carries: the current proof, the account and the epoch.
func Renewal(b map[string]any, proof, account string, epoch uint64) map[string]any {
	b["registrationProof"] = proof
	b["accountPublicKey"] = account
	b["processEpoch"] = epoch
	return b
}

// Material is the reply to a manager-service-authority request.
type Material = client.Material

// Outcome is what came back from one request: a material or a refusal, and the answer as it
// came over the wire.
type Outcome struct {
	Msg      *nats.Msg
	Material Material
	Code     string // the refusal code, "" on success
	Numeric  int
	Message  string
}

// PrincipalClient is the client of principal owner.actor on nc, whose inbox prefix must be the
// principal's.
func PrincipalClient(nc *nats.Conn, owner, actor string) (*client.Client, error) {
	return client.New(nc, TestSpace, owner, actor)
}

// Ask sends body on endpoint as owner.actor over nc (which must use that principal's inbox
// prefix) through the client package, and decodes the answer. body is marshalled, or sent as
// is if a string or []byte.
func Ask(t testing.TB, nc *nats.Conn, owner, actor, endpoint string, body any) Outcome {
	t.Helper()
	o := AskAsync(nc, owner, actor, endpoint, body)
	if o.Code == "transport" {
		t.Fatalf("request %s as %s: %s", endpoint, subjects.Principal(owner, actor), o.Message)
	}
	return o
}

// MustMint asks and fails the test unless the answer carries credentials.
func MustMint(t testing.TB, nc *nats.Conn, owner, actor string, body any) Material {
	t.Helper()
	o := Ask(t, nc, owner, actor, subjects.EndpointManagerAuthority, body)
	if o.Code != "" {
		t.Fatalf("got refusal %s (%d): %s, want material", o.Code, o.Numeric, o.Message)
	}
	return o.Material
}

// DutyConn connects as duty d of manager m with the credential in mat (JWT) and the seed only
// the manager holds, using the principal's inbox prefix.
func DutyConn(t testing.TB, p *TestPlane, m *ManagerKeys, owner string, d subjects.Duty, jwt string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	seed, err := m.Keys[d].Seed()
	if err != nil {
		t.Fatal(err)
	}
	actor := subjects.DutyActor(d, m.Iid, "")
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

// AskAsync is ask for any goroutine: a failure to get an answer comes back as the outcome's
// code "transport" instead of failing the test from the wrong goroutine.
func AskAsync(nc *nats.Conn, owner, actor, endpoint string, body any) Outcome {
	return AskWithin(15*time.Second, nc, owner, actor, endpoint, body)
}

// AskWithin is askAsync giving up after timeout.
func AskWithin(timeout time.Duration, nc *nats.Conn, owner, actor, endpoint string, body any) Outcome {
	c, err := PrincipalClient(nc, owner, actor)
	if err != nil {
		return Outcome{Code: "transport", Message: err.Error()}
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	msg, err := c.Request(ctx, endpoint, body)
	if err != nil {
		return Outcome{Code: "transport", Message: err.Error()}
	}
	o := Outcome{Msg: msg}
	data, err := client.Decode(msg)
	var r *client.Refusal
	switch {
	case errors.As(err, &r):
		o.Code, o.Numeric, o.Message = r.Code, r.Numeric, r.Message
		return o
	case err != nil:
		return Outcome{Code: "transport", Message: err.Error()}
	}
	if err := json.Unmarshal(data, &o.Material); err != nil {
		return Outcome{Code: "transport", Message: err.Error()}
	}
	return o
}

// AskUntilAnswered is AskWithin sent again, up to four times, while it answers unavailable or
// not at all: a first prepare waits for a signing, which a loaded machine may not make by the
// deadline, and a manager sends it again.
func AskUntilAnswered(timeout time.Duration, nc *nats.Conn, owner, actor, endpoint string, body any) Outcome {
	for try := 1; ; try++ {
		o := AskWithin(timeout, nc, owner, actor, endpoint, body)
		if (o.Code != "unavailable" && o.Code != "transport") || try == 4 {
			return o
		}
	}
}

func WantDuties(t testing.TB, op string, m Material, duties ...string) {
	t.Helper()
	if len(m.Credentials) != len(duties) {
		t.Fatalf("%s: got credentials for %v, want exactly %v", op, Keys(m.Credentials), duties)
	}
	for _, d := range duties {
		c, ok := m.Credentials[d]
		if !ok || c.JWT == "" || c.Exp == 0 {
			t.Fatalf("%s: got credentials for %v, want %s", op, Keys(m.Credentials), d)
		}
		if m.ExpiresAt > c.Exp*1000 {
			t.Errorf("%s: expiresAt %d is after %s's exp %d", op, m.ExpiresAt, d, c.Exp)
		}
	}
}

func Keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func Flush(t testing.TB, nc *nats.Conn) {
	t.Helper()
	if err := nc.FlushTimeout(3 * time.Second); err != nil {
		t.Fatalf("flush: %v", err)
	}
}

func With(b map[string]any, kv ...any) map[string]any {
	for i := 0; i < len(kv); i += 2 {
		b[kv[i].(string)] = kv[i+1]
	}
	return b
}

func Marshal(t testing.TB, v any) string {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// WriteCallerCreds writes a caller `.creds` file for owner.actor, valid for an hour, as
// `authplane creds` does.
func WriteCallerCreds(t testing.TB, m *space.Keys, owner, actor string) string {
	t.Helper()
	return WriteCreds(t, m, admin.RoleCaller, owner, actor)
}

// WriteCreds writes a `.creds` file of role for owner.actor, valid for an hour.
func WriteCreds(t testing.TB, m *space.Keys, role admin.Role, owner, actor string) string {
	t.Helper()
	o := admin.DefaultCreds()
	o.Role, o.Owner, o.Actor, o.TTL = role, owner, actor, time.Hour
	creds, err := admin.Creds(m, o, time.Now())
	if err != nil {
		t.Fatalf("%s creds for %s: %v", role, subjects.Principal(owner, actor), err)
	}
	path := filepath.Join(t.TempDir(), owner+"."+actor+"."+string(role)+".creds")
	if err := os.WriteFile(path, creds, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// CallerConn connects to p's broker as principal owner.actor with a caller credential (what
// `authplane creds` writes) and the principal's inbox prefix; it closes when the test ends.
func CallerConn(t testing.TB, p *TestPlane, owner, actor string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	return ConnectCreds(t, p.NATSURL(), WriteCallerCreds(t, p.Keys(), owner, actor), owner, actor, opts...)
}

// OpsConn connects to p's broker as principal owner.actor with an ops credential (`authplane
// creds --role ops`): a caller that may also discover the service.
func OpsConn(t testing.TB, p *TestPlane, owner, actor string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	return ConnectCreds(t, p.NATSURL(), WriteCreds(t, p.Keys(), admin.RoleOps, owner, actor), owner, actor, opts...)
}

// ConnectCreds connects to url with the .creds file at path and owner.actor's inbox prefix.
// The connect is bounded by nats.go's 2 s, stretched by the machine's load: a race-built
// broker in the test process, beside parallel tests at a load of 10, has missed the 2 s.
func ConnectCreds(t testing.TB, url, path, owner, actor string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	all := append([]nats.Option{
		nats.Timeout(testkit.Stretched(nats.DefaultTimeout)),
		nats.UserCredentials(path),
		nats.CustomInboxPrefix(subjects.InboxPrefix(owner, actor)),
		nats.Name("test " + subjects.Principal(owner, actor)),
		nats.MaxReconnects(0),
	}, opts...)
	nc, err := nats.Connect(url, all...)
	if err != nil {
		t.Fatalf("connect as %s: %v", subjects.Principal(owner, actor), err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Grant writes owner.actor's ledger row with exactly scope, as `authplane grant` does.
func Grant(t testing.TB, p *TestPlane, owner, actor string, scope ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := admin.Grant(ctx, p.Keys(), p.NATSURL(), owner, actor, scope); err != nil {
		t.Fatalf("grant %v to %s: %v", scope, subjects.Principal(owner, actor), err)
	}
}

// NewUserKey returns a fresh public user nkey.
func NewUserKey(t testing.TB) string { return newKey(t, nkeys.CreateUser) }

// NewAccountKey returns a fresh public account nkey.
func NewAccountKey(t testing.TB) string { return newKey(t, nkeys.CreateAccount) }

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

// AsyncErrors collects a connection's asynchronous errors (permissions violations arrive
// this way).
type AsyncErrors struct {
	mu   sync.Mutex
	errs []error
}

// Option installs the collector as a connection's error handler.
func (a *AsyncErrors) Option() nats.Option {
	return nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.errs = append(a.errs, err)
	})
}

// Violation returns the collected permissions violation that names subject, if any.
func (a *AsyncErrors) Violation(subject string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, err := range a.errs {
		if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), `"`+subject+`"`) {
			return err
		}
	}
	return nil
}

// All returns every collected error.
func (a *AsyncErrors) All() []error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]error(nil), a.errs...)
}

// WaitViolation waits until the broker has reported a permissions violation for op ("Publish"
// or "Subscription") on subject.
func (a *AsyncErrors) WaitViolation(t testing.TB, op, subject string) {
	t.Helper()
	testkit.CheckFor(t, 3*time.Second, 10*time.Millisecond, func() error {
		err := a.Violation(subject)
		if err == nil {
			return fmt.Errorf("got no permissions violation for %s to %q (errors so far: %v), want one", op, subject, a.All())
		}
		if !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(op)) {
			return fmt.Errorf("got %q, want a violation for %s", err, op)
		}
		return nil
	})
}

// PrepareOnce prepares a new manager instance of OwnerA.cli on a fresh connection, and says
// how the plane answered.
func PrepareOnce(t testing.TB, p *TestPlane) error {
	t.Helper()
	c, err := client.Connect(p.NATSURL(), TestSpace, OwnerA, "cli", nats.UserCredentials(WriteCallerCreds(t, p.Keys(), OwnerA, "cli")))
	if err != nil {
		return err
	}
	defer c.Close()
	m, _, err := client.NewManager()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = c.Prepare(ctx, m)
	return err
}
