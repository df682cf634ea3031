package documents

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/handlers"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// protocolPath is the wire contract the tests below hold the code to.
var protocolPath = filepath.Join(repoRoot, "docs", "PROTOCOL.md")

// docExample is a ```json block of docs/PROTOCOL.md whose info string names its role
// (request, reply or refusal) and what it is an example of.
type docExample struct {
	role, name, body string
	line             int
}

// docRefusal is a row of a refusal table: | `code` | `text` |, under its section.
type docRefusal struct {
	section, code, text string
	line                int
}

// docCode is a row of the code table: | `code` | numeric | HTTP status |.
type docCode struct {
	code            string
	numeric, status int
}

// protocolDoc is docs/PROTOCOL.md as these tests read it.
type protocolDoc struct {
	examples []docExample
	refusals []docRefusal
	codes    []docCode
}

var (
	refusalRow = regexp.MustCompile("^\\| `([a-z-]+)` \\| `((?:[^`\\\\]|\\\\.)+)`")
	codeRow    = regexp.MustCompile("^\\| `([a-z-]+)` \\| (\\d+) \\| (\\d+) \\|$")
)

func readProtocol(t *testing.T) protocolDoc {
	t.Helper()
	raw, err := os.ReadFile(protocolPath)
	if err != nil {
		t.Fatal(err)
	}
	var doc protocolDoc
	section, header := "", ""
	lines := strings.Split(string(raw), "\n")
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if !strings.HasPrefix(line, "|") {
			header = ""
		} else if header == "" {
			header = line
		}
		switch {
		case strings.HasPrefix(line, "#"):
			section = strings.TrimSpace(strings.TrimLeft(line, "#"))
		case strings.HasPrefix(line, "```json "):
			f := strings.Fields(strings.TrimPrefix(line, "```json "))
			if len(f) != 2 {
				t.Fatalf("PROTOCOL.md:%d: a json block's info string is `json <request|reply|refusal> <name>`, got %q", i+1, line)
			}
			start := i + 1
			var b []string
			for i++; i < len(lines) && lines[i] != "```"; i++ {
				b = append(b, lines[i])
			}
			doc.examples = append(doc.examples, docExample{role: f[0], name: f[1], body: strings.Join(b, "\n"), line: start})
		case codeRow.MatchString(line):
			m := codeRow.FindStringSubmatch(line)
			n, _ := strconv.Atoi(m[2])
			s, _ := strconv.Atoi(m[3])
			doc.codes = append(doc.codes, docCode{code: m[1], numeric: n, status: s})
		case header == "| code | text |" && refusalRow.MatchString(line):
			m := refusalRow.FindStringSubmatch(line)
			doc.refusals = append(doc.refusals, docRefusal{section: section, code: m[1], text: strings.ReplaceAll(m[2], `\|`, "|"), line: i + 1})
		}
	}
	return doc
}

// TestProtocolCodeTableIsTheOneRefusalTable: every code of the table in docs/PROTOCOL.md is in
// fault's table with the numeric and the HTTP status the document says, and every code of
// fault's table is in the document.
func TestProtocolCodeTableIsTheOneRefusalTable(t *testing.T) {
	doc := readProtocol(t)
	var listed []fault.Code
	for _, c := range doc.codes {
		code := fault.Code(c.code)
		listed = append(listed, code)
		switch {
		case !code.Known():
			t.Errorf("PROTOCOL.md lists code %q, which fault's table does not have", c.code)
		case code.Numeric() != c.numeric || code.HTTPStatus() != c.status:
			t.Errorf("code %s: PROTOCOL.md says %d and HTTP %d, got %d and %d from fault", c.code, c.numeric, c.status, code.Numeric(), code.HTTPStatus())
		}
	}
	for _, code := range fault.Codes() {
		if !slices.Contains(listed, code) {
			t.Errorf("code %s is in fault's table and not in PROTOCOL.md's", code)
		}
	}
}

// codeText is a refusal text as the code writes it: its code and its format.
type codeText struct {
	code   fault.Code
	format string
	at     string
}

// verb is a fmt verb in a refusal's format.
var verb = regexp.MustCompile(`%[-+# 0-9.*]*[a-zA-Z%]`)

// patterns keeps what pattern compiled: the refusal tests compare every documented text with
// every text the code writes, and compiling the same expressions again for each pair took half
// a minute of the race-detected suite.
var patterns sync.Map // patternOf → *regexp.Regexp

