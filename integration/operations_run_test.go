package integration

import (
	"context"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// docSection is one `## ` section of a document: its sh blocks' lines, block by block, and its
// json blocks.
type docSection struct {
	heading string
	blocks  [][]string
	json    []string
}

// docSections reads the sections of the markdown file at path, in order.
func docSections(t *testing.T, path string) []docSection {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []docSection
	cur := &docSection{}
	lines := strings.Split(string(raw), "\n")
	for i := 0; i < len(lines); i++ {
		switch line := lines[i]; {
		case strings.HasPrefix(line, "## "):
			out = append(out, *cur)
			cur = &docSection{heading: line}
		case line == "```sh" || line == "```json":
			var block []string
			for i++; i < len(lines) && lines[i] != "```"; i++ {
				block = append(block, lines[i])
			}
			if line == "```sh" {
				cur.blocks = append(cur.blocks, block)
			} else {
				cur.json = append(cur.json, strings.Join(block, "\n"))
			}
		}
	}
	return append(out, *cur)
}

// docRun runs a document's shell lines the way a shell on one host would: variables, `&` and
// `$!`, the authplane binary, nats-server (in process), the nats CLI (natsCLI), curl, kill,
// mkdir, cp, mv, rm. The document's ports are replaced by free ones and $D by a scratch
// directory.
type docRun struct {
	t     *testing.T
	dir   string
	vars  map[string]string
	ports map[string]string
	jobs  map[string]func()
	// started are the background authplane processes, in order; results what every nats line
	// gave, last the latest.
	started []*process
	results []natsResult
	last    natsResult
	// got is the latest curl's answer, curls every curl's, out the latest authplane command's
	// output.
	got   reply
	curls []reply
	out   string
	ctx   context.Context
	n     int
}

func newDocRun(t *testing.T) *docRun {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return &docRun{t: t, dir: t.TempDir(), vars: map[string]string{}, ports: map[string]string{},
		jobs: map[string]func(){}, ctx: ctx}
}

var docPort = regexp.MustCompile(`(127\.0\.0\.1:|--http-port |--nats-port )(\d{4,5})\b`)

// mapPorts replaces every port the document names by a free one, the same one each time.
func (r *docRun) mapPorts(line string) string {
	return docPort.ReplaceAllStringFunc(line, func(m string) string {
		sub := docPort.FindStringSubmatch(m)
		if _, ok := r.ports[sub[2]]; !ok {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				r.t.Fatal(err)
			}
			r.ports[sub[2]] = strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
			if err := l.Close(); err != nil {
				r.t.Fatal(err)
			}
		}
		return sub[1] + r.ports[sub[2]]
	})
}

