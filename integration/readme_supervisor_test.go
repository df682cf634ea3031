package integration

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/client"
)

var (
	jqLine   = regexp.MustCompile(`^(\w+)=\$\(jq -r \.(\w+) (\S+)\)$`)
	dateLine = regexp.MustCompile(`^(\w+)=\$\(\( \$\(date \+%s\) \+ (\d+) \)\)`)
)

// TestREADMESupervisorFlowWorksAsWritten runs the README's platform supervisor block line by
// line against the binary's plane, as TestREADMETryItWorksAsWritten runs "Try it": `go run
// ./cmd/authplane …` through the built binary, `$(jq -r .field FILE)` and `$(( $(date +%s) + N ))`
// as the shell would, and each `a req` (the nats CLI with the alias's flags) over nats.go. The
// assign must answer the revision the block names, the prepare credentials clamped to the
// assignment's end, and the end a complete report.
func TestREADMESupervisorFlowWorksAsWritten(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	plane := startAuthplaneIn(t, dir, "--nats-port", "0", "--http-port", "0")
	info := waitReady(t, plane, filepath.Join(dir, ".authplane"))

	vars := map[string]string{}
	var conn *nats.Conn
	var replies []*nats.Msg
	for _, line := range readmeBlock(t, "## Run a manager on an owner's behalf (platform supervisor)") {
		line = strings.TrimSpace(regexp.MustCompile(`\s#.*$`).ReplaceAllString(line, ""))
		if m := jqLine.FindStringSubmatch(line); m != nil {
			data, err := os.ReadFile(filepath.Join(dir, m[3]))
			if err != nil {
				t.Fatalf("README line %q: %v", line, err)
			}
			var fields map[string]any
			if err := json.Unmarshal(data, &fields); err != nil {
				t.Fatalf("README line %q: %v", line, err)
			}
			v, ok := fields[m[2]].(string)
			if !ok {
				t.Fatalf("README line %q: %s has no string %s", line, m[3], m[2])
			}
			vars[m[1]] = v
			continue
		}
		if m := dateLine.FindStringSubmatch(line); m != nil {
			n, err := strconv.ParseInt(m[2], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			vars[m[1]] = strconv.FormatInt(time.Now().Unix()+n, 10)
			continue
		}
		words := shellWords(t, line, vars, dir)
		switch {
		case len(words) == 0:
		case len(words) == 1 && strings.Contains(words[0], "="):
			k, v, _ := strings.Cut(words[0], "=")
			vars[k] = v
		case isGoRun(words):
			readmeGoRun(t, dir, line, words)
		case words[0] == "alias":
			flags := readmeAlias(t, line, words[1], "a")
			nc, err := nats.Connect(info.NATSURL, nats.UserCredentials(filepath.Join(dir, flags["--creds"])), nats.CustomInboxPrefix(flags["--inbox-prefix"]))
			if err != nil {
				t.Fatalf("README alias %q: %v", line, err)
			}
			t.Cleanup(nc.Close)
			conn = nc
		case words[0] == "a" && len(words) == 4 && words[1] == "req":
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			msg, err := conn.RequestWithContext(ctx, words[2], []byte(words[3]))
			cancel()
			if err != nil {
				t.Fatalf("README line %q: %v", line, err)
			}
			if code := msg.Header.Get("Nats-Service-Error"); code != "" {
				t.Fatalf("README line %q: refused %s", line, code)
			}
			replies = append(replies, msg)
		default:
			t.Fatalf("README line %q: this test does not know how to run it; teach it, or fix the README", line)
		}
	}
	if len(replies) != 3 {
		t.Fatalf("got %d requests in the README block, want assign, authority and end", len(replies))
	}
	var a client.Assignment
	if err := json.Unmarshal(replies[0].Data, &a); err != nil || strconv.FormatUint(a.Revision, 10) != vars["REV"] || a.Owner != vars["O"] {
		t.Fatalf("the README's assign: got %s (%v), want the assignment of $O at revision $REV=%s", replies[0].Data, err, vars["REV"])
	}
	var m client.Material
	if err := json.Unmarshal(replies[1].Data, &m); err != nil || len(m.Credentials) != 2 {
		t.Fatalf("the README's prepare under the assignment: got %s (%v), want the supervisor and executor credentials", replies[1].Data, err)
	}
	end, err := strconv.ParseInt(vars["END"], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	for duty, c := range m.Credentials {
		uc, err := jwt.DecodeUserClaims(c.JWT)
		if err != nil || uc.Expires > end || duty == "supervisor" && uc.Expires != end {
			t.Errorf("the README's %s credential: exp %d (%v), want at most the assignment's end %d (the supervisor's exactly)", duty, uc.Expires, err, end)
		}
	}
	var r client.EndReport
	if err := json.Unmarshal(replies[2].Data, &r); err != nil || r.Assignment.State != "ended" || !r.Revoked.Done || !r.Evicted.Complete {
		t.Fatalf("the README's end: got %s (%v), want a complete end", replies[2].Data, err)
	}
}
