package documents

import (
	"encoding/base64"
	"encoding/json"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/subjects"
)

// documentedClaims reads the claims docs/PROTOCOL.md's table under heading lists: the names in
// backquotes in each row's first cell.
func documentedClaims(t *testing.T, heading string) []string {
	t.Helper()
	doc := readDoc(t, "docs/PROTOCOL.md")
	_, section, ok := strings.Cut(doc, "\n"+heading+"\n")
	if !ok {
		t.Fatalf("docs/PROTOCOL.md has no heading %q", heading)
	}
	table := section[strings.Index(section, "| claim |"):]
	table = table[:strings.Index(table, "\n\n")]
	var names []string
	for _, row := range strings.Split(table, "\n")[2:] {
		for _, m := range regexp.MustCompile("`([a-z_.]+)`").FindAllStringSubmatch(strings.Split(row, "|")[1], -1) {
			names = append(names, m[1])
		}
	}
	slices.Sort(names)
	return names
}

// jwtClaims decodes a JWT's claims, each nested object's keys named with their path
// (`nats.pub.allow`), down to depth levels.
func jwtClaims(t *testing.T, token string, depth int) map[string]any {
	t.Helper()
	parts := strings.Split(token, ".")
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var top map[string]any
	if err := json.Unmarshal(raw, &top); err != nil {
		t.Fatal(err)
	}
	out := map[string]any{}
	var flatten func(prefix string, m map[string]any, depth int)
	flatten = func(prefix string, m map[string]any, depth int) {
		for k, v := range m {
			if inner, ok := v.(map[string]any); ok && depth > 1 {
				flatten(prefix+k+".", inner, depth-1)
				continue
			}
			out[prefix+k] = v
		}
	}
	flatten("", top, depth)
	return out
}

// docs/PROTOCOL.md states every claim of the bearer and of a minted credential, and no claim
// they do not carry: a verifier that is not told a bearer's aud refuses it (PyJWT).
func TestProtocolStatesEveryClaimOfTheBearerAndOfAMintedCredential(t *testing.T) {
	t.Parallel()
	p := harness.StartFacesPlane(t, testkit.NewIdP(t), nil)
	bearer := jwtClaims(t, harness.AgentBearer(t, p, harness.OwnerA, "worker"), 1)
	if got, want := slices.Sorted(maps.Keys(bearer)), documentedClaims(t, "#### The bearer's claims"); !slices.Equal(got, want) {
		t.Errorf("a bearer's claims: got %v, docs/PROTOCOL.md states %v", got, want)
	}
	if bearer["iss"] != subjects.Issuer(harness.TestSpace) || bearer["aud"] != harness.TestSpace {
		t.Errorf("a bearer's iss and aud: got %v and %v, want the documented %s and %s", bearer["iss"], bearer["aud"], subjects.Issuer(harness.TestSpace), harness.TestSpace)
	}
	doc := readDoc(t, "docs/PROTOCOL.md")
	actRow, _, _ := strings.Cut(doc[strings.Index(doc, "| `act` |"):], "\n")
	act, _ := bearer["act"].(map[string]any)
	for _, k := range slices.Sorted(maps.Keys(act)) {
		if !strings.Contains(actRow, k) {
			t.Errorf("an agent's bearer's act carries %q, which docs/PROTOCOL.md's %q does not state", k, actRow)
		}
	}

	harness.Grant(t, p, harness.OwnerA, "cli", "supervise")
	m := harness.MustMint(t, harness.CallerConn(t, p, harness.OwnerA, "cli"), harness.OwnerA, "cli", harness.NewManagerKeys(t).Body(t, "prepare", "cli"))
	for duty, c := range m.Credentials {
		got := slices.Sorted(maps.Keys(jwtClaims(t, c.JWT, 3)))
		if want := documentedClaims(t, "### A minted credential's claims"); !slices.Equal(got, want) {
			t.Errorf("the %s credential's claims: got %v, docs/PROTOCOL.md states %v", duty, got, want)
		}
	}
}
