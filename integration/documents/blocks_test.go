package documents

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/core/store"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/subjects"
)

// docBlock is one fenced block of a document.
type docBlock struct {
	file    string // relative to the repository's root
	line    int    // the line of its first line of code
	heading string // the "## " section it is in ("" before the first)
	lang    string // the first word of its info string
	code    string
}

// where names the block for a person: file:line (section).
func (b docBlock) where() string { return fmt.Sprintf("%s:%d (%s)", b.file, b.line, b.heading) }

// section names the block's section for the checks: file#heading.
func (b docBlock) section() string { return b.file + "#" + b.heading }

// blockLangs are the languages a document's fenced blocks may be written in: sh blocks run, as
// written, in one shell; json blocks are bodies (docs/PROTOCOL.md's are checked by
// protocol_test.go); text blocks are for reading (a layout, a command that does not return).
var blockLangs = []string{"sh", "json", "text"}

// documentsOf lists the documents whose sh blocks run, in the order they run: README.md, then
// docs/*.md by name.
func documentsOf(t *testing.T, root string) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(docs)
	out := []string{"README.md"}
	for _, d := range docs {
		rel, err := filepath.Rel(root, d)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, rel)
	}
	return out
}

// readBlocks reads every fenced block of the documents under root, in order.
func readBlocks(t *testing.T, root string) []docBlock {
	t.Helper()
	var out []docBlock
	for _, doc := range documentsOf(t, root) {
		raw, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		heading := ""
		lines := strings.Split(string(raw), "\n")
		for i := 0; i < len(lines); i++ {
			line := lines[i]
			if strings.HasPrefix(line, "## ") {
				heading = strings.TrimPrefix(line, "## ")
			}
			if !strings.HasPrefix(line, "```") {
				continue
			}
			lang, _, _ := strings.Cut(strings.TrimPrefix(line, "```"), " ")
			b := docBlock{file: doc, line: i + 2, heading: heading, lang: lang}
			var code []string
			for i++; i < len(lines) && lines[i] != "```"; i++ {
				code = append(code, lines[i])
			}
			if i == len(lines) {
				t.Fatalf("%s: a block that does not end", b.where())
			}
			b.code = strings.Join(code, "\n") + "\n"
			out = append(out, b)
		}
	}
	return out
}

// TestEveryDocumentsBlocksAreOfAKnownLanguageAndTheFrontDoorIsSmall: every fenced block of the
// documents says what it is (sh, json or text), the README is a front door of at most 12 KB
// that still shows the two commands, and no document lists a test that does not exist.
func TestEveryDocumentsBlocksAreOfAKnownLanguageAndTheFrontDoorIsSmall(t *testing.T) {
	root := repoRoot
	for _, b := range readBlocks(t, root) {
		if !slices.Contains(blockLangs, b.lang) {
			t.Errorf("%s: a block of language %q, want one of %v (an sh block runs; a command that is not to run goes in a text block)", b.where(), b.lang, blockLangs)
		}
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(readme) > 12<<10 {
		t.Errorf("README.md is %d bytes, want a front door of at most 12 KB: the reference goes in docs/", len(readme))
	}
	for _, cmd := range []string{"go run ./cmd/authplane", "go test ./..."} {
		if !strings.Contains(string(readme), "\n"+cmd+" ") {
			t.Errorf("README.md: want the command %q on a line of its own", cmd)
		}
	}
}

// blocksTools are what the documents' sh blocks call.
var blocksTools = []string{"bash", "git", "go", "curl", "jq", "od", "nats", "nats-server"}

// portDefault is how a block names a port it lets the environment choose: ${NAME:-4222}.
var portDefault = regexp.MustCompile(`\$\{([A-Z][A-Z0-9_]*):-(\d{4,5})\}`)

// TestEveryDocumentedBlockRunsAsPastedInAFreshClone runs every sh block of README.md and
// docs/*.md, top to bottom, in one bash, in the root of a fresh clone of this repository (with
// the working tree's changes committed in it), with set -euo pipefail: a line that fails fails
// the test. The blocks' ports are free ones (each ${NAME:-port} the documents use is set in the
// environment), $D is a scratch directory, and `go install` installs into a scratch bin on
// PATH. Between the documents' sections the test checks that what the text promises happened.
// Afterwards no process the blocks started still runs, and `git status` in the clone is clean:
// everything the blocks wrote is under .authplane/, which git ignores.
//
// It needs the tools the blocks call; .ci/run installs the pinned nats CLI and nats-server and
// sets AUTHPLANE_REQUIRE_TOOLS=1, without which a missing tool skips the test.
func TestEveryDocumentedBlockRunsAsPastedInAFreshClone(t *testing.T) {
	harness.Long(t, "every documented block in a fresh clone, minutes")
	t.Parallel()
	for _, tool := range blocksTools {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("AUTHPLANE_REQUIRE_TOOLS") != "" {
				t.Fatalf("%s is not on PATH: the documents' blocks call it", tool)
			}
			t.Skipf("%s is not on PATH (go install github.com/nats-io/natscli/nats@v0.5.0 and github.com/nats-io/nats-server/v2@v2.15.2; AUTHPLANE_REQUIRE_TOOLS=1 makes this a failure)", tool)
		}
	}
	if err := harness.Run(exec.Command("git", "-C", repoRoot, "rev-parse", "--is-inside-work-tree")); err != nil {
		if os.Getenv("AUTHPLANE_REQUIRE_TOOLS") != "" {
			t.Fatalf("the tests do not run in a git work tree (%v): the blocks run in a fresh clone of it", err)
		}
		t.Skipf("the tests do not run in a git work tree (%v): the blocks run in a fresh clone of it", err)
	}
	began := time.Now()
	tmp := t.TempDir()
	clone := freshClone(t, tmp)
	r := &blockRun{t: t, clone: clone, tmp: tmp, d: filepath.Join(tmp, "cotal")}
	var run []docBlock
	for _, b := range readBlocks(t, clone) {
		if b.lang == "sh" {
			run = append(run, b)
		}
	}
	if len(run) < 20 {
		t.Fatalf("found %d sh blocks in the documents; the reader is broken", len(run))
	}
	r.start(run)
	checked := map[string]bool{}
	for i, b := range run {
		r.run(i, b)
		if i+1 == len(run) || run[i+1].section() != b.section() {
			check, ok := blockChecks[b.section()]
			if !ok {
				t.Fatalf("section %s has sh blocks and no check in blockChecks: add one that checks what its text promises", b.section())
			}
			check(r)
			checked[b.section()] = true
			r.sectionFrom = len(r.results)
		}
	}
	for section := range blockChecks {
		if !checked[section] {
			t.Errorf("blockChecks has a check for %s, which has no sh block", section)
		}
	}
	r.finish()
	slowest := slices.Clone(r.results)
	slices.SortFunc(slowest, func(a, b blockResult) int { return int(b.took - a.took) })
	var slow []string
	for _, res := range slowest[:min(5, len(slowest))] {
		slow = append(slow, fmt.Sprintf("%s %s", res.block.where(), res.took.Round(100*time.Millisecond)))
	}
	t.Logf("ran %d sh blocks of %v in %s; the slowest: %s", len(run), documentsOf(t, clone), time.Since(began).Round(100*time.Millisecond), strings.Join(slow, ", "))
}

