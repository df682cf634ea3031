package integration

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/subjects"
)

// readmeBlock returns the first ```sh block after heading in README.md.
func readmeBlock(t *testing.T, heading string) []string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(raw), "\n"+heading+"\n")
	if !ok {
		t.Fatalf("README.md has no heading %q", heading)
	}
	_, block, ok := strings.Cut(after, "```sh\n")
	if !ok {
		t.Fatalf("README.md has no sh block under %q", heading)
	}
	block, _, _ = strings.Cut(block, "```")
	return strings.Split(block, "\n")
}

// shellWords expands $VAR and then "$(cat FILE)" (relative to dir) the way the shell would for
// the documents' lines, and splits the line into words, honouring double quotes and dropping a
// trailing comment.
func shellWords(t *testing.T, line string, vars map[string]string, dir string) []string {
	t.Helper()
	line = regexp.MustCompile(`(^|\s)#.*$`).ReplaceAllString(line, "")
	line = regexp.MustCompile(`\$([A-Za-z_][A-Za-z0-9_]*)`).ReplaceAllStringFunc(line, func(m string) string {
		v, ok := vars[m[1:]]
		if !ok {
			t.Fatalf("line %q uses $%s before setting it", line, m[1:])
		}
		return v
	})
	line = regexp.MustCompile(`\$\(cat ([^)]+)\)`).ReplaceAllStringFunc(line, func(m string) string {
		name := strings.TrimSuffix(strings.TrimPrefix(m, "$(cat "), ")")
		if !filepath.IsAbs(name) {
			name = filepath.Join(dir, name)
		}
		data, err := os.ReadFile(name)
		if err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		return strings.ReplaceAll(strings.TrimSpace(string(data)), `"`, `\"`)
	})
	var words []string
	var cur strings.Builder
	inQuote, started := false, false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == '\\' && inQuote && i+1 < len(line) && line[i+1] == '"':
			cur.WriteByte('"')
			i++
		case c == '"':
			inQuote, started = !inQuote, true
		case (c == ' ' || c == '\t') && !inQuote:
			if started {
				words = append(words, cur.String())
				cur.Reset()
				started = false
			}
		default:
			cur.WriteByte(c)
			started = true
		}
	}
	if started {
		words = append(words, cur.String())
	}
	return words
}

// isGoRun reports whether a README line's words run the plane's binary (`go run
// ./cmd/authplane …`).
func isGoRun(words []string) bool {
	return len(words) > 2 && words[0] == "go" && words[1] == "run" && words[2] == "./cmd/authplane"
}

// readmeGoRun runs a `go run ./cmd/authplane …` line of the README through the built binary,
// in dir, and fails the test unless it exits 0.
func readmeGoRun(t *testing.T, dir, line string, words []string) {
	t.Helper()
	p := startAuthplaneIn(t, dir, words[3:]...)
	if code := p.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("README line %q: exit %d\n%s", line, code, p.stderr.String())
	}
}

// readmeAlias returns the flags of a README alias `name="nats --server … --creds …
// --inbox-prefix …"`, and fails the test unless it is the nats CLI on the default port with a
// credential.
func readmeAlias(t *testing.T, line, def, name string) map[string]string {
	t.Helper()
	cli := strings.Fields(strings.TrimPrefix(def, name+"="))
	flags := map[string]string{}
	for i := 1; i+1 < len(cli); i += 2 {
		flags[cli[i]] = cli[i+1]
	}
	if len(cli) == 0 || cli[0] != "nats" || flags["--server"] != "nats://127.0.0.1:4222" || flags["--creds"] == "" {
		t.Fatalf("README alias %q: want the nats CLI on the default port with --creds", line)
	}
	return flags
}

