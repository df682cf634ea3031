package documents

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

var (
	// backticked is every `token` of a document; a token with a slash is a repository path.
	backticked = regexp.MustCompile("`([^`\\s]+)`")
	// pathRow is a row of ARCHITECTURE.md's renewal path: | step | `file` | `Recv.Func` | … |
	pathRow = regexp.MustCompile("(?m)^\\| (\\d+) \\| `([^`]+)` \\| `([^`]+)` \\|")
	// layerRow is a row of ARCHITECTURE.md's layer table: | layer | `pkg`, `pkg` | … |
	layerRow = regexp.MustCompile("(?m)^\\| ([a-z ]+) \\| (`[^|]+`) \\|")
	// readmeLayer is a line of the README's layer block: the layer, then its packages.
	readmeLayer = regexp.MustCompile(`(?m)^(vocabulary|core|platform|capabilities|edges|programs|test support) {2,}(.+)$`)
)

// architectureLayers parses ARCHITECTURE.md's layer table: each layer, bottom up, with its
// packages (directories relative to the repository's root).
func architectureLayers(t *testing.T, doc string) (names []string, pkgs [][]string) {
	t.Helper()
	_, table, ok := strings.Cut(doc, "## The packages by layer")
	if !ok {
		t.Fatal("ARCHITECTURE.md has no section The packages by layer")
	}
	table, _, _ = strings.Cut(table, "\n## ")
	for _, m := range layerRow.FindAllStringSubmatch(table, -1) {
		var in []string
		for _, p := range backticked.FindAllStringSubmatch(m[2], -1) {
			in = append(in, p[1])
		}
		names, pkgs = append(names, m[1]), append(pkgs, in)
	}
	if len(names) < 4 {
		t.Fatalf("ARCHITECTURE.md's layer table has %d layers, want the core, platform, capabilities, edges and the rest", len(names))
	}
	return names, pkgs
}