type patternOf struct {
	s    string
	hole *regexp.Regexp
}

// pattern is s as a regular expression in which every hole (what hole matches) stands for
// any text.
func pattern(s string, hole *regexp.Regexp) *regexp.Regexp {
	if re, ok := patterns.Load(patternOf{s, hole}); ok {
		return re.(*regexp.Regexp)
	}
	var b strings.Builder
	b.WriteString("^")
	last := 0
	for _, m := range hole.FindAllStringIndex(s, -1) {
		b.WriteString(regexp.QuoteMeta(s[last:m[0]]))
		if s[m[0]:m[1]] == "%%" {
			b.WriteString("%")
		} else {
			b.WriteString(".+")
		}
		last = m[1]
	}
	b.WriteString(regexp.QuoteMeta(s[last:]) + "$")
	re := regexp.MustCompile(b.String())
	patterns.Store(patternOf{s, hole}, re)
	return re
}

// placeholder is a hole the document writes in a text: <what goes here>.
var placeholder = regexp.MustCompile(`<[^<>]*>`)

// sameText reports whether the document's text (with its <placeholders>) and the code's
// format (with its verbs) say the same refusal: one, its holes filled, matches the other.
func sameText(doc, format string) bool {
	if pattern(format, verb).MatchString(doc) || pattern(format, verb).MatchString(placeholder.ReplaceAllString(doc, "X")) {
		return true
	}
	return pattern(doc, placeholder).MatchString(verb.ReplaceAllString(format, "X"))
}

// refusalTexts reads every refusal the code can make with a written text: each call of
// fault.New, fault.Wrap and fault.Field in the module's non-test files (fault.Field's text is
// "field <name>: <format>"), outside the tests' own packages.
func refusalTexts(t *testing.T) []codeText {
	t.Helper()
	root := repoRoot
	codes := faultConstants(t, filepath.Join(root, "internal", "core", "fault", "fault.go"))
	fset := token.NewFileSet()
	var out []codeText
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "integration" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		inFault := f.Name.Name == "fault"
		ast.Inspect(f, func(n ast.Node) bool {
			if lit, ok := n.(*ast.CompositeLit); ok {
				// A refusal built whole: fault.Error{Code: …, Message: "…"}.
				if ct, ok := refusalLiteral(lit, inFault, codes); ok {
					ct.at = fset.Position(lit.Pos()).String()
					out = append(out, ct)
				}
				return true
			}
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			name := ""
			switch fn := call.Fun.(type) {
			case *ast.SelectorExpr:
				if x, ok := fn.X.(*ast.Ident); ok && x.Name == "fault" {
					name = fn.Sel.Name
				}
			case *ast.Ident:
				if inFault {
					name = fn.Name
				}
			}
			codeOf := func(e ast.Expr) fault.Code {
				switch c := e.(type) {
				case *ast.SelectorExpr:
					return codes[c.Sel.Name]
				case *ast.Ident:
					return codes[c.Name]
				}
				return ""
			}
			at := fset.Position(call.Pos()).String()
			switch {
			case name == "New" && len(call.Args) >= 2:
				if s, ok := literal(call.Args[1]); ok {
					out = append(out, codeText{codeOf(call.Args[0]), s, at})
				}
			case name == "Wrap" && len(call.Args) >= 3:
				if s, ok := literal(call.Args[2]); ok {
					out = append(out, codeText{codeOf(call.Args[0]), s, at})
				}
			case name == "Field" && len(call.Args) >= 2:
				field, ok := literal(call.Args[0])
				if !ok {
					field = "%s"
				}
				if s, ok := literal(call.Args[1]); ok {
					out = append(out, codeText{fault.BadRequest, "field " + field + ": " + s, at})
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) < 100 {
		t.Fatalf("found %d refusal texts in the code; the reader is broken", len(out))
	}
	return out
}

// refusalLiteral reads a refusal written as a composite literal of fault.Error.
func refusalLiteral(lit *ast.CompositeLit, inFault bool, codes map[string]fault.Code) (codeText, bool) {
	switch typ := lit.Type.(type) {
	case *ast.SelectorExpr:
		if x, ok := typ.X.(*ast.Ident); !ok || x.Name != "fault" || typ.Sel.Name != "Error" {
			return codeText{}, false
		}
	case *ast.Ident:
		if !inFault || typ.Name != "Error" {
			return codeText{}, false
		}
	default:
		return codeText{}, false
	}
	var ct codeText
	for _, e := range lit.Elts {
		kv, ok := e.(*ast.KeyValueExpr)
		if !ok {
			continue
		}
		switch key := kv.Key.(*ast.Ident); key.Name {
		case "Code":
			switch c := kv.Value.(type) {
			case *ast.SelectorExpr:
				ct.code = codes[c.Sel.Name]
			case *ast.Ident:
				ct.code = codes[c.Name]
			}
		case "Message":
			ct.format, _ = literal(kv.Value)
		}
	}
	return ct, ct.code != "" && ct.format != ""
}

// literal is the string constant e spells (a literal, or literals joined with +).
func literal(e ast.Expr) (string, bool) {
	switch v := e.(type) {
	case *ast.BasicLit:
		if v.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(v.Value)
		return s, err == nil
	case *ast.BinaryExpr:
		a, ok1 := literal(v.X)
		b, ok2 := literal(v.Y)
		return a + b, ok1 && ok2 && v.Op == token.ADD
	case *ast.ParenExpr:
		return literal(v.X)
	}
	return "", false
}

// faultConstants maps each code constant's name in fault.go to its code.
func faultConstants(t *testing.T, path string) map[string]fault.Code {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]fault.Code{}
	for _, decl := range f.Decls {
		g, ok := decl.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, spec := range g.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if i < len(vs.Values) {
					if s, ok := literal(vs.Values[i]); ok {
						out[name.Name] = fault.Code(s)
					}
				}
			}
		}
	}
	return out
}

