package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/internal/capability/signers"
	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/store"
	"github.com/cotal-ai/authplane/internal/platform/broker"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/subjects"
)

// Rotate runs `authplane keys rotate-signing` of kind against p, resuming with kind "".
func Rotate(t testing.TB, p *TestPlane, kind string) (*signers.Report, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return admin.RotateSigning(ctx, p.Keys(), p.NATSURL(), admin.RotateOptions{Kind: kind, Resume: kind == ""})
}

// MustRotate is Rotate, done.
func MustRotate(t testing.TB, p *TestPlane, kind string) *signers.Report {
	t.Helper()
	rep, err := Rotate(t, p, kind)
	if err != nil {
		t.Fatalf("rotate %s: %v", kind, err)
	}
	return rep
}

// CurrentCreds writes a `.creds` file of owner.actor as `authplane creds` does now: signed by
// the data account's signing key that signs now.
func CurrentCreds(t testing.TB, p *TestPlane, owner, actor string) string {
	t.Helper()
	o := admin.DefaultCreds()
	o.Owner, o.Actor, o.TTL = owner, actor, time.Hour
	iss, err := admin.CredsIssuer(GrantCtx(t), p.Keys(), p.NATSURL(), time.Now().Add(o.TTL))
	if err != nil {
		t.Fatal(err)
	}
	o.Issuer = iss
	c, err := admin.IssueCreds(p.Keys(), o, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), owner+"."+actor+".creds")
	if err := os.WriteFile(path, c.Data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// HeldSigningKeys is the data account's signing keys as each server of p's broker applies them.
func HeldSigningKeys(t testing.TB, p *TestPlane, n int) map[string]map[string]bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	held, err := broker.Account{NC: SystemConn(t, p), Public: p.Account()}.Held(ctx, n)
	if err != nil || len(held) != n {
		t.Fatalf("the data account at %d servers: got %d answers, %v", n, len(held), err)
	}
	out := map[string]map[string]bool{}
	for name, token := range held {
		claims, err := jwt.DecodeAccountClaims(token)
		if err != nil {
			t.Fatalf("server %s: %v", name, err)
		}
		out[name] = map[string]bool{}
		for k := range claims.SigningKeys {
			out[name][k] = true
		}
	}
	return out
}

// UnlistedConnections lists, on p's broker's n servers, the data account's connections whose
// signing key no server lists any more.
func UnlistedConnections(t testing.TB, p *TestPlane, n int) []broker.Connection {
	t.Helper()
	held := HeldSigningKeys(t, p, n)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conns, answered, err := broker.Account{NC: SystemConn(t, p), Public: p.Account()}.ListConnections(ctx, n)
	if err != nil || len(answered) != n {
		t.Fatalf("list the connections: %d of %d servers answered, %v", len(answered), n, err)
	}
	var out []broker.Connection
	for _, c := range conns {
		if c.Issuer == "" {
			t.Fatalf("connection %s of %s: the listing names no signing key", c.Principal, c.Server)
		}
		listed := false
		for _, keys := range held {
			listed = listed || keys[c.Issuer]
		}
		if !listed {
			out = append(out, c)
		}
	}
	return out
}

// ConnectRefused fails the test unless connecting to url with opts is refused at connect.
func ConnectRefused(t testing.TB, what, url string, opts ...nats.Option) {
	t.Helper()
	nc, err := nats.Connect(url, append([]nats.Option{nats.MaxReconnects(0), nats.Timeout(5 * time.Second)}, opts...)...)
	if err == nil {
		nc.Close()
		t.Errorf("%s: connected, want refused at connect", what)
		return
	}
	if !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Errorf("%s: got %v, want an authorization violation", what, err)
	}
}