// TestREADMETryItWorksAsWritten runs the README's "Try it with the nats CLI" block line by
// line: the plane started as the README says (in a scratch directory, free ports), each
// `go run ./cmd/authplane …` through the built binary, each `n …` (the nats CLI with the
// README's flags) as that CLI does it over nats.go. The block's requests must give what its
// comments promise: a refusal without scope, then a prepare that prints credentials.
func TestREADMETryItWorksAsWritten(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	plane := startAuthplaneIn(t, dir, "--nats-port", "0", "--http-port", "0")
	info := waitReady(t, plane, filepath.Join(dir, ".authplane"))

	vars := map[string]string{}
	var conn *nats.Conn
	var owner, actor string
	var replies []*nats.Msg
	for _, line := range readmeBlock(t, "## Try it with the nats CLI") {
		words := shellWords(t, line, vars, dir)
		switch {
		case len(words) == 0:
		case len(words) == 1 && strings.Contains(words[0], "=") && !strings.HasPrefix(words[0], "n="):
			k, v, _ := strings.Cut(words[0], "=")
			vars[k] = v
		case isGoRun(words):
			readmeGoRun(t, dir, line, words)
		case words[0] == "alias":
			flags := readmeAlias(t, line, words[1], "n")
			prefix := flags["--inbox-prefix"]
			var ok bool
			if owner, actor, ok = strings.Cut(strings.TrimPrefix(prefix, "_INBOX."), "."); !ok {
				t.Fatalf("README alias %q: --inbox-prefix %q is not _INBOX.<owner>.<actor>", line, prefix)
			}
			nc, err := nats.Connect(info.NATSURL, nats.UserCredentials(filepath.Join(dir, flags["--creds"])), nats.CustomInboxPrefix(prefix))
			if err != nil {
				t.Fatalf("README alias %q: %v", line, err)
			}
			t.Cleanup(nc.Close)
			conn = nc
		case words[0] == "n" && len(words) == 4 && words[1] == "micro":
			verb := map[string]string{"info": "INFO", "stats": "STATS"}[words[2]]
			msg, err := conn.Request("$SRV."+verb+"."+words[3], nil, 5*time.Second)
			if err != nil || verb == "" {
				t.Fatalf("README line %q: %v", line, err)
			}
			var got struct {
				Name      string            `json:"name"`
				Endpoints []json.RawMessage `json:"endpoints"`
			}
			if err := json.Unmarshal(msg.Data, &got); err != nil || got.Name != subjects.ServiceName || len(got.Endpoints) < len(subjects.Endpoints) {
				t.Fatalf("README line %q: got %s", line, msg.Data)
			}
		case words[0] == "n" && len(words) == 4 && words[1] == "req":
			if want := subjects.EndpointSubject(testSpace, subjects.EndpointManagerAuthority, owner, actor); words[2] != want {
				t.Fatalf("README line %q: subject %s, want the caller's own %s", line, words[2], want)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			msg, err := conn.RequestWithContext(ctx, words[2], []byte(words[3]))
			cancel()
			if err != nil {
				t.Fatalf("README line %q: %v", line, err)
			}
			replies = append(replies, msg)
		default:
			t.Fatalf("README line %q: this test does not know how to run it; teach it, or fix the README", line)
		}
	}
	if len(replies) != 2 {
		t.Fatalf("got %d requests in the README block, want the refusal and the prepare", len(replies))
	}
	if code := replies[0].Header.Get("Nats-Service-Error"); !strings.HasPrefix(code, "permission-denied: ") {
		t.Errorf("the README's first request: got %q, want a permission-denied refusal", code)
	}
	var prep material
	if err := json.Unmarshal(replies[1].Data, &prep); err != nil || replies[1].Header.Get("Nats-Service-Error") != "" {
		t.Fatalf("the README's prepare: got %q %s", replies[1].Header.Get("Nats-Service-Error"), replies[1].Data)
	}
	if prep.Operation != "prepare" || prep.Credentials["supervisor"].JWT == "" || prep.Credentials["executor"].JWT == "" ||
		prep.RegistrationProof == "" || prep.AccountPublicKey == "" {
		t.Errorf("the README's prepare: got %s, want supervisor and executor credentials, a proof and the account", replies[1].Data)
	}
}

// The README's revoke, its placeholders filled in from a live run, revokes it.
func TestREADMERevokeExampleRevokesARun(t *testing.T) {
	t.Parallel()
	lines := readmeBlock(t, "## Workflow runs")
	var example string
	for _, line := range lines {
		if strings.HasPrefix(line, "n req ") {
			example = line
		}
	}
	subject, body, ok := strings.Cut(strings.TrimPrefix(example, "n req "), " '")
	if !ok || subject != "cotal.default.auth.run-revoke.$O.cli" {
		t.Fatalf("README revoke example %q: want `n req cotal.default.auth.run-revoke.$O.cli '<body>'`", example)
	}
	body = strings.TrimSuffix(body, "'")

	env := newRunEnv(t, startPlane(t, nil))
	runID := env.admitted()
	ids, err := json.Marshal(env.m.Identities)
	if err != nil {
		t.Fatal(err)
	}
	body = strings.NewReplacer("IID", env.m.iid, "UID", env.m.uid, "IDENTITIES", string(ids), "PROOF", env.cur.Proof,
		"ACCOUNT", env.cur.Account, "RUN", runID).Replace(body)
	o := ask(t, env.cli.Conn(), ownerA, "cli", subjects.EndpointRunRevoke, body)
	if o.code != "" {
		t.Fatalf("the README's revoke: got %s %q", o.code, o.message)
	}
	if m := markerOf(t, env.p, runID); !strings.Contains(string(m), "stopped by its owner") {
		t.Fatalf("after the README's revoke: marker %s", m)
	}
}