// TestProtocolRefusalTextsAreTheCodes: every refusal the document lists is one the code
// writes, with the code it says; and every refusal the serving packages can answer (all but
// bad-request, whose field texts the document lists by family, and internal, which is a bug)
// is in the document.
func TestProtocolRefusalTextsAreTheCodes(t *testing.T) {
	doc := readProtocol(t)
	texts := refusalTexts(t)
	if len(doc.refusals) < 100 {
		t.Fatalf("read %d refusal rows in PROTOCOL.md; the reader is broken", len(doc.refusals))
	}
	for _, r := range doc.refusals {
		if !fault.Code(r.code).Known() {
			t.Errorf("PROTOCOL.md:%d: code %q is not in fault's table", r.line, r.code)
			continue
		}
		var codes []fault.Code
		for _, c := range texts {
			if sameText(r.text, c.format) {
				codes = append(codes, c.code)
			}
		}
		switch {
		case len(codes) == 0:
			t.Errorf("PROTOCOL.md:%d (%s): %s %q is a text the code does not write", r.line, r.section, r.code, r.text)
		case !slices.Contains(codes, fault.Code(r.code)):
			t.Errorf("PROTOCOL.md:%d (%s): %q is answered %v, not %s", r.line, r.section, r.text, codes, r.code)
		}
	}
	serving := regexp.MustCompile(`^\.\./(handlers|internal/(manager|supervisor|issue|fault|body|signers))/`)
	for _, c := range texts {
		if c.code == "" || c.code == fault.BadRequest || c.code == fault.Internal || !serving.MatchString(c.at) {
			continue
		}
		if !slices.ContainsFunc(doc.refusals, func(r docRefusal) bool { return r.code == string(c.code) && sameText(r.text, c.format) }) {
			t.Errorf("%s: the refusal %s %q is not in PROTOCOL.md", c.at, c.code, c.format)
		}
	}
}

// TestProtocolTextMatchingTellsTextsApart: the matching the two tests above stand on accepts a
// text and its format, and refuses a different text.
func TestProtocolTextMatchingTellsTextsApart(t *testing.T) {
	for _, tc := range []struct {
		doc, format string
		want        bool
	}{
		{`run <runId> has no admission record`, "run %s has no admission record", true},
		{`space "<space>" is not this plane's space "<space>"`, "space %q is not this plane's space %q", true},
		{`field <name>: want <a type>, got <another>`, "field %s: want %s, got an object", true},
		{`run <runId> has an admission record`, "run %s has no admission record", false},
		{`request body too large (maximum 65536 bytes)`, "request body too large (maximum %d bytes)", true},
		{`request body too large (maximum 65536 bytes)`, "request body too small (maximum %d bytes)", false},
	} {
		if got := sameText(tc.doc, tc.format); got != tc.want {
			t.Errorf("sameText(%q, %q): got %v, want %v", tc.doc, tc.format, got, tc.want)
		}
	}
}