// freshClone clones the repository the test runs in into dir/clone at its HEAD, and commits
// there what the working tree changes from HEAD (modified, deleted and new files that git does
// not ignore), so the blocks run on the tree as it is, in a clone whose status starts clean.
func freshClone(t *testing.T, dir string) string {
	t.Helper()
	root := strings.TrimSpace(gitOut(t, repoRoot, "rev-parse", "--show-toplevel"))
	head := strings.TrimSpace(gitOut(t, root, "rev-parse", "HEAD"))
	clone := filepath.Join(dir, "clone")
	gitOut(t, dir, "clone", "--quiet", "--no-checkout", root, clone)
	gitOut(t, clone, "checkout", "--quiet", head)
	// What differs from HEAD, staged or not (a merge in progress stages what it brings), and
	// what git does not know yet.
	changed := strings.Split(gitOut(t, root, "diff", "--name-only", "-z", "HEAD")+gitOut(t, root, "ls-files", "-z", "--others", "--exclude-standard"), "\x00")
	overlaid := false
	for _, f := range changed {
		if f == "" {
			continue
		}
		overlaid = true
		src, dst := filepath.Join(root, f), filepath.Join(clone, f)
		fi, err := os.Stat(src)
		if errors.Is(err, os.ErrNotExist) {
			if err := os.Remove(dst); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Fatal(err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, data, fi.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
	if overlaid {
		gitOut(t, clone, "add", "--all")
		gitOut(t, clone, "-c", "user.name=blocks", "-c", "user.email=blocks@localhost", "commit", "--quiet", "--allow-empty", "-m", "the working tree's changes")
	}
	if st := gitOut(t, clone, "status", "--porcelain"); st != "" {
		t.Fatalf("the fresh clone is not clean:\n%s", st)
	}
	return clone
}

// gitOut runs git in dir and returns its output.
func gitOut(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_TERMINAL_PROMPT=0")
	out, err := harness.Output(cmd)
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("git %v in %s: %v\n%s", args, dir, err, ee.Stderr)
		}
		t.Fatalf("git %v in %s: %v", args, dir, err)
	}
	return string(out)
}

// blockRun is the one shell every block runs in, and what each block printed.
type blockRun struct {
	t                *testing.T
	clone, tmp, d    string
	cmd              *exec.Cmd
	stdin            io.WriteCloser
	lines            *bufio.Scanner
	shellErr         string
	results          []blockResult
	sectionFrom      int
	ports            map[string]string
	blocksDir, outTo string
	// revoked is the run OPERATIONS revoked, for the checks after it.
	revoked string
}

// blockResult is what one block printed: its stdout and stderr files (a background process
// it started keeps writing to them).
type blockResult struct {
	block    docBlock
	out, err string
	took     time.Duration
}

// stdout is what the block's processes have written to stdout so far.
func (b blockResult) stdout() string { return readText(b.out) }

// stderr is what they have written to stderr so far.
func (b blockResult) stderr() string { return readText(b.err) }

func readText(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return string(data)
}

// start starts the shell for blocks: free ports for every ${NAME:-port} they use, $D, a bin
// for go install, no environment of the test's own (AUTHPLANE_*, NATS_*).
func (r *blockRun) start(blocks []docBlock) {
	t := r.t
	harness.AuthplaneBinary(t) // compiles what the blocks' go run would: see GOFLAGS below
	r.blocksDir, r.outTo = filepath.Join(r.tmp, "blocks"), filepath.Join(r.tmp, "out")
	bin := filepath.Join(r.tmp, "bin")
	for _, dir := range []string{r.blocksDir, r.outTo, bin, filepath.Join(r.tmp, "xdg")} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	r.ports = map[string]string{}
	for _, b := range blocks {
		for _, m := range portDefault.FindAllStringSubmatch(b.code, -1) {
			if _, ok := r.ports[m[1]]; !ok {
				r.ports[m[1]] = ""
			}
		}
	}
	names := make([]string, 0, len(r.ports))
	for name := range r.ports {
		names = append(names, name)
	}
	sort.Strings(names)
	for i, port := range quietPorts(t, len(names)) {
		r.ports[names[i]] = strconv.Itoa(port)
	}
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k == harness.MarkEnv { // what the test binary started, its guardian ends
			env = append(env, kv)
			continue
		}
		if strings.HasPrefix(k, "AUTHPLANE_") || strings.HasPrefix(k, "NATS_") || k == "D" || k == "GOBIN" || k == "PATH" || k == "GOFLAGS" || k == "CGO_ENABLED" {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "D="+r.d, "GOBIN="+bin, "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"XDG_CONFIG_HOME="+filepath.Join(r.tmp, "xdg"),
		// The image's build (Dockerfile: CGO_ENABLED=0, -trimpath), cached whatever the clone's
		// path: the binary the tests built (harness.AuthplaneBinary, before the shell starts)
		// compiled every package, so a block's go run is a link at most.
		"CGO_ENABLED=0", "GOFLAGS=-trimpath -mod=readonly")
	for _, name := range names {
		env = append(env, name+"="+r.ports[name])
	}
	r.cmd = exec.Command("bash", "--noprofile", "--norc")
	r.cmd.Dir, r.cmd.Env = r.clone, env
	var err error
	if r.stdin, err = r.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := r.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	r.shellErr = filepath.Join(r.tmp, "shell.err")
	errFile, err := os.Create(r.shellErr)
	if err != nil {
		t.Fatal(err)
	}
	r.cmd.Stderr = errFile
	if err := harness.Start(r.cmd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Whatever a failed run left: the shell and everything it started, one process group.
		if err := harness.KillGroup(r.cmd); err != nil {
			t.Error(err)
		}
		if err := r.cmd.Wait(); err != nil {
			t.Logf("the blocks' shell: %v", err)
		}
		if err := errFile.Close(); err != nil {
			t.Error(err)
		}
	})
	r.lines = bufio.NewScanner(out)
	r.send(`set -euo pipefail
trap 'echo "::failed at ${BASH_SOURCE[0]##*/}:$LINENO: $BASH_COMMAND" >&2' ERR
echo "::ready"
`)
	r.await("::ready", "the shell starting")
}

