// Package integration holds the plane's black-box tests: a real nats-server in process (port
// -1, temp dirs), real credentials the server must accept, real clients.
package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/internal/instance"
	"github.com/cotal-ai/authplane/internal/space"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// Two test owners, `u_` followed by 26 base32-lower characters.
const (
	ownerA = "u_aaaaaaaaaaaaaaaaaaaaaaaaaa"
	ownerB = "u_bbbbbbbbbbbbbbbbbbbbbbbbbb"
)

// testSpace is the space every test serves unless it says otherwise.
const testSpace = "default"

// testLogging reports whether AUTHPLANE_TEST_LOG=1 asks for the plane's and servers' logs.
func testLogging() bool { return os.Getenv("AUTHPLANE_TEST_LOG") == "1" }

// testLogger discards everything unless AUTHPLANE_TEST_LOG=1, then writes text to stderr.
func testLogger(t testing.TB) *slog.Logger {
	if !testLogging() {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
}

// testConfig is the configuration every test plane starts from: an embedded broker on a free
// port, a free HTTP port, a fresh state directory and two workers per endpoint.
func testConfig(t testing.TB) service.Config {
	cfg := service.Defaults()
	cfg.Dir = t.TempDir()
	cfg.NATSPort = 0
	cfg.HTTPPort = 0
	cfg.Workers = 2
	cfg.Logger = testLogger(t)
	return cfg
}

// startPlane starts a plane from testConfig changed by mutate (which may be nil) and closes it
// when the test ends. A plane that was fenced reports service.ErrFenced from Close; that is
// its expected end, not a failure.
func startPlane(t testing.TB, mutate func(*service.Config)) *service.Plane {
	t.Helper()
	cfg := testConfig(t)
	if mutate != nil {
		mutate(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := service.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("start plane: %v", err)
	}
	t.Cleanup(func() { closePlane(t, p) })
	return p
}

// tryStart runs service.Start on cfg, for tests that expect it to refuse. A panic inside
// Start is a failure of the test (a refused start must return an error), reported and turned
// into an error so the rest of the package still runs.
func tryStart(t testing.TB, cfg service.Config) (p *service.Plane, err error) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			var where []string
			for _, line := range strings.Split(string(debug.Stack()), "\n") {
				if fn, ok := strings.CutPrefix(strings.TrimSpace(line), "github.com/cotal-ai/authplane/"); ok && strings.HasPrefix(fn, "service.") {
					if i := strings.LastIndex(fn, "("); i > 0 {
						fn = fn[:i]
					}
					where = append(where, fn)
				}
			}
			t.Errorf("service.Start panicked instead of returning its error: %v (in %s)", r, strings.Join(where, " <- "))
			p, err = nil, fmt.Errorf("service.Start panicked: %v", r)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return service.Start(ctx, cfg)
}

// closePlane closes p and reports any error but the fence.
func closePlane(t testing.TB, p *service.Plane) {
	t.Helper()
	if err := p.Close(); err != nil && !errors.Is(err, service.ErrFenced) {
		t.Errorf("close plane: %v", err)
	}
}

// writeCallerCreds writes a caller `.creds` file for owner.actor, valid for an hour.
func writeCallerCreds(t testing.TB, m *space.Material, owner, actor string) string {
	t.Helper()
	creds, err := service.CallerCreds(m, owner, actor, time.Hour, time.Now())
	if err != nil {
		t.Fatalf("caller creds for %s: %v", subjects.Principal(owner, actor), err)
	}
	path := filepath.Join(t.TempDir(), owner+"."+actor+".creds")
	if err := os.WriteFile(path, creds, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// callerConn connects to p's broker as principal owner.actor with a caller credential (what
// `authplane creds` writes) and the principal's inbox prefix; it closes when the test ends.
func callerConn(t testing.TB, p *service.Plane, owner, actor string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	return connectCreds(t, p.NATSURL(), writeCallerCreds(t, p.Material(), owner, actor), owner, actor, opts...)
}

// connectCreds connects to url with the .creds file at path and owner.actor's inbox prefix.
func connectCreds(t testing.TB, url, path, owner, actor string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	all := append([]nats.Option{
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

// grant writes owner.actor's ledger row with exactly scope, as `authplane grant` does.
func grant(t testing.TB, p *service.Plane, owner, actor string, scope ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := service.Grant(ctx, p.Material(), p.NATSURL(), owner, actor, scope); err != nil {
		t.Fatalf("grant %v to %s: %v", scope, subjects.Principal(owner, actor), err)
	}
}

// checkFor calls fn every `every` until it returns nil, and fails the test with fn's last
// error if that has not happened within total. Poll; never sleep and hope.
func checkFor(t testing.TB, total, every time.Duration, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(total)
	var err error
	for {
		if err = fn(); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not true within %s: %v", total, err)
		}
		time.Sleep(every)
	}
}

// asyncErrors collects a connection's asynchronous errors (permissions violations arrive
// this way).
type asyncErrors struct {
	mu   sync.Mutex
	errs []error
}

// option installs the collector as a connection's error handler.
func (a *asyncErrors) option() nats.Option {
	return nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.errs = append(a.errs, err)
	})
}

// violation returns the collected permissions violation that names subject, if any.
func (a *asyncErrors) violation(subject string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, err := range a.errs {
		if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), `"`+subject+`"`) {
			return err
		}
	}
	return nil
}

// all returns every collected error.
func (a *asyncErrors) all() []error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]error(nil), a.errs...)
}

