package process

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/platform/space"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

func TestBinaryServesHealthCredsGrantAndMicroInfoThenStopsCleanlyOnSIGTERM(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	proc := harness.StartAuthplane(t, "serve", "--dir", dir, "--nats-port", "0", "--http-port", "0", "--workers", "3")
	info := harness.WaitReady(t, proc, dir)

	t.Run("auth-service.json says where the plane is", func(t *testing.T) {
		if info.Ver != 1 || info.PID != proc.Cmd.Process.Pid || !strings.HasPrefix(info.URL, "http://127.0.0.1:") ||
			!strings.HasPrefix(info.NATSURL, "nats://127.0.0.1:") || info.SpaceDir != filepath.Join(dir, "space") {
			t.Errorf("auth-service.json: got %+v, want ver 1, pid %d, loopback URLs and space dir %s", info, proc.Cmd.Process.Pid, filepath.Join(dir, "space"))
		}
		if c, err := hex.DecodeString(info.Cap); err != nil || len(c) < 32 {
			t.Errorf("auth-service.json cap: got %q, want at least 32 random bytes in hex", info.Cap)
		}
		fi, err := os.Stat(filepath.Join(dir, admin.ServiceInfoFile))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("auth-service.json: got mode %o, want 600", fi.Mode().Perm())
		}
		testkit.CheckFor(t, 5*time.Second, 25*time.Millisecond, func() error {
			if out := proc.Stdout.String(); !strings.Contains(out, info.NATSURL) || !strings.Contains(out, "micro info "+subjects.ServiceName) {
				return fmt.Errorf("stdout %q: want the nats URL %s and a `nats micro info` command to try", out, info.NATSURL)
			}
			return nil
		})
	})

	t.Run("GET /health answers ok with the issuer", func(t *testing.T) {
		resp, err := http.Get(info.URL + "/health")
		if err != nil {
			t.Fatal(err)
		}
		raw := harness.ReadBody(t, resp)
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET /health: got status %d, want 200", resp.StatusCode)
		}
		var got map[string]any
		if err := json.Unmarshal(raw, &got); err != nil {
			t.Fatalf("GET /health body %q: %v", raw, err)
		}
		if want := map[string]any{"ok": true, "issuer": "urn:cotal:auth:default"}; !reflect.DeepEqual(got, want) {
			t.Errorf("GET /health: got %s, want %v", raw, want)
		}
	})

	t.Run("a creds file connects and lists the five endpoints in $SRV.INFO", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "cli.creds")
		if code, stdout, stderr := harness.RunAuthplane(t, 30*time.Second, "creds", "--dir", dir, "--role", "ops", "--owner", harness.OwnerA, "--actor", "cli", "--out", out); code != 0 {
			t.Fatalf("authplane creds: exit %d, want 0\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
		}
		fi, err := os.Stat(out)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("creds file: got mode %o, want 600", fi.Mode().Perm())
		}
		nc := harness.ConnectCreds(t, info.NATSURL, out, harness.OwnerA, "cli")
		instances := harness.ServiceInstances(t, nc)
		if len(instances) == 0 || !subjects.ValidUID(instances[0].Metadata["instance"]) {
			t.Fatalf("$SRV.INFO: got %v, want answers naming an instance id", instances)
		}
		checkInstances(t, instances, instances[0].Metadata["instance"], 0)
	})

	t.Run("the stock nats CLI lists the service with a creds file and the inbox prefix", func(t *testing.T) {
		natsCLI, err := exec.LookPath("nats")
		if err != nil {
			t.Skip("the nats CLI is not on PATH")
		}
		out := filepath.Join(t.TempDir(), "cli.creds")
		if code, _, stderr := harness.RunAuthplane(t, 30*time.Second, "creds", "--dir", dir, "--role", "ops", "--owner", harness.OwnerA, "--actor", "cli", "--out", out); code != 0 {
			t.Fatalf("authplane creds: exit %d, want 0\nstderr:\n%s", code, stderr)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, natsCLI, "--server", info.NATSURL, "--creds", out,
			"--inbox-prefix", subjects.InboxPrefix(harness.OwnerA, "cli"), "micro", "info", subjects.ServiceName, "--json")
		cmd.Env = append(os.Environ(), "HOME="+t.TempDir(), "XDG_CONFIG_HOME="+t.TempDir()) // no saved contexts
		raw, err := harness.Output(cmd)
		if err != nil {
			t.Fatalf("nats micro info: %v\n%s", err, raw)
		}
		var got struct {
			Info micro.Info `json:"info"`
		}
		if err := json.Unmarshal(raw, &got); err != nil {
			t.Fatalf("nats micro info --json %q: %v", raw, err)
		}
		checkFiveEndpoints(t, got.Info)
	})

	t.Run("grant writes a ledger row readable in the actors bucket", func(t *testing.T) {
		code, stdout, stderr := harness.RunAuthplane(t, 30*time.Second, "grant", "--dir", dir, "--owner", harness.OwnerB, "--actor", "ops", "--scope", "supervise, admin")
		if code != 0 {
			t.Fatalf("authplane grant: exit %d, want 0\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
		}
		m, err := (admin.Locate{SpaceDir: info.SpaceDir}).Keys()
		if err != nil {
			t.Fatal(err)
		}
		_, js := harness.PlaneConn(t, m, info.NATSURL)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		kv, err := js.KeyValue(ctx, subjects.ActorsBucket(harness.TestSpace))
		if err != nil {
			t.Fatal(err)
		}
		e, err := kv.Get(ctx, subjects.ActorKey(harness.OwnerB, "ops"))
		if err != nil {
			t.Fatalf("ledger row %s: %v; want the granted row", subjects.ActorKey(harness.OwnerB, "ops"), err)
		}
		var row struct {
			V         int      `json:"v"`
			Owner     string   `json:"owner"`
			Actor     string   `json:"actor"`
			Scope     []string `json:"scope"`
			GrantedAt int64    `json:"grantedAt"`
		}
		if err := json.Unmarshal(e.Value(), &row); err != nil {
			t.Fatalf("ledger row %s: %v", e.Value(), err)
		}
		if want := []string{"admin", "supervise"}; !slices.Equal(row.Scope, want) {
			t.Errorf("ledger row scope: got %v, want %v", row.Scope, want)
		}
		if row.V != 1 || row.Owner != harness.OwnerB || row.Actor != "ops" || row.GrantedAt == 0 {
			t.Errorf("ledger row: got %+v, want v 1, %s.ops and a grant time", row, harness.OwnerB)
		}
	})

	t.Run("owner, agent and keys: a subject's owner, an agent's secret, the bearer keys' rotation", func(t *testing.T) {
		m, err := (admin.Locate{SpaceDir: info.SpaceDir}).Keys()
		if err != nil {
			t.Fatal(err)
		}
		code, stdout, stderr := harness.RunAuthplane(t, 30*time.Second, "owner", "--dir", dir, "--issuer", "https://idp.example", "--sub", "alice")
		if want, _ := admin.Owner(m, "https://idp.example", "alice"); code != 0 || strings.TrimSpace(stdout) != want {
			t.Errorf("authplane owner: exit %d, stdout %q, want 0 and %s\nstderr:\n%s", code, stdout, want, stderr)
		}

		secretFile := filepath.Join(t.TempDir(), "worker.secret")
		if code, stdout, stderr := harness.RunAuthplane(t, 30*time.Second, "agent", "--dir", dir, "--owner", harness.OwnerA, "--actor", "worker", "--out", secretFile); code != 0 {
			t.Fatalf("authplane agent: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
		} else if !strings.Contains(stdout, "reusable") {
			t.Errorf("authplane agent: stdout %q, want it to say the secret is reusable", stdout)
		}
		fi, err := os.Stat(secretFile)
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("the agent's secret file: %v, mode %v, want 0600", err, fi.Mode().Perm())
		}
		secret, err := os.ReadFile(secretFile)
		if err != nil {
			t.Fatal(err)
		}
		// The secret is reusable: the agent exchanges it for each bearer.
		for i := range 2 {
			r := harness.Post(t, info.URL+"/exchange", map[string]any{"owner": harness.OwnerA, "actor": "worker", "actorToken": strings.TrimSpace(string(secret))}, "Authorization", "Bearer "+info.Cap)
			if r.Status != http.StatusOK || r.Field("token") == "" {
				t.Fatalf("the agent's exchange %d: got %d %s, want a bearer", i+1, r.Status, r.Body)
			}
		}
		if code, stdout, stderr := harness.RunAuthplane(t, 30*time.Second, "agent", "--dir", dir, "--owner", harness.OwnerA, "--actor", "worker", "--revoke"); code != 0 {
			t.Fatalf("authplane agent --revoke: exit %d\nstderr:\n%s", code, stderr)
		} else if !strings.Contains(stdout, "closed 0 live connections") {
			t.Errorf("authplane agent --revoke: stdout %q, want the live connections it closed (none)", stdout)
		}
		r := harness.Post(t, info.URL+"/exchange", map[string]any{"owner": harness.OwnerA, "actor": "worker", "actorToken": strings.TrimSpace(string(secret))}, "Authorization", "Bearer "+info.Cap)
		if r.Status != http.StatusUnauthorized {
			t.Errorf("a revoked agent's exchange: got %d %s, want 401", r.Status, r.Body)
		}

		kids := func() []string {
			t.Helper()
			code, stdout, stderr := harness.RunAuthplane(t, 30*time.Second, "keys", "list", "--dir", dir)
			if code != 0 {
				t.Fatalf("authplane keys list: exit %d\nstderr:\n%s", code, stderr)
			}
			var out []string
			for _, line := range strings.Split(strings.TrimSpace(stdout), "\n") {
				out = append(out, strings.Fields(line)[0])
			}
			return out
		}
		before := kids()
		if code, stdout, stderr := harness.RunAuthplane(t, 30*time.Second, "keys", "rotate", "--dir", dir); code != 0 || !strings.Contains(stdout, "rotated") {
			t.Fatalf("authplane keys rotate: exit %d, stdout %q\nstderr:\n%s", code, stdout, stderr)
		}
		after := kids()
		if len(before) != 1 || len(after) != 2 || after[0] != before[0] {
			t.Fatalf("keys list: got %v then %v, want one key, then it and a new one", before, after)
		}
		jwks := harness.Get(t, info.URL+"/jwks")
		for _, kid := range after {
			if !strings.Contains(string(jwks.Body), kid) {
				t.Errorf("/jwks after a rotation: %s, want kid %s published", jwks.Body, kid)
			}
		}
		code, _, stderr = harness.RunAuthplane(t, 30*time.Second, "keys", "retire", before[0], "--dir", dir)
		if code != 1 || !strings.Contains(stderr, "retire floor") {
			t.Errorf("authplane keys retire of a key that just stopped signing: exit %d, stderr %q, want 1 naming the retire floor", code, stderr)
		}
		if code, _, _ := harness.RunAuthplane(t, 30*time.Second, "keys", "retire", "--dir", dir); code != 2 {
			t.Errorf("authplane keys retire without a kid: exit %d, want 2 (usage)", code)
		}
	})

	t.Run("a second serve on the same dir exits non-zero naming the holder's pid", func(t *testing.T) {
		code, _, stderr := harness.RunAuthplane(t, 30*time.Second, "serve", "--dir", dir, "--nats-port", "0", "--http-port", "0")
		if code == 0 {
			t.Errorf("second serve: exit 0, want non-zero")
		}
		if want := fmt.Sprintf("in use by pid %d", proc.Cmd.Process.Pid); !strings.Contains(stderr, want) {
			t.Errorf("second serve stderr: got %q, want it to contain %q", stderr, want)
		}
		if strings.Contains(stderr, "panic") {
			t.Errorf("second serve stderr: got a panic, want one clear error:\n%s", stderr)
		}
	})

	if err := proc.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := proc.Wait(t, 15*time.Second); code != 0 {
		t.Errorf("serve after SIGTERM: exit %d, want 0\nstderr:\n%s", code, proc.Stderr.String())
	}
	if _, err := os.Stat(filepath.Join(dir, admin.ServiceInfoFile)); !os.IsNotExist(err) {
		t.Errorf("after SIGTERM: stat auth-service.json: %v, want it removed", err)
	}
}