// quietPorts returns n free ports below the kernel's ephemeral range: the blocks listen on
// them seconds after they are chosen, and a port of the ephemeral range could meanwhile be
// handed to another test's listener or connection. Without the range to read, free ports.
func quietPorts(t *testing.T, n int) []int {
	t.Helper()
	raw, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	low := 0
	if err == nil {
		low, err = strconv.Atoi(strings.Fields(string(raw))[0])
	}
	if err != nil || low < 20000 {
		return harness.FreePorts(t, n)
	}
	var out []int
	for port := 10000 + rand.IntN(low-10000-n*4); len(out) < n && port < low; port++ {
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		out = append(out, port)
	}
	if len(out) < n {
		return harness.FreePorts(t, n)
	}
	return out
}

// send writes text to the shell.
func (r *blockRun) send(text string) {
	if _, err := io.WriteString(r.stdin, text); err != nil {
		r.t.Fatalf("write to the blocks' shell: %v", err)
	}
}

// await reads the shell's stdout up to the line want; a shell that exits first (a line failed
// under set -e) fails the test with what it was doing.
func (r *blockRun) await(want, doing string) {
	r.t.Helper()
	for r.lines.Scan() {
		if r.lines.Text() == want {
			return
		}
	}
	r.t.Fatalf("the shell exited during %s: %v\n%s", doing, r.lines.Err(), readText(r.shellErr))
}