// exampleSpec is what an example names: for a request, where it is sent and as whom, and
// the type it decodes into; for a reply, the type the plane answers with, or nil for a reply
// the test compares with a live one.
type exampleSpec struct {
	// endpoint is a bus endpoint, or an HTTP route ("/exchange").
	endpoint     string
	owner, actor string
	into         func() any
}

// protocolExamples are the examples PROTOCOL.md must hold, each once.
var protocolExamples = map[string]exampleSpec{
	"request prepare":             {endpoint: subjects.EndpointManagerAuthority, owner: harness.OwnerA, actor: "cli", into: func() any { return &client.ServiceAuthority{} }},
	"request activate":            {endpoint: subjects.EndpointManagerAuthority, owner: harness.OwnerA, actor: "cli", into: func() any { return &client.ServiceAuthority{} }},
	"request renew":               {endpoint: subjects.EndpointManagerAuthority, owner: harness.OwnerA, actor: "cli", into: func() any { return &client.ServiceAuthority{} }},
	"request renewStandingBundle": {endpoint: subjects.EndpointManagerAuthority, owner: harness.OwnerA, actor: "cli", into: func() any { return &client.ServiceAuthority{} }},
	"request renewRunDriver":      {endpoint: subjects.EndpointManagerAuthority, owner: harness.OwnerA, actor: "cli", into: func() any { return &client.ServiceAuthority{} }},
	"request manager-run-admission": {endpoint: subjects.EndpointManagerAuthority, owner: harness.OwnerA, actor: "cli",
		into: func() any { return &client.RunAdmission{} }},
	"request manager-run-attempt": {endpoint: subjects.EndpointManagerAuthority, owner: harness.OwnerA, actor: "cli", into: func() any { return &client.RunAttempt{} }},
	"request manager-run-status": {endpoint: subjects.EndpointManagerAuthority, owner: harness.OwnerA, actor: "wf_6fbe6a0821e23f160a1ca8c47b75d663",
		into: func() any { return &client.RunStatus{} }},
	"request manager-run-revoke":   {endpoint: subjects.EndpointRunRevoke, owner: harness.OwnerA, actor: "cli", into: func() any { return &client.RunRevoke{} }},
	"request supervisor-assign":    {endpoint: subjects.EndpointSupervisorAssign, owner: harness.OwnerP, actor: "admin", into: func() any { return &client.Assign{} }},
	"request supervisor-authority": {endpoint: subjects.EndpointSupervisorAuthority, owner: harness.OwnerP, actor: "admin", into: func() any { return &client.SupervisorAuthority{} }},
	"request supervisor-end":       {endpoint: subjects.EndpointSupervisorEnd, owner: harness.OwnerP, actor: "admin", into: func() any { return &client.End{} }},
	"request exchange-human": {endpoint: "/exchange", into: func() any {
		return &struct {
			IdPToken string `json:"idpToken"`
			Actor    string `json:"actor"`
			TTLSec   int64  `json:"ttlSec"`
		}{}
	}},
	"request exchange-agent": {endpoint: "/exchange", into: func() any {
		return &struct {
			Owner      string `json:"owner"`
			Actor      string `json:"actor"`
			ActorToken string `json:"actorToken"`
		}{}
	}},
	"request manager-service-authority-http": {endpoint: "/manager-service-authority", into: func() any {
		return &struct {
			IdPToken string                  `json:"idpToken"`
			Request  client.ServiceAuthority `json:"request"`
		}{}
	}},

	"reply prepare":               {into: func() any { return &client.Material{} }},
	"reply activate":              {into: func() any { return &client.Material{} }},
	"reply renew":                 {into: func() any { return &client.Material{} }},
	"reply renewRunDriver":        {into: func() any { return &client.RunMaterial{} }},
	"reply manager-run-admission": {into: func() any { return &client.AdmissionReply{} }},
	"reply manager-run-attempt":   {into: func() any { return &client.RunMaterial{} }},
	"reply manager-run-status":    {into: func() any { return &client.StatusReply{} }},
	"reply manager-run-revoke":    {into: func() any { return &client.RevokeReply{} }},
	"reply supervisor-assign":     {into: func() any { return &client.Assignment{} }},
	"reply supervisor-authority":  {into: func() any { return &client.Material{} }},
	"reply supervisor-end":        {into: func() any { return &client.EndReport{} }},
	"reply exchange":              {into: func() any { return &handlers.ExchangeReply{} }},
	"reply health":                {endpoint: "/health"},
	"reply jwks":                  {endpoint: "/jwks"},
	"reply bundle":                {endpoint: "/.well-known/cotal-mesh"},
	"reply http-error":            {endpoint: "/exchange"},
	"refusal error":               {into: func() any { return &client.ErrorBody{} }},
	"refusal run-conflict":        {into: func() any { return &client.ErrorBody{} }},
}