// Emergency: a manager (its supervisor and serve duties), the person who prepared it (a caller
// credential) and a managed agent (through the auth callout) hold live connections, on every
// server of urls; an emergency rotation then closes every one of them, confirmed by the
// servers' connection listings; every old credential and bearer is refused at connect; a
// renewal with the old registration answers `expired` and writes nothing; and under the new
// keys a fresh caller credential, a prepare, an activate, a renewal, their connections and a
// new bearer all work. The live connections never reconnect: on a cluster a client whose server
// closed it would go on trying the others (refused each time), never closed.
func Emergency(t *testing.T, p *TestPlane, urls []string) {
	Grant(t, p, OwnerA, "cli", "supervise")
	cliCreds := WriteCallerCreds(t, p.Keys(), OwnerA, "cli")
	cli := ConnectCreds(t, urls[0], cliCreds, OwnerA, "cli", nats.NoReconnect())
	m := NewManagerKeys(t)
	prep, act := Registered(t, cli, OwnerA, "cli", m)
	bearerTok := AgentBearer(t, p, OwnerB, "agent")
	b := FetchBundle(t, p.PublicURL())
	var live []*nats.Conn
	for i, url := range urls {
		sup := DutyConnAt(t, url, m, OwnerA, subjects.DutySupervisor, prep.Credentials["supervisor"].JWT)
		serve := DutyConnAt(t, url, m, OwnerA, subjects.DutyServe, act.Credentials["serve"].JWT)
		b.Server = url
		agent, err := BearerConnect(t, b, bearerTok, OwnerB, "agent", nats.NoReconnect())
		if err != nil {
			t.Fatalf("agent through the callout at server %d: %v", i, err)
		}
		live = append(live, sup, serve, agent)
	}
	live = append(live, cli)
	if left := UnlistedConnections(t, p, len(urls)); len(left) != 0 {
		t.Fatalf("before the rotation: %d connections of keys not listed, want none", len(left))
	}

	rep := MustRotate(t, p, signers.Emergency)
	if !rep.Done || rep.To != 1 || rep.Left != 0 || len(rep.Unconfirmed) != 0 || len(rep.Confirmed) != len(urls) {
		t.Fatalf("the emergency rotation: got %+v, want done, generation 1, every server confirmed, no connection left", rep)
	}
	testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		for i, nc := range live {
			if !nc.IsClosed() {
				return fmt.Errorf("live connection %d (%s) is still open", i, nc.Opts.Name)
			}
		}
		return nil
	})
	if left := UnlistedConnections(t, p, len(urls)); len(left) != 0 {
		t.Fatalf("after the rotation: the servers list %d connections of the old keys (%v), want none", len(left), left)
	}
	for _, url := range urls {
		ConnectRefused(t, "the old caller credential at "+url, url, nats.UserCredentials(cliCreds))
		seed, _ := m.Keys[subjects.DutySupervisor].Seed()
		ConnectRefused(t, "the old supervisor credential at "+url, url, nats.UserJWTAndSeed(prep.Credentials["supervisor"].JWT, string(seed)))
		b.Server = url
		if nc, err := BearerConnect(t, b, bearerTok, OwnerB, "agent"); err == nil {
			nc.Close()
			t.Errorf("the old bearer at %s: connected, want refused", url)
		}
	}

	// A fresh caller credential works; a renewal with the old registration is expired. The
	// plane's own serving connection was closed with the old keys too: it is back under the
	// new ones within a second or so (no responders until then).
	cli = ConnectCreds(t, urls[len(urls)-1], CurrentCreds(t, p, OwnerA, "cli"), OwnerA, "cli")
	before := StoreSeqs(t, p).Except(subjects.AuthBucket(TestSpace))
	var o Outcome
	back := time.Now()
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if o = AskWithin(time.Second, cli, OwnerA, "cli", subjects.EndpointManagerAuthority, Renewal(m.Body(t, "renew", "cli"), act.NextRegistrationProof, p.Account(), 0)); o.Code == "transport" {
			return fmt.Errorf("the plane does not answer: %s", o.Message)
		}
		return nil
	})
	t.Logf("the plane answered again %s after the rotation returned", time.Since(back).Round(time.Millisecond))
	if o.Code != "expired" || o.Numeric != 410 || !strings.Contains(o.Message, "emergency rotation; prepare again") {
		t.Fatalf("a renewal with the old registration: got %s %d %q, want expired 410 telling it to prepare again", o.Code, o.Numeric, o.Message)
	}
	WantUnwritten(t, p, "the expired renewal", before)

	prep, act = Registered(t, cli, OwnerA, "cli", m)
	renewed := MustMint(t, cli, OwnerA, "cli", Renewal(m.Body(t, "renew", "cli"), act.NextRegistrationProof, p.Account(), prep.ProcessEpoch))
	for i, url := range urls {
		sup := DutyConnAt(t, url, m, OwnerA, subjects.DutySupervisor, renewed.Credentials["supervisor"].JWT)
		if err := sup.Flush(); err != nil {
			t.Errorf("the renewed supervisor at server %d: %v", i, err)
		}
	}
	b.Server = urls[0]
	agent, err := BearerConnect(t, b, AgentBearer(t, p, OwnerB, "agent"), OwnerB, "agent")
	if err != nil {
		t.Fatalf("a new bearer after the rotation: %v", err)
	}
	if err := agent.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, keys := range HeldSigningKeys(t, p, len(urls)) {
		if own, _ := p.Keys().Data.Signer.PublicKey(); keys[own] {
			t.Errorf("a server still lists the Material's data signing key")
		}
	}
}