// run runs block i: sourced in the shell, its output in files of its own.
func (r *blockRun) run(i int, b docBlock) {
	t := r.t
	t.Helper()
	script := filepath.Join(r.blocksDir, fmt.Sprintf("%03d.sh", i))
	if err := os.WriteFile(script, []byte(b.code), 0o600); err != nil {
		t.Fatal(err)
	}
	res := blockResult{block: b, out: filepath.Join(r.outTo, fmt.Sprintf("%03d.out", i)), err: filepath.Join(r.outTo, fmt.Sprintf("%03d.err", i))}
	marker := fmt.Sprintf("::done %03d", i)
	began := time.Now()
	r.send(fmt.Sprintf(". %q > %q 2> %q < /dev/null\necho %q\n", script, res.out, res.err, marker))
	for r.lines.Scan() {
		if r.lines.Text() == marker {
			res.took = time.Since(began)
			r.results = append(r.results, res)
			return
		}
	}
	t.Fatalf("%s failed:\n%s\n--- its stderr:\n%s\n--- its stdout:\n%s", b.where(), b.code, tail(res.stderr(), 4000), tail(res.stdout(), 2000))
}

// tail is the last n bytes of s.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// finish checks that the blocks left nothing running and the clone as it was.
func (r *blockRun) finish() {
	t := r.t
	// A job whose work is done may take a moment to exit (go run, once the plane it ran has).
	r.send("for i in $(seq 50); do [ -z \"$(jobs -pr)\" ] && break; sleep 0.1; done\necho \"::jobs $(jobs -pr | tr '\\n' ' ')\"\n")
	for r.lines.Scan() {
		if left, ok := strings.CutPrefix(r.lines.Text(), "::jobs "); ok {
			if strings.TrimSpace(left) != "" {
				t.Errorf("the documents' blocks left processes running: %s (each document stops what it starts)", left)
			}
			break
		}
	}
	if err := r.stdin.Close(); err != nil {
		t.Error(err)
	}
	if st := gitOut(t, r.clone, "status", "--porcelain"); st != "" {
		t.Errorf("after the blocks, git status in the clone is not clean (what they write belongs under .authplane/):\n%s", st)
	}
	for _, line := range strings.Split(gitOut(t, r.clone, "status", "--porcelain", "--ignored"), "\n") {
		if path, ok := strings.CutPrefix(line, "!! "); ok && !strings.HasPrefix(path, ".authplane/") {
			t.Errorf("the blocks wrote %s, ignored by git but outside .authplane/: keep what the steps write in the state directory", path)
		}
	}
}

// section is what the current section's blocks printed, in order.
func (r *blockRun) section() []blockResult { return r.results[r.sectionFrom:] }

// jsonLines are the JSON objects the section's blocks printed on stdout, one a line, in order.
func (r *blockRun) jsonLines() []map[string]any {
	var out []map[string]any
	for _, res := range r.section() {
		for _, line := range strings.Split(res.stdout(), "\n") {
			var m map[string]any
			if strings.HasPrefix(line, "{") && json.Unmarshal([]byte(line), &m) == nil {
				out = append(out, m)
			}
		}
	}
	return out
}

// find is the first of lines for which ok holds; the test fails without one.
func (r *blockRun) find(lines []map[string]any, what string, ok func(map[string]any) bool) map[string]any {
	r.t.Helper()
	for _, l := range lines {
		if ok(l) {
			return l
		}
	}
	r.t.Errorf("%s: no line of the section's output is %s; it printed:\n%s", r.section()[0].block.section(), what, r.printed())
	return map[string]any{}
}

// printed is everything the section's blocks printed on stdout.
func (r *blockRun) printed() string {
	var b strings.Builder
	for _, res := range r.section() {
		b.WriteString(res.stdout())
	}
	return tail(b.String(), 6000)
}

// str is the string at a dotted path of a JSON object ("" when there is none).
func str(m map[string]any, path string) string {
	var v any = m
	for _, k := range strings.Split(path, ".") {
		obj, ok := v.(map[string]any)
		if !ok {
			return ""
		}
		v = obj[k]
	}
	switch x := v.(type) {
	case string:
		return x
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64)
	case bool:
		return strconv.FormatBool(x)
	case nil:
		return ""
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	return string(raw)
}

// isRefusal reports whether m is a refusal with code whose message contains text.
func isRefusal(m map[string]any, code, text string) bool {
	return str(m, "error.code") == code && strings.Contains(str(m, "error.message"), text)
}

// plane is what the tests reach of the plane whose state directory is dir (under $D).
func (r *blockRun) plane(dir string) *harness.TestPlane {
	return harness.BinaryPlane(r.t, harness.ReadServiceInfo(r.t, filepath.Join(r.d, dir), 30*time.Second))
}

