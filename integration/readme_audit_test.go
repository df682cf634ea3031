package integration

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
// flags (and through the CLI itself, for its read-only lines, when it is on PATH).
func TestREADMEAuditorExamplesReadTheTrail(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	info := waitReady(t, startAuthplaneIn(t, dir, "--nats-port", "0", "--http-port", "0"), filepath.Join(dir, ".authplane"))
	seedRecords(t, binaryPlane(t, info))

	var alias []string // the alias's nats CLI flags
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
			alias = strings.Fields(strings.TrimPrefix(words[1], "a="))
			if alias[0] != "nats" || len(alias) != 9 || alias[1] != "--server" || alias[2] != "nats://127.0.0.1:4222" ||
				alias[5] != "--inbox-prefix" || alias[6] != subjects.AuditorInboxPrefix || alias[7] != "--js-api-prefix" || alias[8] != subjects.AuditorAPIPrefix(testSpace) {
				t.Fatalf("README alias %q: want the nats CLI on the default port with --creds and the auditor's inbox and API prefixes", line)
			}
			alias[2] = info.NATSURL
		case words[0] == "a" && len(words) > 2:
			cli, rest := newNATSCLI(t, append(append([]string{}, alias[1:]...), words[1:]...), dir)
			cli.run(ctx, rest)
			ran[rest[0]+" "+rest[1]]++
		default:
			t.Fatalf("README line %q: this test does not know how to run it; teach it, or fix the README", line)
		}
	}
	if ran["stream info"] == 0 || ran["stream view"] == 0 || ran["stream get"] == 0 {
		t.Errorf("the README's block ran %v, want stream info, view and get", ran)
	}
}
