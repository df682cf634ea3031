package integration

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// natsCLI does what the stock nats CLI does for the lines the README and the operator's guide
// show, over nats.go: its global flags (--server, --creds, --inbox-prefix, --js-api-prefix) and
// `stream info|view|get` and `req`. When the CLI itself is on PATH, its read-only lines also
// run through it.
type natsCLI struct {
	t     *testing.T
	flags []string // the global flags as given, for the real CLI
	nc    *nats.Conn
	js    jetstream.JetStream
}

// natsResult is what a line gave: the records a stream command read, or a request's reply.
type natsResult struct {
	records [][]byte
	reply   *nats.Msg
}

// newNATSCLI connects as the CLI would with the global flags at the head of args, relative
// paths under dir, and returns the command that follows them.
func newNATSCLI(t *testing.T, args []string, dir string) (*natsCLI, []string) {
	t.Helper()
	c := &natsCLI{t: t}
	flags := map[string]string{}
	for len(args) > 1 && (args[0] == "--server" || args[0] == "--creds" || args[0] == "--inbox-prefix" || args[0] == "--js-api-prefix") {
		flags[args[0]] = args[1]
		args = args[2:]
	}
	if flags["--server"] == "" || flags["--creds"] == "" {
		t.Fatalf("nats %v: want --server and --creds", flags)
	}
	creds := flags["--creds"]
	if !filepath.IsAbs(creds) {
		creds = filepath.Join(dir, creds)
		flags["--creds"] = creds
	}
	for _, f := range []string{"--server", "--creds", "--inbox-prefix", "--js-api-prefix"} {
		if v, ok := flags[f]; ok {
			c.flags = append(c.flags, f, v)
		}
	}
	opts := []nats.Option{nats.UserCredentials(creds), nats.MaxReconnects(0)}
	if p := flags["--inbox-prefix"]; p != "" {
		opts = append(opts, nats.CustomInboxPrefix(p))
	}
	var err error
	if c.nc, err = nats.Connect(flags["--server"], opts...); err != nil {
		t.Fatalf("nats %v: %v", c.flags, err)
	}
	t.Cleanup(c.nc.Close)
	if p := flags["--js-api-prefix"]; p != "" {
		c.js, err = jetstream.NewWithAPIPrefix(c.nc, p)
	} else {
		c.js, err = jetstream.New(c.nc)
	}
	if err != nil {
		t.Fatal(err)
	}
	return c, args
}

// run runs one command; the test fails if it fails, or if this does not know it.
func (c *natsCLI) run(ctx context.Context, args []string) natsResult {
	t := c.t
	t.Helper()
	fail := func(err error) { t.Helper(); t.Fatalf("nats %v: %v", args, err) }
	switch {
	case len(args) == 3 && args[0] == "req":
		reply, err := c.nc.RequestWithContext(ctx, args[1], []byte(args[2]))
		if err != nil {
			fail(err)
		}
		return natsResult{reply: reply}
	case len(args) < 3 || args[0] != "stream":
		t.Fatalf("nats %v: this test does not know how to run it; teach it, or fix the document", args)
	}
	verb, stream, rest := args[1], args[2], args[3:]
	st, err := c.js.Stream(ctx, stream)
	if err != nil {
		fail(err)
	}
	var res natsResult
	switch {
	case verb == "info" && len(rest) == 0:
		c.real(args)
	case verb == "view" && (len(rest) == 0 || len(rest) == 2 && rest[0] == "--subject"):
		filter := ">"
		if len(rest) == 2 {
			filter = rest[1]
		}
		for _, m := range readAll(t, c.js, stream, filter) {
			res.records = append(res.records, m.Data())
		}
	case verb == "get" && len(rest) == 1:
		seq, err := strconv.ParseUint(rest[0], 10, 64)
		if err != nil {
			fail(err)
		}
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			fail(err)
		}
		res.records = [][]byte{m.Data}
		c.real(args)
	case verb == "get" && len(rest) == 2 && rest[0] == "--last-for":
		m, err := st.GetLastMsgForSubject(ctx, rest[1])
		if err != nil {
			fail(err)
		}
		res.records = [][]byte{m.Data}
		c.real(args)
	default:
		t.Fatalf("nats %v: this test does not know how to run it; teach it, or fix the document", args)
	}
	for _, r := range res.records {
		if !json.Valid(r) {
			t.Errorf("nats %v: record %s is not JSON", args, r)
		}
	}
	return res
}

// real runs the stock nats CLI with the global flags and args when it is on PATH (`stream
// view` needs a terminal, so only the other lines come here).
func (c *natsCLI) real(args []string) {
	c.t.Helper()
	natsPath, err := exec.LookPath("nats")
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, natsPath, append(append([]string{}, c.flags...), args...)...)
	cmd.Env = append(os.Environ(), "HOME="+c.t.TempDir(), "XDG_CONFIG_HOME="+c.t.TempDir()) // no saved contexts
	if out, err := cmd.CombinedOutput(); err != nil {
		c.t.Errorf("nats %v: %v\n%s", args, err, out)
	}
}