// summaries are the instance and epoch of every plane a section's blocks started, in the
// order their start summaries name them.
func (r *blockRun) summaries(want int) [][2]string {
	t := r.t
	t.Helper()
	re := regexp.MustCompile(`(?m)^authplane \S+ serving space "default"\n  instance  (\S+) \(epoch (\d+)\)$`)
	var got [][2]string
	testkit.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		got = nil
		for _, res := range r.section() {
			for _, m := range re.FindAllStringSubmatch(res.stdout(), -1) {
				got = append(got, [2]string{m[1], m[2]})
			}
		}
		if len(got) < want {
			return fmt.Errorf("%d start summaries in the section's output, want %d", len(got), want)
		}
		return nil
	})
	return got
}

// blockChecks check, after the last sh block of each section, that what the section's text
// promises happened.
var blockChecks = map[string]func(r *blockRun){
	"README.md#Try it":                           checkTryIt,
	"docs/OPERATIONS.md#":                        checkInstalled,
	"docs/OPERATIONS.md#Bootstrap a cluster":     checkClusterServes,
	"docs/OPERATIONS.md#Grant scopes":            func(r *blockRun) { checkScopes(r, r.plane("plane1")) },
	"docs/OPERATIONS.md#Revoke a run":            checkRunRevoked,
	"docs/OPERATIONS.md#Read the audit trail":    checkTrailRead,
	"docs/OPERATIONS.md#Read the metrics":        checkMetricsRead,
	"docs/OPERATIONS.md#Rotate bearer keys":      checkKeysRotated,
	"docs/OPERATIONS.md#Rotate the signing keys": checkSigningRotated,
	"docs/OPERATIONS.md#Back up and restore":     checkRestored,
	"docs/OPERATIONS.md#Move a plane":            checkPlanesMoved,
	"docs/OPERATIONS.md#Stop the space":          checkSpaceStopped,
	"docs/PROTOCOL.md#Walk through it":           checkWalkThrough,
}

// checkTryIt: the refusal without scope, then a prepare with the supervisor and executor and a
// proof, an activate with the other three, and the plane stopped.
func checkTryIt(r *blockRun) {
	lines := r.jsonLines()
	r.find(lines, "the refusal of a prepare without scope", func(m map[string]any) bool {
		return isRefusal(m, "permission-denied", `needs scope "supervise"`)
	})
	r.find(lines, "the prepare's supervisor and executor, its proof and epoch 0", func(m map[string]any) bool {
		return str(m, "operation") == "prepare" && str(m, "expires.supervisor") != "" && str(m, "expires.executor") != "" &&
			strings.HasPrefix(str(m, "registrationProof"), "sha256:") && str(m, "processEpoch") == "0" && str(m, "gateRevision") != ""
	})
	r.find(lines, "the activate's three duties and the next proof", func(m map[string]any) bool {
		return str(m, "operation") == "activate" && str(m, "duties") == `["goalWriter","serve","sessionLedger"]` && strings.HasPrefix(str(m, "nextRegistrationProof"), "sha256:")
	})
	// nats micro info shows one instance (the first to answer), its five endpoints.
	if out := r.printed(); len(regexp.MustCompile(`Service: cotal-auth \(\S+\)`).FindAllString(out, -1)) != 1 || !strings.Contains(out, "Statistics for 5 Endpoint(s)") {
		r.t.Errorf("README's micro info: got\n%s\nwant one service instance and its five endpoints", out)
	}
	if !strings.Contains(r.printed(), "stopped the plane of .authplane") {
		r.t.Errorf("README's stop: got\n%s\nwant the plane stopped", r.printed())
	}
}

// checkInstalled: go install put the binary on the blocks' PATH.
func checkInstalled(r *blockRun) {
	if _, err := os.Stat(filepath.Join(r.tmp, "bin", "authplane")); err != nil {
		r.t.Fatalf("OPERATIONS' go install: %v", err)
	}
}

// checkClusterServes: two replicas of two instances at epoch 0 serve one service on a cluster
// whose stores have three replicas.
func checkClusterServes(r *blockRun) {
	t := r.t
	s := r.summaries(2)
	if s[0][0] == s[1][0] || s[0][1] != "0" || s[1][1] != "0" {
		t.Errorf("the replicas' summaries: got %v, want two instances at epoch 0", s)
	}
	p := r.plane("plane1")
	groups := harness.ByInstance(harness.ServiceInstances(t, p.Ops(t)))
	if len(groups[s[0][0]]) == 0 || len(groups[s[1][0]]) == 0 {
		t.Errorf("service instances by plane: %v, want %s and %s", harness.Keys(groups), s[0][0], s[1][0])
	}
	info, err := harness.StreamInfo(t, p, subjects.AuthBucket(harness.TestSpace))
	if err != nil || info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
		t.Errorf("the fences' stream: got %+v %v, want 3 replicas on the cluster", info, err)
	}
}