// DutyConnAt is dutyConn at url.
func DutyConnAt(t testing.TB, url string, m *ManagerKeys, owner string, d subjects.Duty, token string) *nats.Conn {
	t.Helper()
	seed, err := m.Keys[d].Seed()
	if err != nil {
		t.Fatal(err)
	}
	actor := subjects.DutyActor(d, m.Iid, "")
	nc, err := nats.Connect(url, nats.UserJWTAndSeed(token, string(seed)), nats.CustomInboxPrefix(subjects.InboxPrefix(owner, actor)),
		nats.NoReconnect(), nats.Name(string(d)))
	if err != nil {
		t.Fatalf("connect as %s at %s: %v", d, url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Generations derives the data account's signing keys of every generation, as the plane does:
// generation 0 from the material, later ones from the keys bucket.
func Generations(t testing.TB, p *TestPlane) *signers.Keys {
	t.Helper()
	nc, _ := PlaneConn(t, p.Keys(), p.NATSURL())
	kv, err := store.OpenBucket(GrantCtx(t), nc, subjects.KeysBucket(TestSpace))
	if err != nil {
		t.Fatal(err)
	}
	k, err := signers.NewKeys(TestSpace, p.Account(), p.Keys().Data.Signer, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	return k.Stored(kv)
}

// MainKey is generation gen's own signing key.
func MainKey(t testing.TB, k *signers.Keys, gen uint64) string {
	t.Helper()
	if err := k.Load(GrantCtx(t), gen); err != nil {
		t.Fatal(err)
	}
	iss, err := k.Main(gen)
	if err != nil {
		t.Fatal(err)
	}
	return iss.Signer()
}

// SignedBy is the key that signed a user JWT.
func SignedBy(t testing.TB, token string) string {
	t.Helper()
	c, err := jwt.DecodeUserClaims(token)
	if err != nil {
		t.Fatal(err)
	}
	return c.Issuer
}

// RotateWith runs `authplane keys rotate-signing` against p as o says.
func RotateWith(t testing.TB, p *TestPlane, o admin.RotateOptions) (*signers.Report, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return admin.RotateSigning(ctx, p.Keys(), p.NATSURL(), o)
}

// RotationSeqs is StoreSeqs with the keys bucket, where a rotation stores its generations and
// an emergency one replaces the bearer keys.
func RotationSeqs(t testing.TB, p *TestPlane) Seqs {
	t.Helper()
	s := StoreSeqs(t, p)
	s[subjects.KeysBucket(TestSpace)] = LastSeq(t, p, subjects.KeysBucket(TestSpace))
	return s
}

// WantRotationUnwritten fails the test if a store of before, or the data account JWT the
// broker holds (issued at jwtIssued), moved since.
func WantRotationUnwritten(t testing.TB, p *TestPlane, what string, before Seqs, jwtIssued int64) {
	t.Helper()
	now := RotationSeqs(t, p)
	for name, seq := range before {
		if now[name] != seq {
			t.Errorf("%s: %s moved from sequence %d to %d; a refused rotation writes nothing", what, name, seq, now[name])
		}
	}
	if claims, _ := DataAccountAtBroker(t, p); claims.IssuedAt != jwtIssued {
		t.Errorf("%s: the broker holds a data account JWT issued at %d, want the one issued at %d", what, claims.IssuedAt, jwtIssued)
	}
}

// SigningStatus is `authplane keys signing` against p.
func SigningStatus(t testing.TB, p *TestPlane) (signers.State, *signers.Report) {
	t.Helper()
	st, rep, err := admin.SigningStatus(GrantCtx(t), p.Keys(), p.NATSURL())
	if err != nil {
		t.Fatalf("authplane keys signing: %v", err)
	}
	return st, rep
}

// IsConflict reports whether err is a conflict refusal (a rotation under way).
func IsConflict(err error) bool { return fault.CodeOf(err) == fault.Conflict }