// waitViolation waits until the broker has reported a permissions violation for op ("Publish"
// or "Subscription") on subject.
func (a *asyncErrors) waitViolation(t testing.TB, op, subject string) {
	t.Helper()
	checkFor(t, 3*time.Second, 10*time.Millisecond, func() error {
		err := a.violation(subject)
		if err == nil {
			return fmt.Errorf("got no permissions violation for %s to %q (errors so far: %v), want one", op, subject, a.all())
		}
		if !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(op)) {
			return fmt.Errorf("got %q, want a violation for %s", err, op)
		}
		return nil
	})
}

// collect publishes a request on subject with nc's own inbox as the reply and gathers every
// reply that arrives within window: several service instances may answer one `$SRV` request.
func collect(t testing.TB, nc *nats.Conn, subject string, data []byte, window time.Duration) []*nats.Msg {
	t.Helper()
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatalf("subscribe %s: %v", inbox, err)
	}
	defer func() {
		if err := sub.Unsubscribe(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			t.Errorf("unsubscribe %s: %v", inbox, err)
		}
	}()
	if err := nc.PublishRequest(subject, inbox, data); err != nil {
		t.Fatalf("request %s: %v", subject, err)
	}
	var out []*nats.Msg
	deadline := time.Now().Add(window)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return out
		}
		m, err := sub.NextMsg(left)
		if errors.Is(err, nats.ErrTimeout) {
			return out
		}
		if err != nil {
			t.Fatalf("reply to %s: %v", subject, err)
		}
		out = append(out, m)
	}
}

// serviceInfo asks `$SRV.INFO.cotal-auth` and returns the one answer; the test fails on any
// other number of answers than one.
func serviceInfo(t testing.TB, nc *nats.Conn) micro.Info {
	t.Helper()
	msg, err := nc.Request("$SRV.INFO."+subjects.ServiceName, nil, 5*time.Second)
	if err != nil {
		t.Fatalf("$SRV.INFO.%s: %v", subjects.ServiceName, err)
	}
	var info micro.Info
	if err := json.Unmarshal(msg.Data, &info); err != nil {
		t.Fatalf("decode $SRV.INFO answer %q: %v", msg.Data, err)
	}
	return info
}

// serviceStats asks `$SRV.STATS.cotal-auth` and returns the one answer.
func serviceStats(t testing.TB, nc *nats.Conn) micro.Stats {
	t.Helper()
	msg, err := nc.Request("$SRV.STATS."+subjects.ServiceName, nil, 5*time.Second)
	if err != nil {
		t.Fatalf("$SRV.STATS.%s: %v", subjects.ServiceName, err)
	}
	var stats micro.Stats
	if err := json.Unmarshal(msg.Data, &stats); err != nil {
		t.Fatalf("decode $SRV.STATS answer %q: %v", msg.Data, err)
	}
	return stats
}