// checkScopes: the ledger holds exactly the scopes the guide granted and cleared.
func checkScopes(r *blockRun, p *harness.TestPlane) {
	for principal, want := range map[string][]string{
		"u_aaaaaaaaaaaaaaaaaaaaaaaaaa.cli": {"supervise"}, "u_bbbbbbbbbbbbbbbbbbbbbbbbbb.oncall": {"admin"},
		"u_cccccccccccccccccccccccccc.leaver": nil,
	} {
		var row struct{ Scope []string }
		harness.ReadRecord(r.t, p, subjects.ActorsBucket(harness.TestSpace), "$KV."+subjects.ActorsBucket(harness.TestSpace)+".actor."+principal, &row)
		if !slices.Equal(row.Scope, want) {
			r.t.Errorf("ledger row of %s: scope %v, want %v", principal, row.Scope, want)
		}
	}
}

// checkRunRevoked: the run was admitted, the admin on call revoked it, and the stored marker is
// the one the reply carried.
func checkRunRevoked(r *blockRun) {
	t := r.t
	lines := r.jsonLines()
	adm := r.find(lines, "the admission", func(m map[string]any) bool {
		return str(m, "runId") != "" && str(m, "instanceId") != "" && str(m, "caller.owner") != ""
	})
	rev := r.find(lines, "the revocation by the admin on call", func(m map[string]any) bool {
		return str(m, "kind") == "manager-run-revoke" && str(m, "revocation.by") == "u_bbbbbbbbbbbbbbbbbbbbbbbbbb.oncall"
	})
	runID := str(adm, "runId")
	if str(rev, "runId") != runID || runID == "" {
		t.Fatalf("revoked %q, want the admitted run %q", str(rev, "runId"), runID)
	}
	r.revoked = runID
	// The run's owner has a witness stream of its own, replicated on the cluster, with the
	// default budgets, and no stream is shared by every owner.
	p := r.plane("plane1")
	info, err := harness.StreamInfo(t, p, subjects.WitnessStream(harness.TestSpace, harness.OwnerA))
	if err != nil || info.Config.Replicas != 3 || info.Config.MaxMsgs != store.DefaultWitnessRuns || info.Config.MaxBytes != store.DefaultWitnessBytes {
		t.Errorf("the run's owner's witness: got %+v %v, want 3 replicas, %d run-starts in %d bytes", info, err, store.DefaultWitnessRuns, store.DefaultWitnessBytes)
	}
	if _, err := p.JS(t).Stream(t.Context(), subjects.SharedWitnessStream(harness.TestSpace)); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("a shared witness stream: %v, want none", err)
	}
	var marker map[string]any
	if err := json.Unmarshal(harness.MarkerOf(t, p, runID), &marker); err != nil || str(marker, "reason") != "stopped by the operator on call" ||
		str(marker, "revokedAt") != str(rev, "revocation.revokedAt") {
		t.Errorf("the stored marker %v (%v), want the reply's %v", marker, err, rev["revocation"])
	}
}

// checkTrailRead: the auditor read the refusal on record, the newest mint, and the record of
// one key found among its instance's.
func checkTrailRead(r *blockRun) {
	out := r.printed()
	// The last want is the one key's minted record: the supervisor's, among its mint's credentials.
	for _, want := range []string{`"decision":"refused"`, `"caller":"u_bbbbbbbbbbbbbbbbbbbbbbbbbb.oncall"`, `"code":"permission-denied"`, `"duty":`, "Information for Stream cotal_audit_default",
		`"credentials":[{"duty":"supervisor","nkey":"U`} {
		if !strings.Contains(out, want) {
			r.t.Errorf("the auditor's reads: want %s in:\n%s", want, out)
		}
	}
}

// checkMetricsRead: each replica's scrape says its epoch and that it is not fenced, and the two
// counted the guide's calls (the queue group gives each call to either).
func checkMetricsRead(r *blockRun) {
	t := r.t
	calls := 0.0
	for _, res := range r.section() {
		body := res.stdout()
		for _, want := range []string{"authplane_process_epoch 0", "authplane_fenced 0", `authplane_nats_reconnects_total{conn="store"} 0`} {
			if !strings.Contains(body, want) {
				t.Errorf("/metrics: want %q in:\n%s", want, body)
			}
		}
		// Each replica counts the data account's connections of the whole space: both replicas'
		// serving users are the plane's own on each scrape.
		if m := regexp.MustCompile(`(?m)^authplane_data_connections\{who="plane"\} (\d+)$`).FindStringSubmatch(body); m == nil || m[1] < "2" {
			t.Errorf("/metrics: the plane's own connections counted %v, want both replicas' serving users, in:\n%s", m, body)
		}
		for _, line := range strings.Split(body, "\n") {
			if strings.HasPrefix(line, "authplane_requests_total{") && strings.Contains(line, `code="ok"`) {
				n, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
				if err != nil {
					t.Fatalf("/metrics: %q: %v", line, err)
				}
				calls += n
			}
		}
	}
	if calls < 3 {
		t.Errorf("/metrics: the two replicas served %v calls, want the guide's prepare, activate and revocation at least", calls)
	}
}

