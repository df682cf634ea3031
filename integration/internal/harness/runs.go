package harness

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/subjects"
)

// RunEnv is a plane with one registered manager of ownerA, prepared by ownerA.cli (who holds
// supervise), and a caller ownerA.starter that publishes run-starts.
type RunEnv struct {
	t       *testing.T
	P       *TestPlane
	M       *ManagerKeys
	Cur     client.Renewal
	Cli     *client.Client
	Starter *nats.Conn
}

func NewRunEnv(t *testing.T, p *TestPlane) *RunEnv {
	t.Helper()
	Grant(t, p, OwnerA, "cli", "supervise")
	env := &RunEnv{t: t, P: p, M: NewManagerKeys(t)}
	var err error
	if env.Cli, err = PrincipalClient(CallerConn(t, p, OwnerA, "cli"), OwnerA, "cli"); err != nil {
		t.Fatal(err)
	}
	_, act := Registered(t, env.Cli.Conn(), OwnerA, "cli", env.M)
	env.Cur = act.Renewal()
	env.Starter = CallerConn(t, p, OwnerA, "starter")
	return env
}

// Ctx is a context for one request.
func (env *RunEnv) Ctx() context.Context {
	c, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	env.t.Cleanup(cancel)
	return c
}

// RunStart publishes a run-start of ownerA.starter on route (for instance iid on inst) and
// waits until the witness holds it; it returns the subject.
func (env *RunEnv) RunStart(route, iid string) string {
	env.t.Helper()
	nonce := make([]byte, 12)
	if _, err := rand.Read(nonce); err != nil {
		env.t.Fatal(err)
	}
	rs := subjects.RunStart{Space: TestSpace, Route: route, Instance: iid, Owner: OwnerA, Actor: "starter",
		UID: env.M.Uid, Generation: "1", Nonce: hex.EncodeToString(nonce)}
	subject := rs.Subject()
	if err := env.Starter.Publish(subject, []byte(`{}`)); err != nil {
		env.t.Fatal(err)
	}
	if err := env.Starter.Flush(); err != nil {
		env.t.Fatal(err)
	}
	testkit.CheckFor(env.t, 5*time.Second, 10*time.Millisecond, func() error {
		_, err := LastMsg(env.t, env.P, subjects.WitnessStream(TestSpace, OwnerA), subject)
		return err
	})
	return subject
}

// Admitted publishes a run-start and admits it as a new run of the env's manager.
func (env *RunEnv) Admitted() string {
	env.t.Helper()
	runID := client.NewRunID()
	if _, err := env.Cli.Admit(env.Ctx(), env.M.Manager, env.Cur, runID, env.RunStart(subjects.RouteOne, "")); err != nil {
		env.t.Fatalf("admit %s: %v", runID, err)
	}
	return runID
}

// Takeover is one attempt's keys and what it asks for.
type Takeover struct {
	Attempt  client.Attempt
	Driver   nkeys.KeyPair
	Mediator nkeys.KeyPair
}

// NewTakeover returns fresh keys and a fresh takeover id for run at epoch and token.
func (env *RunEnv) NewTakeover(runID string, epoch, token uint64) *Takeover {
	env.t.Helper()
	d, m := MustKey(env.t), MustKey(env.t)
	id := make([]byte, 8)
	if _, err := rand.Read(id); err != nil {
		env.t.Fatal(err)
	}
	return &Takeover{Driver: d, Mediator: m, Attempt: client.Attempt{RunID: runID, TakeoverID: hex.EncodeToString(id),
		Epoch: epoch, FencingToken: token, DriverID: PubOf(env.t, d), MediatorID: PubOf(env.t, m)}}
}

// Attempt asks for tk's credentials.
func (env *RunEnv) Attempt(tk *Takeover) (*client.RunMaterial, error) {
	return env.Cli.Attempt(env.Ctx(), env.M.Manager, env.Cur, tk.Attempt)
}

// MustAttempt asks for tk's credentials and fails the test unless they come.
func (env *RunEnv) MustAttempt(tk *Takeover) *client.RunMaterial {
	env.t.Helper()
	rm, err := env.Attempt(tk)
	if err != nil {
		env.t.Fatalf("attempt %d/%d: %v", tk.Attempt.Epoch, tk.Attempt.FencingToken, err)
	}
	return rm
}

