package integration

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// binaryPlane is what tests reach of a plane the binary runs: its broker and its space
// material, as auth-service.json names them.
func binaryPlane(t *testing.T, info admin.ServiceInfo) *testPlane {
	t.Helper()
	keys, err := (admin.Locate{SpaceDir: info.SpaceDir}).Keys()
	if err != nil {
		t.Fatal(err)
	}
	return &testPlane{info: service.Info{NATSURL: info.NATSURL, HTTPURL: info.URL, SpaceDir: info.SpaceDir}, keys: keys, t: t}
}

// TestREADMEAuditorExamplesReadTheTrail runs the README's "Read the audit trail" block: the
// plane started as the README says, the creds line through the binary, and each `a stream …`
// line as the nats CLI does it, through nats.go's JetStream API with the same credential and
// flags. When the nats CLI is on PATH, its info and get lines run through it too (view needs a
// terminal).
func TestREADMEAuditorExamplesReadTheTrail(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	info := waitReady(t, startAuthplaneIn(t, dir, "--nats-port", "0", "--http-port", "0"), filepath.Join(dir, ".authplane"))
	seedRecords(t, binaryPlane(t, info))

	var js jetstream.JetStream
	var cli []string // the nats CLI's global flags, as the alias has them
	ran := map[string]int{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, line := range readmeBlock(t, "## Read the audit trail") {
		words := shellWords(t, line, nil, dir)
		switch {
		case len(words) == 0:
		case len(words) > 2 && words[0] == "go" && words[1] == "run" && words[2] == "./cmd/authplane":
			p := startAuthplaneIn(t, dir, words[3:]...)
			if code := p.wait(t, 30*time.Second); code != 0 {
				t.Fatalf("README line %q: exit %d\n%s", line, code, p.stderr.String())
			}
		case words[0] == "alias" && strings.HasPrefix(words[1], "a="):
			cli = strings.Fields(strings.TrimPrefix(words[1], "a="))
			flags := map[string]string{}
			for i := 1; i+1 < len(cli); i += 2 {
				flags[cli[i]] = cli[i+1]
			}
			if cli[0] != "nats" || flags["--server"] != "nats://127.0.0.1:4222" || flags["--inbox-prefix"] != subjects.AuditorInboxPrefix ||
				flags["--js-api-prefix"] != subjects.AuditorAPIPrefix(testSpace) {
				t.Fatalf("README alias %q: want the nats CLI on the default port with the auditor's inbox and API prefixes", line)
			}
			cli[2], cli[4] = info.NATSURL, filepath.Join(dir, flags["--creds"])
			_, js = auditorConn(t, info.NATSURL, cli[4], &asyncErrors{})
		case words[0] == "a" && len(words) >= 4 && words[1] == "stream":
			verb, stream, rest := words[2], words[3], words[4:]
			ran[verb]++
			switch {
			case verb == "info" && len(rest) == 0:
				st, err := js.Stream(ctx, stream)
				if err != nil || st.CachedInfo().State.Msgs == 0 {
					t.Fatalf("README line %q: %v, want a stream with records", line, err)
				}
			case verb == "view" && (len(rest) == 0 || len(rest) == 2 && rest[0] == "--subject"):
				filter := ">"
				if len(rest) == 2 {
					filter = rest[1]
				}
				msgs := readAll(t, js, stream, filter)
				if len(msgs) == 0 {
					t.Fatalf("README line %q: got no records", line)
				}
				for _, m := range msgs {
					if !json.Valid(m.Data()) {
						t.Errorf("README line %q: record %s is not JSON", line, m.Data())
					}
				}
			case verb == "get" && len(rest) == 1:
				seq, err := strconv.ParseUint(rest[0], 10, 64)
				if err != nil {
					t.Fatalf("README line %q: %v", line, err)
				}
				st, err := js.Stream(ctx, stream)
				if err == nil {
					_, err = st.GetMsg(ctx, seq)
				}
				if err != nil {
					t.Fatalf("README line %q: %v", line, err)
				}
				runNATSCLI(t, cli, words[1:])
			case verb == "get" && len(rest) == 2 && rest[0] == "--last-for":
				st, err := js.Stream(ctx, stream)
				if err == nil {
					_, err = st.GetLastMsgForSubject(ctx, rest[1])
				}
				if err != nil {
					t.Fatalf("README line %q: %v", line, err)
				}
				runNATSCLI(t, cli, words[1:])
			default:
				t.Fatalf("README line %q: this test does not know how to run it; teach it, or fix the README", line)
			}
		default:
			t.Fatalf("README line %q: this test does not know how to run it; teach it, or fix the README", line)
		}
	}
	if ran["info"] == 0 || ran["view"] == 0 || ran["get"] == 0 {
		t.Errorf("the README's block ran %v, want stream info, view and get", ran)
	}
}

// runNATSCLI runs the stock nats CLI with the alias's flags and args when it is on PATH, and
// fails the test if it fails.
func runNATSCLI(t *testing.T, alias, args []string) {
	t.Helper()
	natsCLI, err := exec.LookPath("nats")
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, natsCLI, append(alias[1:], args...)...)
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir(), "XDG_CONFIG_HOME="+t.TempDir()) // no saved contexts
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("nats %v: %v\n%s", args, err, out)
	}
}