func TestBinaryServeRefusesAPortInUseNamingItsFlag(t *testing.T) {
	t.Parallel()
	tests := []struct {
		flag string
		// attempts: the HTTP face opens after the plane registered and started watching its
		// gate, so its failure unwinds a running watch; repeat it to catch a racy unwind.
		attempts int
	}{
		{"--nats-port", 1},
		{"--http-port", 10},
	}
	for _, tt := range tests {
		t.Run(tt.flag, func(t *testing.T) {
			t.Parallel()
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
			args := map[string]string{"--nats-port": "0", "--http-port": "0"}
			args[tt.flag] = port
			for attempt := 1; attempt <= tt.attempts && !t.Failed(); attempt++ {
				dir := t.TempDir()
				code, _, stderr := harness.RunAuthplane(t, 30*time.Second, "serve", "--dir", dir, "--nats-port", args["--nats-port"], "--http-port", args["--http-port"])
				if code != 1 {
					t.Errorf("attempt %d: serve %s %s (in use): exit %d, want 1", attempt, tt.flag, port, code)
				}
				if want := tt.flag + " " + port; !strings.Contains(stderr, want) {
					t.Errorf("attempt %d: serve stderr: got %q, want it to name %q", attempt, stderr, want)
				}
				if strings.Contains(stderr, "panic") {
					t.Errorf("attempt %d: serve stderr: got a panic, want one clear error:\n%s", attempt, stderr)
				}
				if _, err := os.Stat(filepath.Join(dir, admin.ServiceInfoFile)); !os.IsNotExist(err) {
					t.Errorf("attempt %d: after the refused serve: stat auth-service.json: %v, want none", attempt, err)
				}
			}
		})
	}
}