// checkKeysRotated: after the rotation two keys are listed and published, and the new one signs.
func checkKeysRotated(r *blockRun) {
	t := r.t
	sec := r.section()
	if len(sec) != 1 {
		t.Fatalf("want one block, got %d", len(sec))
	}
	out := sec[0].stdout()
	last := out[strings.Index(out, "rotated: "):]
	var listed []string
	for _, line := range strings.Split(last, "\n") {
		if strings.Contains(line, "  added ") {
			listed = append(listed, line)
		}
	}
	if len(listed) != 2 || !strings.Contains(last, "signs") || !strings.Contains(last, "may retire from") {
		t.Errorf("keys list after the rotation: got %q, want the new key signing and the old one stopped", last)
	}
	i := strings.LastIndex(out, `{"keys":`)
	var set struct {
		Keys []struct {
			KID string `json:"kid"`
		} `json:"keys"`
	}
	if i < 0 || json.Unmarshal([]byte(strings.TrimSpace(out[i:])), &set) != nil || len(set.Keys) != 2 {
		t.Errorf("/jwks after the rotation: got %q, want both keys published", out)
	}
	for _, k := range set.Keys {
		if !strings.Contains(last, k.KID) {
			t.Errorf("/jwks publishes %s, which keys list does not show", k.KID)
		}
	}
}

// checkSigningRotated: the scheduled rotation switched to generation 1 confirmed by the three
// servers and keeps generation 0 listed; the emergency one superseded it, was confirmed by all
// three, replaced the bearer key and left no connection of the old keys; and the broker's JWT
// lists generation 2's key and neither older one.
func checkSigningRotated(r *blockRun) {
	t := r.t
	sec := r.section()
	if len(sec) != 2 {
		t.Fatalf("want two blocks, got %d", len(sec))
	}
	scheduled, emergency := sec[0].stdout(), sec[1].stdout()
	for _, want := range []string{"generation 0 signs; generation 0 keys the registration proofs", "scheduled rotation ",
		"generation 0 to 1: generation 1 signs; generation 0 stays listed until", "confirmed by servers: n1, n2, n3"} {
		if !strings.Contains(scheduled, want) {
			t.Errorf("the scheduled rotation printed %q, want it to say %q", scheduled, want)
		}
	}
	for _, want := range []string{"emergency rotation ", "generation 1 to 2: done", "confirmed by servers: n1, n2, n3",
		"every other bearer key is retired", "connections of the old keys still listed: 0",
		"generation 2 signs; generation 2 keys the registration proofs"} {
		if !strings.Contains(emergency, want) {
			t.Errorf("the emergency rotation printed %q, want it to say %q", emergency, want)
		}
	}
	p := r.plane("plane1")
	keys := harness.Generations(t, p)
	claims, _ := harness.DataAccountAtBroker(t, p)
	for gen, want := range map[uint64]bool{0: false, 1: false, 2: true} {
		if _, listed := claims.SigningKeys[harness.MainKey(t, keys, gen)]; listed != want {
			t.Errorf("after the emergency rotation: generation %d's key listed %v, want %v", gen, listed, want)
		}
	}
}

// checkRestored: the copy was cold (every process had exited before cp ran), and after the
// restore the scopes and the revocation are still there.
func checkRestored(r *blockRun) {
	t := r.t
	p := r.plane("plane1")
	checkScopes(r, p)
	if harness.MarkerOf(t, p, r.revoked) == nil {
		t.Errorf("after the restore: run %s has no revocation marker, want the one from before the backup", r.revoked)
	}
	if _, err := os.Stat(filepath.Join(r.d, "backup", "n1", "jetstream")); err != nil {
		t.Errorf("the backup of n1: %v", err)
	}
	if !strings.Contains(r.section()[0].stdout(), "stopped the plane of "+filepath.Join(r.d, "plane1")) {
		t.Errorf("the backup's stop: got %q, want plane1 stopped before the copy", r.section()[0].stdout())
	}
}

// checkPlanesMoved: each moved plane is the same instance, one epoch on.
func checkPlanesMoved(r *blockRun) {
	s := r.summaries(4)
	for i, moved := range []string{"plane3", "solo"} {
		from, to := s[2*i], s[2*i+1]
		epoch, err := strconv.Atoi(from[1])
		if err != nil || to[0] != from[0] || to[1] != strconv.Itoa(epoch+1) {
			r.t.Errorf("%s moved: got instance %s epoch %s, then %s epoch %s: want the same instance one epoch on", moved, from[0], from[1], to[0], to[1])
		}
	}
}

