package documents

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/core/audit"
	"github.com/cotal-ai/authplane/internal/core/fault"
)

// readDoc is the text of a document, relative to the repository's root.
func readDoc(t *testing.T, path string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot, path))
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

var (
	// testRef is how docs/SECURITY.md names tests: a `path` (a _test.go file, or a package's
	// directory), then the names of its tests.
	testRef  = regexp.MustCompile("`([a-z0-9_/.-]+)`|\\b(Test[A-Za-z0-9_]+|Fuzz[A-Za-z0-9_]+)\\b")
	testFunc = regexp.MustCompile(`(?m)^func ((?:Test|Fuzz)[A-Za-z0-9_]+)\(`)
)

// testsIn lists the test functions of path: a _test.go file, or every _test.go file of a
// package's directory.
func testsIn(t *testing.T, path string) []string {
	t.Helper()
	files := []string{filepath.Join(repoRoot, path)}
	if !strings.HasSuffix(path, "_test.go") {
		var err error
		if files, err = filepath.Glob(filepath.Join(repoRoot, path, "*_test.go")); err != nil {
			t.Fatal(err)
		}
	}
	var out []string
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Errorf("%s: %v", path, err)
			continue
		}
		for _, m := range testFunc.FindAllStringSubmatch(string(raw), -1) {
			out = append(out, m[1])
		}
	}
	return out
}

// isTestPlace reports whether path (relative to the repository's root) is a _test.go file or a
// directory of the repository: where SECURITY.md says the tests that follow it are.
func isTestPlace(path string) bool {
	fi, err := os.Stat(filepath.Join(repoRoot, path))
	return err == nil && (fi.IsDir() || strings.HasSuffix(path, "_test.go"))
}

// TestSecurityNamesOnlyTestsThatExist: every test docs/SECURITY.md names as a promise's proof
// is a test function of the file or package named before it.
func TestSecurityNamesOnlyTestsThatExist(t *testing.T) {
	doc := readDoc(t, "docs/SECURITY.md")
	_, proven, ok := strings.Cut(doc, "## What is proven")
	if !ok {
		t.Fatal("docs/SECURITY.md has no section What is proven")
	}
	where, named := "", 0
	for _, m := range testRef.FindAllStringSubmatch(proven, -1) {
		switch {
		case m[1] != "" && isTestPlace(m[1]):
			where = m[1]
		case m[2] != "":
			named++
			if where == "" {
				t.Errorf("SECURITY.md names %s before any file or package", m[2])
			} else if !slices.Contains(testsIn(t, where), m[2]) {
				t.Errorf("SECURITY.md names %s in %s, which has no such test", m[2], where)
			}
		}
	}
	if named < 40 {
		t.Errorf("SECURITY.md names %d tests; the reader is broken", named)
	}
}

var (
	// issueRef is a reference to an issue of the tracker: "issue 21", "issues 17".
	issueRef = regexp.MustCompile(`(?i)\bissues? #?\d+`)
	// commitRef is a word that may be a commit hash: 7 to 40 hex digits with a digit among them
	// (a word of the letters a to f alone is English).
	commitRef = regexp.MustCompile(`\b[0-9a-f]{7,40}\b`)
)

// TestBenchmarksIsReferenceNotHistory: BENCHMARKS.md says what a request costs today; the
// history of how it got there is in docs/decisions/. It names no issue, and a commit only on
// its one "measured at" line.
func TestBenchmarksIsReferenceNotHistory(t *testing.T) {
	measured := 0
	for i, line := range strings.Split(readDoc(t, "BENCHMARKS.md"), "\n") {
		if m := issueRef.FindString(line); m != "" {
			t.Errorf("BENCHMARKS.md:%d names %q: an issue is history, which goes in docs/decisions/", i+1, m)
		}
		if strings.Contains(line, "measured at ") {
			measured++
			continue
		}
		for _, m := range commitRef.FindAllString(line, -1) {
			if strings.ContainsAny(m, "0123456789") {
				t.Errorf("BENCHMARKS.md:%d names %q outside its measured-at line", i+1, m)
			}
		}
	}
	if measured != 1 {
		t.Errorf("BENCHMARKS.md has %d lines saying where its figures were measured at, want one", measured)
	}
}

