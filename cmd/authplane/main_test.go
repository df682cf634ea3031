package main

import (
	"bytes"
	"flag"
	"log/slog"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/cotal-ai/authplane/service"
)

func TestHelpListsEveryCommandAndExitsZero(t *testing.T) {
	for _, arg := range []string{"--help", "-h", "-help", "help"} {
		t.Run(arg, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run([]string{arg}, &stdout, &stderr); code != 0 {
				t.Fatalf("authplane %s: got exit %d, want 0\n%s", arg, code, stderr.String())
			}
			for _, c := range commands {
				if !strings.Contains(stdout.String(), "authplane "+c.name) && c.name != "serve" {
					t.Errorf("authplane %s: got\n%s\nwant the command %s listed", arg, stdout.String(), c.name)
				}
			}
			if !strings.Contains(stdout.String(), "authplane [serve]") {
				t.Errorf("authplane %s: got\n%s\nwant serve listed as the default", arg, stdout.String())
			}
		})
	}
}

func TestEveryCommandsHelpExitsZeroWithReadableDefaults(t *testing.T) {
	for _, c := range commands {
		for _, arg := range []string{"-h", "--help"} {
			t.Run(c.name+arg, func(t *testing.T) {
				var stdout, stderr bytes.Buffer
				if code := run([]string{c.name, arg}, &stdout, &stderr); code != 0 {
					t.Fatalf("authplane %s %s: got exit %d, want 0\n%s", c.name, arg, code, stderr.String())
				}
				help := stderr.String()
				if !strings.Contains(help, "authplane "+c.name) && !strings.Contains(help, "Usage of "+c.name) {
					t.Fatalf("authplane %s %s: got %q, want its usage", c.name, arg, help)
				}
				if strings.Contains(help, `\x`) || strings.ContainsFunc(help, func(r rune) bool { return !unicode.IsPrint(r) && r != '\n' && r != '\t' }) {
					t.Errorf("authplane %s %s: got %q, want readable text (no escaped or unprintable defaults)", c.name, arg, help)
				}
			})
		}
	}
}

func TestInvocationIsGoRunWhenGoRunBuiltTheBinary(t *testing.T) {
	tests := []struct {
		name, exe, arg0, want string
	}{
		{"go run's temporary build", "/tmp/go-build2811427000/b001/exe/authplane", "/tmp/go-build2811427000/b001/exe/authplane", "go run ./cmd/authplane"},
		{"go run's cached build", "/root/.cache/go-build/f2/f2b869a5d72ef6432c758de4581eb5727617440c32e2f04ba46760c2aec2db54-d/authplane",
			"/root/.cache/go-build/f2/f2b869a5d72ef6432c758de4581eb5727617440c32e2f04ba46760c2aec2db54-d/authplane", "go run ./cmd/authplane"},
		{"a binary on PATH", "/usr/local/bin/authplane", "authplane", "authplane"},
		{"a binary by its path", "/src/authplane/authplane", "./authplane", "./authplane"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := invocationOf(tt.exe, tt.arg0); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestSummaryCommandsRunTheWayThePlaneWasStartedAndWriteIntoTheStateDir(t *testing.T) {
	var out bytes.Buffer
	cfg := service.Defaults()
	printSummary(&out, "go run ./cmd/authplane", cfg, service.Info{Space: "default", NATSURL: "nats://127.0.0.1:4222", HTTPURL: "http://127.0.0.1:8480"})
	for _, want := range []string{
		"  go run ./cmd/authplane creds --dir .authplane --role ops --owner u_aaaaaaaaaaaaaaaaaaaaaaaaaa --actor cli --out .authplane/cli.creds\n",
		"  nats --server nats://127.0.0.1:4222 --creds .authplane/cli.creds --inbox-prefix _INBOX.u_aaaaaaaaaaaaaaaaaaaaaaaaaa.cli micro info cotal-auth\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("got\n%s\nwant the line %q", out.String(), want)
		}
	}
}

func TestDurationsLogTheSameInTextAndJSON(t *testing.T) {
	for _, format := range []string{"text", "json"} {
		var buf bytes.Buffer
		log, err := newLogger(&buf, format, "info")
		if err != nil {
			t.Fatal(err)
		}
		log.Info("signal received", "drain_timeout", 10*time.Second, slog.Group("g", "wait", 250*time.Millisecond))
		for _, want := range []string{"10s", "250ms"} {
			if !strings.Contains(buf.String(), want) {
				t.Errorf("%s log: got %q, want %s", format, buf.String(), want)
			}
		}
		if strings.Contains(buf.String(), "10000000000") {
			t.Errorf("%s log: got %q, want no nanoseconds", format, buf.String())
		}
	}
}

// A flag given in the environment counts as given, as one on the command line does: bench's
// --cluster picks the replicas only when neither says them.
func TestAFlagFromTheEnvironmentCountsAsGiven(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  string
		args []string
		want bool
	}{
		{"neither", "", nil, false},
		{"the command line", "", []string{"--replicas", "1"}, true},
		{"the environment", "1", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env != "" {
				t.Setenv(envName(envPrefix, "replicas"), tc.env)
			}
			fs := flag.NewFlagSet("bench", flag.ContinueOnError)
			fs.Int("replicas", 3, "")
			if err := parse(fs, tc.args); err != nil {
				t.Fatal(err)
			}
			if got := flagSet(fs, "replicas"); got != tc.want {
				t.Fatalf("flagSet: got %v, want %v", got, tc.want)
			}
		})
	}
}

// A kid is base64url and may begin with '-' (one key in 64): `keys retire` takes it as the kid,
// not as a flag it does not know, and still takes its own flags after it. (Such a kid was once
// refused "flag provided but not defined", and the key could not be retired.)
func TestKeysRetireTakesAKidThatBeginsWithADash(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{
		{"keys", "retire", "-tVmjZkUM17rAHf4qBBJce444zXlQui0rfkPN9MsLGU", "--dir", dir},
		{"keys", "retire", "--dir7k0aW1rl6Vb9v3pJQk2sT5nYy8cE4hXgLmO0uRqZ", "--dir", dir},
	} {
		var stdout, stderr bytes.Buffer
		code := run(args, &stdout, &stderr)
		if strings.Contains(stderr.String(), "flag provided but not defined") || code == 2 {
			t.Errorf("authplane %s: exit %d, %q; want the kid taken and the plane looked for in --dir", strings.Join(args, " "), code, stderr.String())
		}
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"keys", "retire", "--dir", dir}, &stdout, &stderr); code != 2 {
		t.Errorf("authplane keys retire without a kid: exit %d, want 2 (usage)", code)
	}
}
