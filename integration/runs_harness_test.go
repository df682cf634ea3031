package integration

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
	"github.com/cotal-ai/authplane/subjects"
)

// runEnv is a plane with one registered manager of ownerA, prepared by ownerA.cli (who holds
// supervise), and a caller ownerA.starter that publishes run-starts.
type runEnv struct {
	t       *testing.T
	p       *testPlane
	m       *managerKeys
	cur     client.Renewal
	cli     *client.Client
	starter *nats.Conn
}

func newRunEnv(t *testing.T, p *testPlane) *runEnv {
	t.Helper()
	grant(t, p, ownerA, "cli", "supervise")
	env := &runEnv{t: t, p: p, m: newManagerKeys(t)}
	var err error
	if env.cli, err = principalClient(callerConn(t, p, ownerA, "cli"), ownerA, "cli"); err != nil {
		t.Fatal(err)
	}
	_, act := registered(t, env.cli.Conn(), ownerA, "cli", env.m)
	env.cur = act.Renewal()
	env.starter = callerConn(t, p, ownerA, "starter")
	return env
}

// ctx is a context for one request.
func (env *runEnv) ctx() context.Context {
	c, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	env.t.Cleanup(cancel)
	return c
}

// runStart publishes a run-start of ownerA.starter on route (for instance iid on inst) and
// waits until the witness holds it; it returns the subject.
func (env *runEnv) runStart(route, iid string) string {
	env.t.Helper()
	nonce := make([]byte, 12)
	if _, err := rand.Read(nonce); err != nil {
		env.t.Fatal(err)
	}
	rs := subjects.RunStart{Space: testSpace, Route: route, Instance: iid, Owner: ownerA, Actor: "starter",
		UID: env.m.uid, Generation: "1", Nonce: hex.EncodeToString(nonce)}
	subject := rs.Subject()
	if err := env.starter.Publish(subject, []byte(`{}`)); err != nil {
		env.t.Fatal(err)
	}
	if err := env.starter.Flush(); err != nil {
		env.t.Fatal(err)
	}
	checkFor(env.t, 5*time.Second, 10*time.Millisecond, func() error {
		_, err := lastMsg(env.t, env.p, subjects.WitnessStream(testSpace, ownerA), subject)
		return err
	})
	return subject
}

// admitted publishes a run-start and admits it as a new run of the env's manager.
func (env *runEnv) admitted() string {
	env.t.Helper()
	runID := client.NewRunID()
	if _, err := env.cli.Admit(env.ctx(), env.m.Manager, env.cur, runID, env.runStart(subjects.RouteOne, "")); err != nil {
		env.t.Fatalf("admit %s: %v", runID, err)
	}
	return runID
}

// takeover is one attempt's keys and what it asks for.
type takeover struct {
	attempt  client.Attempt
	driver   nkeys.KeyPair
	mediator nkeys.KeyPair
}

// newTakeover returns fresh keys and a fresh takeover id for run at epoch and token.
func (env *runEnv) newTakeover(runID string, epoch, token uint64) *takeover {
	env.t.Helper()
	d, m := mustKey(env.t), mustKey(env.t)
	id := make([]byte, 8)
	if _, err := rand.Read(id); err != nil {
		env.t.Fatal(err)
	}
	return &takeover{driver: d, mediator: m, attempt: client.Attempt{RunID: runID, TakeoverID: hex.EncodeToString(id),
		Epoch: epoch, FencingToken: token, DriverID: pubOf(env.t, d), MediatorID: pubOf(env.t, m)}}
}

// attempt asks for tk's credentials.
func (env *runEnv) attempt(tk *takeover) (*client.RunMaterial, error) {
	return env.cli.Attempt(env.ctx(), env.m.Manager, env.cur, tk.attempt)
}

// mustAttempt asks for tk's credentials and fails the test unless they come.
func (env *runEnv) mustAttempt(tk *takeover) *client.RunMaterial {
	env.t.Helper()
	rm, err := env.attempt(tk)
	if err != nil {
		env.t.Fatalf("attempt %d/%d: %v", tk.attempt.Epoch, tk.attempt.FencingToken, err)
	}
	return rm
}

// driver connects as the run's driver with the credential rm carries and tk's seed, and
// returns its client.
func (env *runEnv) driver(rm *client.RunMaterial, tk *takeover, opts ...nats.Option) *client.Client {
	env.t.Helper()
	return env.runUser(rm.RunID, rm.Credentials["driver"].JWT, tk.driver, opts...)
}

// runUser connects as the run's principal with jwt and kp.
func (env *runEnv) runUser(runID, jwt string, kp nkeys.KeyPair, opts ...nats.Option) *client.Client {
	env.t.Helper()
	seed, err := kp.Seed()
	if err != nil {
		env.t.Fatal(err)
	}
	actor := subjects.RunActor(runID)
	c, err := client.Connect(env.p.NATSURL(), testSpace, ownerA, actor, append([]nats.Option{nats.UserJWTAndSeed(jwt, string(seed)), nats.MaxReconnects(0)}, opts...)...)
	if err != nil {
		env.t.Fatalf("connect as %s: %v", subjects.Principal(ownerA, actor), err)
	}
	env.t.Cleanup(c.Close)
	return c
}

// report reports state for rm's hold from its driver d.
func (env *runEnv) report(d *client.Client, rm *client.RunMaterial, state string) (*client.StatusReply, error) {
	return d.ReportStatus(env.ctx(), client.RunStatus{RunID: rm.RunID, State: state, Holder: rm.Hold.Holder,
		Epoch: rm.Hold.Epoch, FencingToken: rm.Hold.FencingToken})
}

// running takes over a new admitted run at (1,1) and has its driver report running.
func (env *runEnv) running() (*client.RunMaterial, *takeover, *client.Client) {
	env.t.Helper()
	tk := env.newTakeover(env.admitted(), 1, 1)
	rm := env.mustAttempt(tk)
	d := env.driver(rm, tk)
	if _, err := env.report(d, rm, client.RunRunning); err != nil {
		env.t.Fatalf("report running: %v", err)
	}
	return rm, tk, d
}

// renewDriver renews rm's hold.
func (env *runEnv) renewDriver(hold client.RunHold) (*client.RunMaterial, error) {
	return env.cli.RenewRunDriver(env.ctx(), env.m.Manager, env.cur, hold)
}

// wantRefusal checks err is a refusal with code whose message contains text.
func wantRefusal(t testing.TB, err error, code, text string) {
	t.Helper()
	var r *client.Refusal
	if !errors.As(err, &r) || r.Code != code || !containsFold(r.Message, text) {
		t.Fatalf("got %v, want %s containing %q", err, code, text)
	}
}

func mustKey(t testing.TB) nkeys.KeyPair {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	return kp
}

func pubOf(t testing.TB, kp nkeys.KeyPair) string {
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
