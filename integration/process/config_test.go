package process

import (
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/integration/internal/harness"
)

// secret is a password a URL carries in these tests: it must never be shown.
const secret = "hunter2-x9"

// runWithEnv runs the binary with args and env added to the test's environment.
func runWithEnv(t *testing.T, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	p := harness.StartAuthplaneEnv(t, "", env, args...)
	code = p.Wait(t, 30*time.Second)
	return code, p.Stdout.String(), p.Stderr.String()
}

// A table of bad flag and environment combinations: each problem is reported, all of them at
// once, before anything starts, and none shows a secret.
func TestServeReportsEveryConfigurationProblemAtOnceAndNoSecret(t *testing.T) {
	t.Parallel()
	secretURL := "nats://ops:" + secret + "@127.0.0.1:1"
	tests := []struct {
		name string
		args []string
		env  []string
		want []string
	}{
		{"bad flags", []string{"--replicas", "2", "--workers", "0", "--space", "Bad Space", "--max-connections-per-owner", "3"}, nil,
			[]string{"--replicas 2", "--workers 0", `--space "Bad Space"`, "--max-connections-per-owner 3"}},
		{"bad variables", nil, []string{"AUTHPLANE_REPLICAS=4", "AUTHPLANE_REQUEST_TIMEOUT=soon", "AUTHPLANE_LOG_FORMAT=xml"},
			[]string{"--replicas 4", `AUTHPLANE_REQUEST_TIMEOUT "soon"`, `--log-format "xml"`}},
		{"values that do not parse, flags and variables", []string{"--rate", "fast", "--plane-user-ttl=forever"}, []string{"AUTHPLANE_BURST=lots", "AUTHPLANE_MAX_PAYLOAD=1e3x"},
			[]string{`--rate "fast"`, `--plane-user-ttl "forever"`, `AUTHPLANE_BURST "lots"`, `AUTHPLANE_MAX_PAYLOAD "1e3x"`}},
		{"a kv identity without a name, and a secret URL that does not parse", []string{"--identity-store", "kv"}, []string{"AUTHPLANE_NATS_URL=nats://ops:" + secret + "@:x/"},
			[]string{`--instance-name ""`, "--nats-url", "REDACTED"}},
		{"a name without a kv identity, a secret URL and bad limits", []string{"--instance-name", "plane1", "--max-connections", "1", "--audit-records", "0"},
			[]string{"AUTHPLANE_NATS_URL=" + secretURL, "AUTHPLANE_WITNESS_BYTES=10", "AUTHPLANE_WITNESS_RUNS=0"},
			[]string{`--instance-name "plane1"`, "--max-connections 1", "--witness-bytes 10", "--witness-runs 0", "--audit-records 0"}},
		{"a flag wins over a good variable, and is still checked", []string{"--standing-ttl", "1s"}, []string{"AUTHPLANE_STANDING_TTL=1h", "AUTHPLANE_MAX_ASSIGNMENT_TTL=1s"},
			[]string{"--standing-ttl 1s", "--max-assignment-ttl 1s"}},
		{"a negative drain and an unknown identity store", []string{"--drain-timeout", "-1s"}, []string{"AUTHPLANE_IDENTITY_STORE=disk"},
			[]string{"--drain-timeout -1s", `--identity-store "disk"`}},
		{"a public face on every address that names no URL", []string{"--public-port", "0", "--public-host", "0.0.0.0"}, nil,
			[]string{"--public-host 0.0.0.0: needs --public-url"}},
		{"a public URL in plain http off the loopback, and a host name for an address", []string{"--public-port", "0", "--public-url", "http://example.com"},
			[]string{"AUTHPLANE_PUBLIC_HOST=localhost"}, []string{`--public-url "http://example.com"`, `--public-host "localhost"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			code, stdout, stderr := runWithEnv(t, tt.env, append([]string{"serve", "--dir", dir, "--nats-port", "0", "--http-port", "0"}, tt.args...)...)
			if code != 1 {
				t.Errorf("exit %d, want 1\nstderr:\n%s", code, stderr)
			}
			for _, w := range tt.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr %q: want it to report %s", stderr, w)
				}
			}
			if strings.Contains(stdout+stderr, secret) {
				t.Errorf("the output shows the secret:\nstdout:\n%s\nstderr:\n%s", stdout, stderr)
			}
			if entries, err := os.ReadDir(dir); err != nil || len(entries) != 0 {
				t.Errorf("the refused start left %v (%v) in its state directory, want nothing started", entries, err)
			}
		})
	}
}

// Every numeric and duration flag of serve reads its AUTHPLANE_ twin: set them all to
// something that does not parse, and each variable is named in one report.
func TestEveryServeFlagReadsItsEnvironmentVariable(t *testing.T) {
	t.Parallel()
	out, err := harness.CombinedOutput(exec.Command(harness.AuthplaneBinary(t), "serve", "-h"))
	if err != nil {
		t.Fatalf("serve -h: %v\n%s", err, out)
	}
	var env, want []string
	for _, m := range regexp.MustCompile(`(?m)^  -(\S+) (int|float|duration)$`).FindAllStringSubmatch(string(out), -1) {
		name := "AUTHPLANE_" + strings.ToUpper(strings.ReplaceAll(m[1], "-", "_"))
		env, want = append(env, name+"=not-a-number"), append(want, name)
	}
	if len(want) < 15 {
		t.Fatalf("serve -h lists %d numeric flags, want the plane's (%v)", len(want), want)
	}
	code, _, stderr := runWithEnv(t, env, "serve", "--dir", t.TempDir())
	if code != 1 {
		t.Fatalf("exit %d, want 1\n%s", code, stderr)
	}
	for _, w := range want {
		if !strings.Contains(stderr, w+` "not-a-number"`) {
			t.Errorf("stderr does not report %s:\n%s", w, stderr)
		}
	}
}

// A plane configured through the environment alone serves; a flag beside a variable wins; and
// a URL's password shows nowhere: not in --help, not in the summary, not in the log.
func TestServeTakesItsConfigurationFromTheEnvironmentAndFlagsWin(t *testing.T) {
	t.Parallel()
	s := harness.StartStandalone(t, harness.TestSpace)
	u, err := url.Parse(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("ops", secret)
	dir := t.TempDir()
	env := []string{"AUTHPLANE_DIR=" + dir, "AUTHPLANE_NATS_URL=" + u.String(), "AUTHPLANE_SPACE_DIR=" + s.SpaceDir,
		"AUTHPLANE_HTTP_PORT=0", "AUTHPLANE_PUBLIC_PORT=-1", "AUTHPLANE_LOG_LEVEL=debug"}

	code, help, helpErr := runWithEnv(t, env, "serve", "-h")
	if code != 0 || strings.Contains(help+helpErr, secret) || !strings.Contains(help+helpErr, "-nats-url string") {
		t.Errorf("serve -h: exit %d; want 0, the flags, and no value from the environment:\n%s%s", code, help, helpErr)
	}

	proc := harness.StartAuthplaneEnv(t, "", env, "--public-port", "0")
	info := harness.WaitReady(t, proc, dir)
	if infos := harness.ServiceInstances(t, harness.OpsConn(t, harness.BinaryPlane(t, info), harness.OwnerA, "ops")); len(infos) != 1 {
		t.Errorf("got %d service instances, want the plane's one", len(infos))
	}
	if !regexp.MustCompile(`(?m)^  public    http://127\.0\.0\.1:\d+/`).MatchString(proc.Stdout.String()) {
		t.Errorf("summary %q: want a public face (--public-port 0 wins over AUTHPLANE_PUBLIC_PORT=-1)", proc.Stdout.String())
	}
	if err := proc.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := proc.Wait(t, 30*time.Second); code != 0 {
		t.Errorf("SIGTERM: exit %d, want 0\n%s", code, proc.Stderr.String())
	}
	stdout, stderr := proc.Stdout.String(), proc.Stderr.String()
	if strings.Contains(stdout+stderr, secret) {
		t.Errorf("the plane showed the URL's password:\nstdout:\n%s\nstderr:\n%s", stdout, stderr)
	}
	if want := fmt.Sprintf("nats://REDACTED@%s", u.Host); !strings.Contains(stdout, want) || !strings.Contains(stderr, want) {
		t.Errorf("want the summary and the log to show %s:\nstdout:\n%s\nstderr:\n%s", want, stdout, stderr)
	}
}