// operationsRow is a row of OPERATIONS.md's table of what each refusal code means.
var operationsRow = regexp.MustCompile("(?m)^\\| `([a-z-]+)` \\| (\\d+) \\| ([^|]+) \\|")

// TestOperationsRefusalTableIsTheCodesTheyAre: OPERATIONS.md explains every code of the one
// table with its number, and a code it says this release answers nowhere is written nowhere in
// the code's refusals.
func TestOperationsRefusalTableIsTheCodesTheyAre(t *testing.T) {
	doc := readDoc(t, "docs/OPERATIONS.md")
	texts := refusalTexts(t)
	var listed []fault.Code
	for _, m := range operationsRow.FindAllStringSubmatch(doc, -1) {
		code := fault.Code(m[1])
		listed = append(listed, code)
		if n, err := strconv.Atoi(m[2]); err != nil || !code.Known() || code.Numeric() != n {
			t.Errorf("OPERATIONS.md: %s %s, want a code of fault's table with its number", m[1], m[2])
		}
		if strings.Contains(m[3], "answers it nowhere") {
			for _, c := range texts {
				if c.code == code {
					t.Errorf("OPERATIONS.md says nothing answers %s, and %s does: %q", code, c.at, c.format)
				}
			}
		}
	}
	for _, code := range fault.Codes() {
		if !slices.Contains(listed, code) {
			t.Errorf("OPERATIONS.md does not say what %s means", code)
		}
	}
}

// TestOperationsNamesEveryAuditDecision: the audit trail's section names every decision the
// audit stream records.
func TestOperationsNamesEveryAuditDecision(t *testing.T) {
	doc := readDoc(t, "docs/OPERATIONS.md")
	_, trail, _ := strings.Cut(doc, "## Read the audit trail")
	trail, _, _ = strings.Cut(trail, "```")
	for _, d := range []string{audit.Refused, audit.Discarded, audit.Admitted, audit.Revoked, audit.Assigned, audit.Ended, audit.Exchanged} {
		if !strings.Contains(trail, "`"+d+"`") {
			t.Errorf("OPERATIONS.md's audit trail does not name the %s records", d)
		}
	}
}

// TestREADMESaysWhatCIDoes: the README's account of .ci/run is the script's: the fuzz budget,
// and the tools it installs.
func TestREADMESaysWhatCIDoes(t *testing.T) {
	readme, ci := readDoc(t, "README.md"), readDoc(t, ".ci/run")
	if !strings.Contains(ci, "-test.fuzztime 20000x") || !strings.Contains(readme, "every fuzz target for\n20,000 inputs") && !strings.Contains(readme, "every fuzz target for 20,000 inputs") {
		t.Error("README.md and .ci/run disagree on how long each fuzz target runs")
	}
	for _, tool := range []string{"github.com/nats-io/natscli/nats@v0.5.0", "github.com/nats-io/nats-server/v2@v2.15.2"} {
		if !strings.Contains(ci, "go install "+tool) {
			t.Errorf(".ci/run does not install %s, which the documents' blocks call", tool)
		}
	}
	if !strings.Contains(ci, "AUTHPLANE_REQUIRE_TOOLS=1") {
		t.Error(".ci/run does not make the blocks' test require its tools: a missing one would skip it")
	}
	if !strings.Contains(ci, "export AUTHPLANE_REQUIRE_FUSE=1") {
		t.Error(".ci/run does not make the power-cut tests require FUSE: where it cannot mount they would skip")
	}
}

// shellFunc is a shell function a block defines: name() {.
var shellFunc = regexp.MustCompile(`(?m)^([a-z_][a-z0-9_]*)\(\) \{`)

// TestNoDocumentDefinesOneNameTwice: within a document a shell function (the documents' short
// names for the nats CLI with one credential) means one thing; no document uses alias, which a
// script does not expand.
func TestNoDocumentDefinesOneNameTwice(t *testing.T) {
	byDoc := map[string]map[string]string{}
	for _, b := range readBlocks(t, repoRoot) {
		if b.lang != "sh" {
			continue
		}
		if strings.Contains(b.code, "\nalias ") || strings.HasPrefix(b.code, "alias ") {
			t.Errorf("%s: an alias; use a shell function", b.where())
		}
		if byDoc[b.file] == nil {
			byDoc[b.file] = map[string]string{}
		}
		for _, m := range shellFunc.FindAllStringSubmatch(b.code, -1) {
			if prev, ok := byDoc[b.file][m[1]]; ok {
				t.Errorf("%s defines %s(), which %s defined already", b.where(), m[1], prev)
			}
			byDoc[b.file][m[1]] = b.where()
		}
	}
}