// TestProtocolHoldsAnExampleOfEveryRequestAndReply: the document's examples are the ones the
// test knows, each once, and none is missing.
func TestProtocolHoldsAnExampleOfEveryRequestAndReply(t *testing.T) {
	seen := map[string]int{}
	for _, ex := range readProtocol(t).examples {
		key := ex.role + " " + ex.name
		seen[key]++
		if _, ok := protocolExamples[key]; !ok {
			t.Errorf("PROTOCOL.md:%d: example %q is not one this test checks; add it to protocolExamples", ex.line, key)
		}
	}
	for key := range protocolExamples {
		if seen[key] != 1 {
			t.Errorf("PROTOCOL.md holds %d examples %q, want 1", seen[key], key)
		}
	}
}

// missingFields lists the fields of type typ that every value of it carries (no omitempty)
// and that the example value v, decoded as JSON, lacks, at path; nested objects, lists and maps
// of structs are looked into.
func missingFields(typ reflect.Type, v any, path string) []string {
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	var out []string
	switch typ.Kind() {
	case reflect.Struct:
		obj, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		for i := range typ.NumField() {
			f := typ.Field(i)
			if f.Anonymous {
				out = append(out, missingFields(f.Type, v, path)...)
				continue
			}
			name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "" || name == "-" {
				continue
			}
			val, present := obj[name]
			if !present {
				if !strings.Contains(opts, "omitempty") {
					out = append(out, path+name)
				}
				continue
			}
			out = append(out, missingFields(f.Type, val, path+name+".")...)
		}
	case reflect.Slice:
		if list, ok := v.([]any); ok {
			for i, e := range list {
				out = append(out, missingFields(typ.Elem(), e, fmt.Sprintf("%s%d.", path, i))...)
			}
		}
	case reflect.Map:
		if obj, ok := v.(map[string]any); ok {
			for k, e := range obj {
				out = append(out, missingFields(typ.Elem(), e, path+k+".")...)
			}
		}
	}
	return out
}

// keyPaths lists every key path of the JSON value v: "a", "a.b", … (lists by their first
// element, maps of values by their keys).
func keyPaths(v any, path string) []string {
	var out []string
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			out = append(out, path+k)
			out = append(out, keyPaths(e, path+k+".")...)
		}
	case []any:
		if len(x) > 0 {
			out = append(out, keyPaths(x[0], path+"0.")...)
		}
	}
	slices.Sort(out)
	return out
}