// run runs one line.
func (r *docRun) run(line string) {
	t := r.t
	t.Helper()
	words := shellWords(t, r.mapPorts(line), r.vars, r.dir)
	if len(words) == 0 {
		return
	}
	background := words[len(words)-1] == "&"
	if background {
		words = words[:len(words)-1]
	}
	var env []string
	for len(words) > 1 && regexp.MustCompile(`^[A-Z_][A-Z0-9_]*=`).MatchString(words[0]) {
		env, words = append(env, words[0]), words[1:]
	}
	switch name, args := words[0], words[1:]; {
	case len(words) == 1 && strings.Contains(name, "=") && len(env) == 0:
		k, v, _ := strings.Cut(name, "=")
		switch {
		case k == "D":
			v = r.dir // the scratch directory stands for the document's
		case v == "$!":
			v = r.vars["!"]
		}
		r.vars[k] = v
	case name == "authplane":
		r.authplane(line, env, args, background)
	case name == "nats-server" && background:
		r.natsServer(line, args)
	case name == "nats":
		cli, rest := newNATSCLI(t, args, r.dir)
		r.last = cli.run(r.ctx, rest)
		r.results = append(r.results, r.last)
	case name == "curl" && len(args) == 2 && args[0] == "-fsS":
		checkFor(t, 30*time.Second, 100*time.Millisecond, func() error {
			r.got = get(t, args[1])
			if r.got.Status != http.StatusOK {
				return fmt.Errorf("%q: got %d %s, want 200", line, r.got.Status, r.got.Body)
			}
			return nil
		})
		r.curls = append(r.curls, r.got)
	case name == "kill" && len(args) > 1 && args[0] == "-TERM":
		for _, job := range args[1:] {
			stop, ok := r.jobs[job]
			if !ok {
				t.Fatalf("%q: no job %q", line, job)
			}
			stop()
			delete(r.jobs, job)
		}
	case name == "mkdir" && len(args) == 2 && args[0] == "-p":
		if err := os.MkdirAll(args[1], 0o700); err != nil {
			t.Fatal(err)
		}
	case name == "cp" && len(args) == 3 && args[0] == "-a":
		copyTree(t, args[1], args[2])
	case name == "mv" && len(args) == 2:
		if err := os.Rename(args[0], args[1]); err != nil {
			t.Fatal(err)
		}
	case name == "rm" && len(args) > 1 && args[0] == "-rf":
		for _, p := range args[1:] {
			if err := os.RemoveAll(p); err != nil {
				t.Fatal(err)
			}
		}
	default:
		t.Fatalf("line %q: this test does not know how to run it; teach it, or fix the document", line)
	}
}

// authplane runs the binary: to completion, or in the background as a job that is ready once its
// state directory holds auth-service.json and stops on SIGTERM with exit 0.
func (r *docRun) authplane(line string, env, args []string, background bool) {
	t := r.t
	t.Helper()
	p := startAuthplaneEnv(t, r.dir, env, args...)
	if !background {
		if code := p.wait(t, time.Minute); code != 0 {
			t.Fatalf("%q: exit %d\n%s", line, code, p.stderr.String())
		}
		r.out = p.stdout.String()
		return
	}
	dir := ".authplane"
	for i, a := range args {
		if a == "--dir" && i+1 < len(args) {
			dir = args[i+1]
		}
	}
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(r.dir, dir)
	}
	waitReady(t, p, dir)
	r.started = append(r.started, p)
	r.job(func() {
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code := p.wait(t, time.Minute); code != 0 {
			t.Fatalf("%q after SIGTERM: exit %d\n%s", line, code, p.stderr.String())
		}
	})
}

// natsMu serialises nats-server's flag parsing, which sets a package variable.
var natsMu sync.Mutex

// natsServer runs `nats-server ARGS &` in process, as its own flag parser reads ARGS.
func (r *docRun) natsServer(line string, args []string) {
	t := r.t
	t.Helper()
	natsMu.Lock()
	prev := server.FlagSnapshot
	fs := flag.NewFlagSet("nats-server", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	noop := func() {}
	opts, err := server.ConfigureOptions(fs, args, noop, noop, noop)
	server.FlagSnapshot = prev
	natsMu.Unlock()
	if err != nil {
		t.Fatalf("%q: %v", line, err)
	}
	srv := runServer(t, opts, line)
	r.job(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
}

// job registers a background job and makes it $!.
func (r *docRun) job(stop func()) string {
	r.n++
	id := "job" + strconv.Itoa(r.n)
	r.jobs[id] = stop
	r.vars["!"] = id
	return id
}

// copyTree copies the tree at from to to, keeping every file's mode, as `cp -a` does.
func copyTree(t *testing.T, from, to string) {
	t.Helper()
	err := filepath.WalkDir(from, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(from, path)
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		dst := filepath.Join(to, rel)
		if d.IsDir() {
			return os.MkdirAll(dst, fi.Mode().Perm())
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, data, fi.Mode().Perm())
	})
	if err != nil {
		t.Fatalf("cp -a %s %s: %v", from, to, err)
	}
}