// TestNoFileCitesADocumentOutsideTheRepository: the project's design and style notes live
// outside the repository; no file in it, Go comments included, cites them (the wire contract is
// docs/PROTOCOL.md, and the docs cite one another), nor a section sign that is not an RFC's.
func TestNoFileCitesADocumentOutsideTheRepository(t *testing.T) {
	t.Parallel() // it reads every file: it need not hold the parallel tests back
	outside := regexp.MustCompile(`\b(` + "DES" + `IGN|` + "STY" + `LE\.md|reference ` + "\u00a7)")
	section := regexp.MustCompile(`(RFC \d+ )?§\s?\d`)
	files := strings.Split(strings.TrimSpace(gitOut(t, repoRoot, "ls-files")), "\n")
	if len(files) < 100 {
		t.Fatalf("git ls-files lists %d files; the listing is broken", len(files))
	}
	for _, f := range files {
		raw, err := os.ReadFile(filepath.Join(repoRoot, f))
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if strings.ContainsRune(string(raw), 0) {
			continue // not text
		}
		for i, line := range strings.Split(string(raw), "\n") {
			if outside.MatchString(line) {
				t.Errorf("%s:%d cites a document outside the repository: %s", f, i+1, strings.TrimSpace(line))
			}
			for _, m := range section.FindAllStringSubmatch(line, -1) {
				if m[1] == "" {
					t.Errorf("%s:%d cites a section of a document outside the repository: %s", f, i+1, strings.TrimSpace(line))
				}
			}
		}
	}
}

// testSupport are the packages only tests may import.
var testSupport = []string{
	"github.com/cotal-ai/authplane/integration/internal/harness",
	"github.com/cotal-ai/authplane/internal/powercut",
	"github.com/cotal-ai/authplane/internal/testkit",
}

// TestNoProductionPackageImportsATestSupportPackage: no package outside integration/ imports a
// test-support package, directly or not (`go list`'s Deps, without the tests).
func TestNoProductionPackageImportsATestSupportPackage(t *testing.T) {
	cmd := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Deps}} {{.}}{{end}}`, "./...")
	cmd.Dir = repoRoot
	out, err := harness.Output(cmd)
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			t.Fatalf("go list: %v\n%s", err, exit.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		if strings.HasPrefix(fields[0], "github.com/cotal-ai/authplane/integration/") || slices.Contains(testSupport, fields[0]) {
			continue
		}
		checked++
		for _, dep := range fields[1:] {
			if slices.Contains(testSupport, dep) {
				t.Errorf("%s imports the test-support package %s", fields[0], dep)
			}
		}
	}
	if checked < 20 {
		t.Errorf("go list named %d packages outside the tests; the reader is broken", checked)
	}
}

// history is how a document would speak of what never shipped: "the original" it was ported
// from, or releases before this first one, with upgrades from them.
var history = regexp.MustCompile(`(?i)\bthe original\b|\b(earlier|older|previous|former|prior) releases?\b|\brelease (before|prior to)\b|\ban upgrade\b|\bupgrad(e|es|ing) from\b|\bpredates?\b`)

// No document refers to "the original" or to releases that never shipped: this is the first
// release, and the documents describe it, not its history (that is the git log's, and
// docs/decisions' dated records).
func TestNoDocumentSpeaksOfReleasesThatNeverShipped(t *testing.T) {
	docs := []string{"README.md", "BENCHMARKS.md"}
	entries, err := os.ReadDir(filepath.Join(repoRoot, "docs"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".md") {
			docs = append(docs, "docs/"+e.Name())
		}
	}
	for _, path := range docs {
		for i, line := range strings.Split(readDoc(t, path), "\n") {
			if m := history.FindString(line); m != "" {
				t.Errorf("%s:%d speaks of %q: %s", path, i+1, m, line)
			}
		}
	}
}