// TestProtocolExamplesAreWhatThePlaneTakesAndAnswers holds every example of docs/PROTOCOL.md
// to the code: each request decodes with the plane's closed decoder into the type its client
// sends, and, sent to a running plane on its endpoint as the principal it names, is not
// refused bad-request (the grammar takes it; the prepare, on a fresh plane, is served); each
// reply decodes, closed, into the type the plane answers with and carries every field that
// type always carries; a reply without a Go type has the keys of the plane's own.
func TestProtocolExamplesAreWhatThePlaneTakesAndAnswers(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// Synced, as a user runs it: /health names no unsynced server.
	p := harness.StartPlane(t, func(cfg *service.Config) { cfg.Dir, cfg.PublicPort, cfg.AllowUnsynced = dir, 0, false })
	harness.Grant(t, p, harness.OwnerA, "cli", "supervise")
	harness.Grant(t, p, harness.OwnerP, "admin", "platform-admin")
	capH := harness.CapHeader(t, dir)
	for _, ex := range readProtocol(t).examples {
		key := ex.role + " " + ex.name
		spec, ok := protocolExamples[key]
		if !ok {
			continue // TestProtocolHoldsAnExampleOfEveryRequestAndReply says so
		}
		t.Run(strings.ReplaceAll(key, " ", "_"), func(t *testing.T) {
			data := []byte(ex.body)
			if spec.into != nil {
				v := spec.into()
				if err := fault.Decode(data, v); err != nil {
					t.Fatalf("PROTOCOL.md:%d: %s does not decode, closed, as %T: %v", ex.line, key, v, err)
				}
				var generic any
				if err := json.Unmarshal(data, &generic); err != nil {
					t.Fatal(err)
				}
				if missing := missingFields(reflect.TypeOf(v), generic, ""); len(missing) > 0 {
					t.Errorf("PROTOCOL.md:%d: %s lacks %v, which every %T carries", ex.line, key, missing, v)
				}
			}
			switch {
			case ex.role == "request" && strings.HasPrefix(spec.endpoint, "/"):
				r := harness.Post(t, p.HTTPURL()+spec.endpoint, data, capH...)
				if r.Status == http.StatusBadRequest || r.Status == http.StatusUnsupportedMediaType {
					t.Errorf("PROTOCOL.md:%d: %s on %s: got %d %s, want it past the grammar", ex.line, key, spec.endpoint, r.Status, r.Body)
				}
			case ex.role == "request":
				sendable := data
				if spec.endpoint == subjects.EndpointSupervisorAssign {
					// The one field that goes stale: an assignment's end is in the future.
					sendable = rewriteExpiry(t, data, time.Now().Add(time.Hour).Unix())
				}
				o := harness.Ask(t, harness.CallerConn(t, p, spec.owner, spec.actor), spec.owner, spec.actor, spec.endpoint, sendable)
				if o.Code == string(fault.BadRequest) || o.Code == string(fault.Unimplemented) {
					t.Errorf("PROTOCOL.md:%d: %s: got %s %q, want it past the grammar", ex.line, key, o.Code, o.Message)
				}
				if key == "request prepare" && o.Code != "" {
					t.Errorf("PROTOCOL.md:%d: the prepare example on a fresh plane: got %s %q, want the material", ex.line, o.Code, o.Message)
				}
			case ex.role == "refusal":
				var b client.ErrorBody
				if err := fault.Decode(data, &b); err != nil {
					t.Fatal(err)
				}
				if b.Error.Details != nil {
					raw, err := json.Marshal(b.Error.Details)
					if err != nil {
						t.Fatal(err)
					}
					var f client.RunFence
					if err := fault.Decode(raw, &f); err != nil {
						t.Errorf("PROTOCOL.md:%d: %s: details do not decode, closed, as a run fence: %v", ex.line, key, err)
					}
				}
				if !slices.ContainsFunc(refusalTexts(t), func(c codeText) bool {
					return string(c.code) == b.Error.Code && sameText(b.Error.Message, c.format)
				}) {
					t.Errorf("PROTOCOL.md:%d: %s: %s %q is not a refusal the code makes", ex.line, key, b.Error.Code, b.Error.Message)
				}
			case spec.into == nil:
				url := p.HTTPURL() + spec.endpoint
				var live harness.Reply
				switch spec.endpoint {
				case "/.well-known/cotal-mesh":
					live = harness.Get(t, p.PublicURL()+spec.endpoint)
				case "/exchange":
					live = harness.Post(t, url, "{}")
				default:
					live = harness.Get(t, url)
				}
				var want, got any
				if err := json.Unmarshal(live.Body, &want); err != nil {
					t.Fatalf("%s: %s: %v", spec.endpoint, live.Body, err)
				}
				if err := json.Unmarshal(data, &got); err != nil {
					t.Fatalf("PROTOCOL.md:%d: %s: %v", ex.line, key, err)
				}
				if g, w := keyPaths(got, ""), keyPaths(want, ""); !slices.Equal(g, w) {
					t.Errorf("PROTOCOL.md:%d: %s has keys %v, the plane answers %v", ex.line, key, g, w)
				}
			}
		})
	}
}

// rewriteExpiry returns the JSON object data with expiresAt set to at.
func rewriteExpiry(t *testing.T, data []byte, at int64) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	m["expiresAt"] = at
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