// checkSpaceStopped: every replica's lock is free and no server listens.
func checkSpaceStopped(r *blockRun) {
	for _, dir := range []string{"plane1", "plane2", "plane3-new-host", "solo-new-place"} {
		if _, err := admin.Stop(r.t.Context(), filepath.Join(r.d, dir)); !errors.Is(err, admin.ErrNotRunning) {
			r.t.Errorf("after the space stopped, %s: %v, want no plane running", dir, err)
		}
	}
	for _, name := range []string{"C1", "C2", "C3"} {
		if c, err := net.Dial("tcp", "127.0.0.1:"+r.ports[name]); err == nil {
			r.t.Errorf("a server still listens on %s after the space stopped", r.ports[name])
			if err := c.Close(); err != nil {
				r.t.Error(err)
			}
		}
	}
}

// checkWalkThrough: every request of the walk through was answered as its text says.
func checkWalkThrough(r *blockRun) {
	t := r.t
	lines := r.jsonLines()
	r.find(lines, "renew's supervisor and executor", func(m map[string]any) bool {
		return str(m, "operation") == "renew" && str(m, "duties") == `["executor","supervisor"]`
	})
	r.find(lines, "renewStandingBundle's five", func(m map[string]any) bool {
		return str(m, "operation") == "renewStandingBundle" && str(m, "duties") == `["executor","goalWriter","serve","sessionLedger","supervisor"]`
	})
	adm := r.find(lines, "the admission", func(m map[string]any) bool { return str(m, "kind") == "manager-run-admission" && str(m, "runId") != "" })
	run := str(adm, "runId")
	r.find(lines, "the attempt's hold at epoch 1", func(m map[string]any) bool {
		return str(m, "kind") == "manager-run-attempt" && str(m, "hold.runId") == run && str(m, "hold.epoch") == "1" && str(m, "actor") == "wf_"+strings.TrimPrefix(run, "run-")
	})
	r.find(lines, "the driver's status report", func(m map[string]any) bool {
		return str(m, "kind") == "manager-run-status" && str(m, "runId") == run && str(m, "status.state") == "running"
	})
	r.find(lines, "the driver's renewal", func(m map[string]any) bool {
		return str(m, "operation") == "renewRunDriver" && str(m, "duties") == `["driver","mediator"]`
	})
	var markers []string
	for _, m := range lines {
		if str(m, "runId") == run && str(m, "reason") == "stopped by its owner" {
			markers = append(markers, str(m, "revokedAt"))
		}
	}
	if len(markers) != 2 || markers[0] != markers[1] {
		t.Errorf("the revocation and its repeat: got markers revoked at %v, want the same one twice", markers)
	}
	r.find(lines, "the renewal of a revoked run refused", func(m map[string]any) bool { return isRefusal(m, "permission-denied", "was revoked") })
	r.find(lines, "the assignment", func(m map[string]any) bool { return str(m, "state") == "assigned" && str(m, "revision") != "" })
	r.find(lines, "the supervised prepare, clamped to the assignment's end", func(m map[string]any) bool {
		sup, err := strconv.ParseInt(str(m, "expires.supervisor"), 10, 64)
		return str(m, "operation") == "prepare" && err == nil && sup <= time.Now().Add(time.Hour).Unix()+5 && sup >= time.Now().Add(time.Hour).Unix()-600
	})
	r.find(lines, "the end's report", func(m map[string]any) bool {
		return str(m, "assignment.state") == "ended" && str(m, "retired") == "retired" && str(m, "revoked") == "true" && str(m, "evicted.complete") == "true"
	})
	r.find(lines, "/health ok", func(m map[string]any) bool {
		return str(m, "ok") == "true" && str(m, "issuer") == "urn:cotal:auth:default"
	})
	r.find(lines, "a published key", func(m map[string]any) bool { return str(m, "alg") == "EdDSA" && str(m, "kid") != "" })
	r.find(lines, "the agent's prepare refused as the agent", func(m map[string]any) bool {
		return isRefusal(m, "permission-denied", "caller u_aaaaaaaaaaaaaaaaaaaaaaaaaa.worker needs scope")
	})
	r.find(lines, "the loopback exchange without the capability refused", func(m map[string]any) bool {
		return str(m, "code") == "unauthenticated" && strings.Contains(str(m, "error"), "capability")
	})
	r.find(lines, "the loopback exchange with the capability", func(m map[string]any) bool {
		return str(m, "owner") == "u_aaaaaaaaaaaaaaaaaaaaaaaaaa" && str(m, "exp") != ""
	})
	r.find(lines, "the revoked agent's exchange refused", func(m map[string]any) bool {
		return str(m, "code") == "unauthenticated" && strings.Contains(str(m, "error"), "unknown agent or wrong secret")
	})
	if out := r.printed(); !strings.Contains(out, `authplane_credentials_issued_total{duty="caller",endpoint="auth-callout"} 1`) {
		t.Errorf("/metrics after the walk through: want the callout's one caller credential, got:\n%s", out)
	}
	if !strings.Contains(r.printed(), "stopped the plane of .authplane") {
		t.Errorf("the walk through's stop: got\n%s\nwant the plane stopped", r.printed())
	}
}