// endpointCounters sums the plane's own counters (data.dropped, data.throttled) and micro's
// request and error counts over every registered copy of endpoint.
type endpointCounters struct {
	Dropped, Throttled uint64
	Requests, Errors   int
}

func counters(t testing.TB, nc *nats.Conn, endpoint string) endpointCounters {
	t.Helper()
	var c endpointCounters
	copies := 0
	for _, e := range serviceStats(t, nc).Endpoints {
		if e.Name != endpoint {
			continue
		}
		copies++
		var d struct {
			Dropped   uint64 `json:"dropped"`
			Throttled uint64 `json:"throttled"`
		}
		if len(e.Data) > 0 {
			if err := json.Unmarshal(e.Data, &d); err != nil {
				t.Fatalf("decode stats data %q of %s: %v", e.Data, endpoint, err)
			}
		}
		c.Dropped += d.Dropped
		c.Throttled += d.Throttled
		c.Requests += e.NumRequests
		c.Errors += e.NumErrors
	}
	if copies == 0 {
		t.Fatalf("got no stats for endpoint %s, want its copies", endpoint)
	}
	return c
}

// standalone is a nats-server the plane does not run, configured from the space material the
// way `authplane init` configures one.
type standalone struct {
	srv      *server.Server
	material *space.Material
	spaceDir string
	conf     string
}

// URL is the server's client URL.
func (s *standalone) URL() string { return s.srv.ClientURL() }

// startStandalone creates space material for spaceName, writes its nats-server.conf with
// Material.ServerConf (what `authplane init` writes) listening on 127.0.0.1:-1, and runs a real
// nats-server from that file. It doubles as the check that init's config is accepted.
func startStandalone(t testing.TB, spaceName string) *standalone {
	t.Helper()
	root := t.TempDir()
	spaceDir := filepath.Join(root, "space")
	m, err := space.Create(spaceDir, spaceName)
	if err != nil {
		t.Fatalf("create space material: %v", err)
	}
	conf := filepath.Join(spaceDir, "nats-server.conf")
	if err := os.WriteFile(conf, []byte(m.ServerConf(filepath.Join(root, "nats"), "127.0.0.1:-1")), 0o644); err != nil {
		t.Fatal(err)
	}
	s := &standalone{material: m, spaceDir: spaceDir, conf: conf}
	s.srv = runServerConf(t, conf)
	return s
}

// runServerConf runs a nats-server from the configuration file conf, the way `nats-server -c`
// would, and shuts it down when the test ends.
func runServerConf(t testing.TB, conf string) *server.Server {
	t.Helper()
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("nats-server refuses %s: %v", conf, err)
	}
	if opts.Host != "127.0.0.1" || opts.Port != server.RANDOM_PORT {
		t.Fatalf("got listen %s:%d from %s, want 127.0.0.1:-1", opts.Host, opts.Port, conf)
	}
	opts.NoSigs = true
	opts.NoLog = !testLogging()
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("nats-server from %s: %v", conf, err)
	}
	if testLogging() {
		srv.ConfigureLogger()
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		t.Fatalf("nats-server from %s did not become ready", conf)
	}
	t.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	return srv
}

// againstStandalone points a plane's configuration at s: no embedded broker, s's material.
func againstStandalone(s *standalone) func(*service.Config) {
	return func(c *service.Config) {
		c.NATSURL = s.URL()
		c.SpaceDir = s.spaceDir
		c.Space = s.material.Space
	}
}

// The authplane binary, built once per test run.

var (
	binOnce sync.Once
	binPath string
	binErr  error
	binDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		if err := os.RemoveAll(binDir); err != nil {
			fmt.Fprintf(os.Stderr, "remove %s: %v\n", binDir, err)
		}
	}
	os.Exit(code)
}