// Driver connects as the run's driver with the credential rm carries and tk's seed, and
// returns its client.
func (env *RunEnv) Driver(rm *client.RunMaterial, tk *Takeover, opts ...nats.Option) *client.Client {
	env.t.Helper()
	return env.RunUser(rm.RunID, rm.Credentials["driver"].JWT, tk.Driver, opts...)
}

// RunUser connects as the run's principal with jwt and kp.
func (env *RunEnv) RunUser(runID, jwt string, kp nkeys.KeyPair, opts ...nats.Option) *client.Client {
	env.t.Helper()
	seed, err := kp.Seed()
	if err != nil {
		env.t.Fatal(err)
	}
	actor := subjects.RunActor(runID)
	c, err := client.Connect(env.P.NATSURL(), TestSpace, OwnerA, actor, append([]nats.Option{nats.UserJWTAndSeed(jwt, string(seed)), nats.MaxReconnects(0)}, opts...)...)
	if err != nil {
		env.t.Fatalf("connect as %s: %v", subjects.Principal(OwnerA, actor), err)
	}
	env.t.Cleanup(c.Close)
	return c
}

// Report reports state for rm's hold from its driver d.
func (env *RunEnv) Report(d *client.Client, rm *client.RunMaterial, state string) (*client.StatusReply, error) {
	return d.ReportStatus(env.Ctx(), client.RunStatus{RunID: rm.RunID, State: state, Holder: rm.Hold.Holder,
		Epoch: rm.Hold.Epoch, FencingToken: rm.Hold.FencingToken})
}

// Running takes over a new admitted run at (1,1) and has its driver report running.
func (env *RunEnv) Running() (*client.RunMaterial, *Takeover, *client.Client) {
	env.t.Helper()
	tk := env.NewTakeover(env.Admitted(), 1, 1)
	rm := env.MustAttempt(tk)
	d := env.Driver(rm, tk)
	if _, err := env.Report(d, rm, client.RunRunning); err != nil {
		env.t.Fatalf("report running: %v", err)
	}
	return rm, tk, d
}

// RenewDriver renews rm's hold.
func (env *RunEnv) RenewDriver(hold client.RunHold) (*client.RunMaterial, error) {
	return env.Cli.RenewRunDriver(env.Ctx(), env.M.Manager, env.Cur, hold)
}

// WantRefusal checks err is a refusal with code whose message contains text.
func WantRefusal(t testing.TB, err error, code, text string) {
	t.Helper()
	var r *client.Refusal
	if !errors.As(err, &r) || r.Code != code || !containsFold(r.Message, text) {
		t.Fatalf("got %v, want %s containing %q", err, code, text)
	}
}

func MustKey(t testing.TB) nkeys.KeyPair {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	return kp
}

func PubOf(t testing.TB, kp nkeys.KeyPair) string {
	t.Helper()
	p, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// containsFold reports whether s contains sub, whatever the case.
func containsFold(s, sub string) bool {
	return strings.Contains(strings.ToLower(s), strings.ToLower(sub))
}

// Revoker is a client of principal owner.actor, with scope set first (nil: no ledger row).
func (env *RunEnv) Revoker(owner, actor string, scope ...string) *client.Client {
	env.t.Helper()
	if scope != nil {
		Grant(env.t, env.P, owner, actor, scope...)
	}
	c, err := PrincipalClient(CallerConn(env.t, env.P, owner, actor), owner, actor)
	if err != nil {
		env.t.Fatal(err)
	}
	return c
}

// Revoke revokes runID as c with the manager's current proof.
func (env *RunEnv) Revoke(c *client.Client, runID, reason string) (*client.RevokeReply, error) {
	return c.Revoke(env.Ctx(), env.M.Manager, env.Cur, runID, reason)
}

// MarkerOf reads run's revocation marker as stored, or nil.
func MarkerOf(t testing.TB, p *TestPlane, runID string) []byte {
	t.Helper()
	bucket := subjects.AdmissionBucket(TestSpace)
	m, err := LastMsg(t, p, bucket, "$KV."+bucket+"."+subjects.RevokedKey(runID))
	if err != nil {
		return nil
	}
	return m.Data
}