func TestBinaryInitWritesAConfigThatNATSServerAcceptsAndAPlaneServesOn(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	spaceDir := filepath.Join(root, "space")
	args := []string{"init", "--space", "demo", "--space-dir", spaceDir, "--server-store", filepath.Join(root, "nats"), "--listen", "127.0.0.1:-1"}
	code, stdout, stderr := harness.RunAuthplane(t, 30*time.Second, args...)
	if code != 0 {
		t.Fatalf("authplane init: exit %d, want 0\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	m, err := space.Load(spaceDir)
	if err != nil {
		t.Fatalf("load the material init wrote: %v", err)
	}
	if m.Space != "demo" {
		t.Errorf("init material: got space %q, want demo", m.Space)
	}
	err = filepath.WalkDir(spaceDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Name() == "identity.json" {
			t.Errorf("init wrote %s, want no instance identity", path)
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir() && fi.Mode().Perm() != 0o700:
			t.Errorf("%s: got mode %o, want 700", path, fi.Mode().Perm())
		case !d.IsDir() && d.Name() != "nats-server.conf" && fi.Mode().Perm() != 0o600:
			t.Errorf("%s: got mode %o, want 600", path, fi.Mode().Perm())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	srv := harness.RunServerConf(t, filepath.Join(spaceDir, "nats-server.conf"))
	p := harness.StartPlane(t, func(c *service.Config) { c.NATSURL, c.SpaceDir, c.Space = srv.ClientURL(), spaceDir, "demo" })
	checkInstances(t, harness.ServiceInstances(t, harness.OpsConn(t, p, harness.OwnerA, "ops")), p.InstanceID(), 0)

	// A second init reuses the material and never overwrites it.
	code, stdout, stderr = harness.RunAuthplane(t, 30*time.Second, args...)
	if code != 0 {
		t.Fatalf("second authplane init: exit %d, want 0\nstderr:\n%s", code, stderr)
	}
	if !strings.Contains(stdout, "reused") {
		t.Errorf("second init stdout: got %q, want it to say the material was reused", stdout)
	}
	again, err := space.Load(spaceDir)
	if err != nil {
		t.Fatal(err)
	}
	if again.Data.Public() != m.Data.Public() || again.OperatorJWT != m.OperatorJWT {
		t.Errorf("second init: the material changed, want it kept")
	}
}

func TestBinaryFencedServeExitsNonZero(t *testing.T) {
	t.Parallel()
	s := harness.StartStandalone(t, harness.TestSpace)
	dirA, dirB := t.TempDir(), t.TempDir()
	proc := harness.StartAuthplane(t, "serve", "--nats-url", s.URL(), "--space-dir", s.SpaceDir, "--dir", dirA, "--http-port", "0", "--workers", "1")
	harness.WaitReady(t, proc, dirA)

	harness.CopyIdentity(t, dirA, dirB)
	b := harness.StartPlane(t, func(c *service.Config) { harness.AgainstStandalone(s)(c); c.Dir = dirB })
	if got := b.Epoch(); got != 1 {
		t.Errorf("plane B: got epoch %d, want 1", got)
	}
	if code := proc.Wait(t, 5*time.Second); code == 0 {
		t.Errorf("fenced serve: exit 0, want non-zero")
	}
	if stderr := proc.Stderr.String(); !strings.Contains(stderr, "fenced") {
		t.Errorf("fenced serve stderr: got %q, want it to say it was fenced", stderr)
	}
	if _, err := os.Stat(filepath.Join(dirA, admin.ServiceInfoFile)); !os.IsNotExist(err) {
		t.Errorf("fenced serve: stat auth-service.json: %v, want it removed", err)
	}
}