// authplaneBinary builds ./cmd/authplane once and returns its path.
func authplaneBinary(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		out, err := exec.Command("go", "env", "GOMOD").Output()
		if err != nil {
			binErr = fmt.Errorf("go env GOMOD: %w", err)
			return
		}
		gomod := strings.TrimSpace(string(out))
		if gomod == "" || gomod == os.DevNull {
			binErr = errors.New("go env GOMOD: not inside the module")
			return
		}
		if binDir, binErr = os.MkdirTemp("", "authplane-bin-"); binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "authplane")
		cmd := exec.Command("go", "build", "-o", binPath, "./cmd/authplane")
		cmd.Dir = filepath.Dir(gomod)
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build ./cmd/authplane: %w\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// syncBuffer is a bytes.Buffer a running process writes while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// process is a running authplane command.
type process struct {
	cmd    *exec.Cmd
	stdout syncBuffer
	stderr syncBuffer
	done   chan struct{}
	err    error
}

// startAuthplane starts the binary with args; it is killed when the test ends if still running.
func startAuthplane(t testing.TB, args ...string) *process {
	t.Helper()
	return startAuthplaneIn(t, "", args...)
}

// startAuthplaneIn is startAuthplane with working directory dir ("" = the test's).
func startAuthplaneIn(t testing.TB, dir string, args ...string) *process {
	t.Helper()
	p := &process{done: make(chan struct{})}
	p.cmd = exec.Command(authplaneBinary(t), args...)
	p.cmd.Dir = dir
	p.cmd.Stdout = &p.stdout
	p.cmd.Stderr = io.MultiWriter(&p.stderr, logSink())
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start authplane %v: %v", args, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			if err := p.cmd.Process.Kill(); err != nil {
				t.Errorf("kill authplane %v: %v", args, err)
			}
			<-p.done
		}
	})
	return p
}

// logSink is where a child's stderr is copied besides the test's buffer.
func logSink() io.Writer {
	if testLogging() {
		return os.Stderr
	}
	return io.Discard
}

// wait waits up to timeout for the process to exit and returns its exit code.
func (p *process) wait(t testing.TB, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("authplane %v still running after %s\nstderr:\n%s", p.cmd.Args[1:], timeout, p.stderr.String())
	}
	var exit *exec.ExitError
	switch {
	case p.err == nil:
		return 0
	case errors.As(p.err, &exit):
		return exit.ExitCode()
	}
	t.Fatalf("authplane %v: %v", p.cmd.Args[1:], p.err)
	return -1
}

// runAuthplane runs the binary with args to completion and returns its exit code and output.
func runAuthplane(t testing.TB, timeout time.Duration, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	p := startAuthplane(t, args...)
	code = p.wait(t, timeout)
	return code, p.stdout.String(), p.stderr.String()
}

// readServiceInfo waits until dir holds auth-service.json (the readiness signal) and returns it.
func readServiceInfo(t testing.TB, dir string, within time.Duration) service.ServiceInfo {
	t.Helper()
	var info service.ServiceInfo
	checkFor(t, within, 25*time.Millisecond, func() error {
		raw, err := os.ReadFile(filepath.Join(dir, service.ServiceInfoFile))
		if err != nil {
			return err
		}
		return json.Unmarshal(raw, &info)
	})
	return info
}

// planeConn connects to url as a short-lived plane-account user (where the plane's buckets and
// streams live) and returns the connection and its JetStream context; it closes when the test
// ends.
func planeConn(t testing.TB, m *space.Material, url string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := service.ConnectPlaneAccount(m, url, "test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// newUserKey returns a fresh public user nkey.
func newUserKey(t testing.TB) string { return newKey(t, nkeys.CreateUser) }

// newAccountKey returns a fresh public account nkey.
func newAccountKey(t testing.TB) string { return newKey(t, nkeys.CreateAccount) }

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

// copyIdentity copies the plane identity in dir from into dir to, as an operator copying a
// state directory to a second host would.
func copyIdentity(t testing.TB, from, to string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(from, instance.IdentityFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(to, instance.IdentityFile), raw, 0o600); err != nil {
		t.Fatal(err)
	}
}

// readBody reads and closes an HTTP response's body.
func readBody(t testing.TB, resp *http.Response) []byte {
	t.Helper()
	raw, err := io.ReadAll(resp.Body)
	if cerr := resp.Body.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	return raw
}