// goPackages are the directories of the repository's production packages (outside
// integration/ and testdata), each with the module paths its non-test files import.
func goPackages(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	err := filepath.WalkDir(repoRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(repoRoot, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() && (rel == "integration" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) && rel != "." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		dir := filepath.ToSlash(filepath.Dir(rel))
		if _, ok := out[dir]; !ok {
			out[dir] = nil // a package without imports is a package all the same
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			out[dir] = append(out[dir], p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// modulePath is the module's path, from go.mod.
func modulePath(t *testing.T) string {
	t.Helper()
	for line := range strings.Lines(readDoc(t, "go.mod")) {
		if p, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
			return p
		}
	}
	t.Fatal("go.mod names no module")
	return ""
}

// TestArchitectureNamesWhatExists: every path ARCHITECTURE.md names is a file or directory of
// the repository, and every step of the renewal's path names a function its file declares.
func TestArchitectureNamesWhatExists(t *testing.T) {
	doc := readDoc(t, "ARCHITECTURE.md")
	paths := 0
	for _, m := range backticked.FindAllStringSubmatch(doc, -1) {
		p := m[1]
		if !strings.Contains(p, "/") || strings.ContainsAny(p, "<>") {
			continue
		}
		paths++
		if _, err := os.Stat(filepath.Join(repoRoot, p)); err != nil {
			t.Errorf("ARCHITECTURE.md names %s, which is gone: %v", p, err)
		}
	}
	steps := pathRow.FindAllStringSubmatch(doc, -1)
	if paths < 20 || len(steps) < 20 {
		t.Fatalf("ARCHITECTURE.md names %d paths and %d steps of a renewal; the parse lost them", paths, len(steps))
	}
	for i, m := range steps {
		if n, _ := strconv.Atoi(m[1]); n != i+1 {
			t.Errorf("step %s of the renewal's path is numbered out of order (want %d)", m[1], i+1)
		}
		file, fn := m[2], m[3]
		raw, err := os.ReadFile(filepath.Join(repoRoot, file))
		if err != nil {
			t.Errorf("step %s names %s, which is gone: %v", m[1], file, err)
			continue
		}
		recv, name, ok := strings.Cut(fn, ".")
		decl := `func ` + regexp.QuoteMeta(recv) + `[\[(]`
		if ok {
			decl = `func \(\w+ \*?` + regexp.QuoteMeta(recv) + `(\[[^\]]*\])?\) ` + regexp.QuoteMeta(name) + `[\[(]`
		}
		if !regexp.MustCompile(`(?m)^` + decl).Match(raw) {
			t.Errorf("step %s names %s in %s, which it does not declare", m[1], fn, file)
		}
	}
}

// TestArchitectureLayersHoldEveryPackageAndNoArrowPointsUp: ARCHITECTURE.md's layer table puts
// every production package in exactly one layer, no package imports one of a higher layer, and
// the README's layer block says the same. The core's, the platform's and the capabilities'
// packages live under internal/core, internal/platform and internal/capability.
func TestArchitectureLayersHoldEveryPackageAndNoArrowPointsUp(t *testing.T) {
	names, layers := architectureLayers(t, readDoc(t, "ARCHITECTURE.md"))
	layerOf := map[string]int{}
	for i, pkgs := range layers {
		for _, p := range pkgs {
			if prev, dup := layerOf[p]; dup {
				t.Errorf("%s is in layers %s and %s", p, names[prev], names[i])
			}
			layerOf[p] = i
		}
	}
	pkgs := goPackages(t)
	for dir := range pkgs {
		if _, ok := layerOf[dir]; !ok {
			t.Errorf("package %s is in no layer of ARCHITECTURE.md", dir)
		}
	}
	for p := range layerOf {
		if _, ok := pkgs[p]; !ok {
			t.Errorf("ARCHITECTURE.md's layers name %s, which is no package", p)
		}
	}
	// The layout shows the layers: a package under internal/<dir>/ is of that directory's layer.
	for dir, layer := range map[string]string{"internal/core/": "core", "internal/platform/": "platform", "internal/capability/": "capabilities"} {
		for p, i := range layerOf {
			if strings.HasPrefix(p, dir) && names[i] != layer {
				t.Errorf("%s is in the layer %s, but its directory is the %s layer's", p, names[i], layer)
			}
		}
	}
	module := modulePath(t) + "/"
	for dir, imports := range pkgs {
		from, ok := layerOf[dir]
		if !ok {
			continue
		}
		for _, imp := range imports {
			to, ok := layerOf[strings.TrimPrefix(imp, module)]
			if strings.HasPrefix(imp, module) && ok && to > from {
				t.Errorf("%s (%s) imports %s (%s): an arrow pointing up", dir, names[from], strings.TrimPrefix(imp, module), names[to])
			}
		}
	}

	readme := readDoc(t, "README.md")
	seen := map[string]bool{}
	for _, m := range readmeLayer.FindAllStringSubmatch(readme, -1) {
		i := slices.Index(names, m[1])
		if i < 0 {
			t.Errorf("the README's layer %s is not a layer of ARCHITECTURE.md", m[1])
			continue
		}
		seen[m[1]] = true
		var got []string
		for _, field := range strings.Fields(m[2]) {
			got = append(got, expandBraces(field)...)
		}
		want := slices.Clone(layers[i])
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("the README's layer %s holds %v; ARCHITECTURE.md's holds %v", m[1], got, want)
		}
	}
	for _, n := range names {
		if !seen[n] {
			t.Errorf("the README's layer block has no line for the layer %s", n)
		}
	}
}

// expandBraces spells `internal/{a,b}` as internal/a and internal/b.
func expandBraces(s string) []string {
	head, rest, ok := strings.Cut(s, "{")
	if !ok {
		return []string{s}
	}
	inner, tail, _ := strings.Cut(rest, "}")
	var out []string
	for part := range strings.SplitSeq(inner, ",") {
		out = append(out, head+part+tail)
	}
	return out
}
