package faces

import (
	"bytes"
	"crypto"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/capability/bearer"
	"github.com/cotal-ai/authplane/internal/core/audit"
	"github.com/cotal-ai/authplane/internal/core/store"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// The HTTP faces, driven with net/http against a real plane: the POST guards and their order,
// the closed route tables, /jwks, the refusal budgets, both exchange arms, the
// manager-service-authority door, the discovery bundle, and key rotation.

// sized is `{"idpToken":"aaa…", <rest>}` padded to exactly n bytes: valid JSON whose token is
// far over what the IdP verifier reads.
func sized(t testing.TB, n int, rest string) []byte {
	t.Helper()
	head, tail := `{"idpToken":"`, `",`+rest+`}`
	pad := n - len(head) - len(tail)
	if pad < 0 {
		t.Fatalf("cannot make %d bytes", n)
	}
	b := []byte(head + strings.Repeat("a", pad) + tail)
	if len(b) != n || !json.Valid(b) {
		t.Fatalf("sized: got %d bytes, valid %v", len(b), json.Valid(b))
	}
	return b
}

// Every POST guard answers with its status and code, in the order docs/PROTOCOL.md gives ("The HTTP face"), on both faces and
// both doors: 405, 403, 415, (loopback) 401, 413, 400. A request failing two guards gets the
// earlier one's answer; a body of exactly 65,536 bytes is read and judged on its content, one
// byte more is 413.
func TestDoorGuardsAnswerInOrderOnBothFaces(t *testing.T) {
	t.Parallel()
	f := harness.StartFaces(t, nil)
	const ctJSON, ctText = "application/json", "text/plain"
	for _, fc := range f.Faces() {
		for _, door := range []struct{ path, rest string }{
			{"/exchange", `"actor":"cli"`},
			{"/manager-service-authority", `"request":{"actor":"cli"}`},
		} {
			t.Run(fc.Name+door.path, func(t *testing.T) {
				t.Parallel()
				url := fc.Url + door.path
				valid := []byte(`{"idpToken":"x",` + door.rest + `}`)
				exact := sized(t, 65536, door.rest)
				over := sized(t, 65537, door.rest)
				overBad := append(bytes.Repeat([]byte("{"), 65537), '}')
				type tc struct {
					name    string
					method  string
					body    []byte
					headers []string
					status  int
					code    string
				}
				cases := []tc{
					{"GET", http.MethodGet, nil, fc.With(), 405, "method-not-allowed"},
					{"PUT with a JSON body", http.MethodPut, valid, fc.With("Content-Type", ctJSON), 405, "method-not-allowed"},
					{"DELETE", http.MethodDelete, nil, fc.With(), 405, "method-not-allowed"},
					{"GET with an Origin", http.MethodGet, nil, fc.With("Origin", "https://evil.example"), 405, "method-not-allowed"},
					{"an Origin", http.MethodPost, valid, fc.With("Content-Type", ctJSON, "Origin", "https://evil.example"), 403, "permission-denied"},
					{"Origin null", http.MethodPost, valid, fc.With("Content-Type", ctJSON, "Origin", "null"), 403, "permission-denied"},
					{"an empty Origin", http.MethodPost, valid, fc.With("Content-Type", ctJSON, "Origin", ""), 403, "permission-denied"},
					{"an Origin and text/plain", http.MethodPost, valid, fc.With("Content-Type", ctText, "Origin", "https://evil.example"), 403, "permission-denied"},
					{"an Origin, no content type, no capability", http.MethodPost, valid, []string{"Origin", "https://evil.example"}, 403, "permission-denied"},
					{"text/plain", http.MethodPost, valid, fc.With("Content-Type", ctText), 415, "unsupported-media-type"},
					{"no content type", http.MethodPost, valid, fc.With(), 415, "unsupported-media-type"},
					{"Application/JSON (the match is case-sensitive)", http.MethodPost, valid, fc.With("Content-Type", "Application/JSON"), 415, "unsupported-media-type"},
					{"application/jsonp", http.MethodPost, valid, fc.With("Content-Type", "application/jsonp"), 415, "unsupported-media-type"},
					{"text/plain over the size limit", http.MethodPost, over, fc.With("Content-Type", ctText), 415, "unsupported-media-type"},
					{"over the size limit and not JSON", http.MethodPost, overBad, fc.With("Content-Type", ctJSON), 413, "payload-too-large"},
					{"65,537 bytes of valid JSON", http.MethodPost, over, fc.With("Content-Type", ctJSON), 413, "payload-too-large"},
					{"not JSON", http.MethodPost, []byte(`{"idpToken":`), fc.With("Content-Type", ctJSON), 400, "bad-request"},
					{"empty", http.MethodPost, []byte{}, fc.With("Content-Type", ctJSON), 400, "bad-request"},
					{"not UTF-8", http.MethodPost, []byte("{\"idpToken\":\"\xff\"," + door.rest + "}"), fc.With("Content-Type", ctJSON), 400, "bad-request"},
					// Exactly the limit is read and judged: its token is refused by the IdP check.
					{"65,536 bytes of valid JSON", http.MethodPost, exact, fc.With("Content-Type", "application/json; charset=utf-8"), 401, "unauthenticated"},
				}
				if fc.Name == "loopback" {
					wrong := []string{"Authorization", "Bearer " + strings.Repeat("A", 43)}
					cases = append(cases,
						tc{"text/plain and no capability", http.MethodPost, valid, []string{"Content-Type", ctText}, 415, "unsupported-media-type"},
						tc{"no capability", http.MethodPost, valid, []string{"Content-Type", ctJSON}, 401, "unauthenticated"},
						tc{"a wrong capability", http.MethodPost, valid, append([]string{"Content-Type", ctJSON}, wrong...), 401, "unauthenticated"},
						tc{"the capability without Bearer", http.MethodPost, valid, []string{"Content-Type", ctJSON, "Authorization", strings.TrimPrefix(fc.Auth[1], "Bearer ")}, 401, "unauthenticated"},
						tc{"the capability after a lower-case bearer", http.MethodPost, valid, []string{"Content-Type", ctJSON, "Authorization", "bearer " + strings.TrimPrefix(fc.Auth[1], "Bearer ")}, 401, "unauthenticated"},
						tc{"no capability, over the size limit", http.MethodPost, over, []string{"Content-Type", ctJSON}, 401, "unauthenticated"},
						tc{"no capability, not JSON", http.MethodPost, []byte("{"), []string{"Content-Type", ctJSON}, 401, "unauthenticated"},
					)
				}
				for _, c := range cases {
					r := send(t, c.method, url, c.body, c.headers...)
					refused(t, c.name, r, c.status, c.code)
				}
				// The exact-size body was judged on its token, not its size.
				r := send(t, http.MethodPost, url, exact, fc.With("Content-Type", ctJSON)...)
				if msg := r.Field("error"); !strings.Contains(msg, "IdP token") {
					t.Errorf("65,536 bytes: got %q, want the IdP check's refusal", msg)
				}
			})
		}
	}
}

// Each face is a closed route table matched on the exact raw path: no trailing slash, query,
// encoded dot, dot segment or case folding reaches a route, nor do the names every JavaScript
// object has; the bundle is public only.
func TestRouteTablesMatchExactPathsOnly(t *testing.T) {
	t.Parallel()
	f := harness.StartFaces(t, nil)
	paths := []string{
		"/", "/health/", "/health?x=1", "/health?", "/jwks/", "/jwks?x", "/%2e/jwks", "/jwks%2e", "/%6awks",
		"/x/../jwks", "//jwks", "/JWKS", "/toString", "/constructor", "/__proto__", "/hasOwnProperty",
		"/exchange/", "/exchange?x=1", "/manager-service-authority/verify-enrollment", "/.well-known/cotal-mesh/",
		"/.well-known/cotal-mesh?x", "/interactive-lifecycle/retire",
	}
	const known = "unknown path - /health, /jwks, /exchange, /manager-service-authority"
	for _, fc := range f.Faces() {
		all := paths
		if fc.Name == "loopback" {
			all = append(all, "/.well-known/cotal-mesh")
		} else {
			all = append(all, "/metrics")
		}
		for _, path := range all {
			r := harness.Get(t, fc.Url+path)
			refused(t, fc.Name+" GET "+path, r, 404, "not-found")
			msg := r.Field("error")
			wantBundle := fc.Name == "public"
			if !strings.HasPrefix(msg, known) || strings.Contains(msg, "/.well-known/cotal-mesh") != wantBundle {
				t.Errorf("%s GET %s: got %q, want the %s route list", fc.Name, path, msg, fc.Name)
			}
		}
		// The route is found before any guard: a door's near-miss is 404 even to a good request.
		for _, path := range []string{"/exchange/", "/exchange?x=1", "/Exchange", "/%65xchange"} {
			r := harness.Post(t, fc.Url+path, map[string]any{"idpToken": f.Token(t, "x", time.Hour), "actor": "cli"}, fc.Auth...)
			refused(t, fc.Name+" POST "+path, r, 404, "not-found")
		}
		if r := harness.Get(t, fc.Url+"/health"); r.Status != 200 || !strings.Contains(string(r.Body), `"issuer":"urn:cotal:auth:`+harness.TestSpace+`"`) {
			t.Errorf("%s GET /health: got %d %s", fc.Name, r.Status, r.Body)
		}
		refused(t, fc.Name+" POST /health", harness.Post(t, fc.Url+"/health", "{}", fc.Auth...), 405, "method-not-allowed")
		refused(t, fc.Name+" POST /jwks", harness.Post(t, fc.Url+"/jwks", "{}", fc.Auth...), 405, "method-not-allowed")
	}
	if r := harness.Get(t, f.PublicURL()+"/.well-known/cotal-mesh"); r.Status != 200 || r.Header.Get("Cache-Control") != "no-store" {
		t.Errorf("public GET the bundle: got %d, Cache-Control %q, want 200 no-store", r.Status, r.Header.Get("Cache-Control"))
	}
	refused(t, "public POST the bundle", harness.Post(t, f.PublicURL()+"/.well-known/cotal-mesh", "{}"), 405, "method-not-allowed")
}

// jwks is the key set as /jwks serves it.
type jwks struct {
	Keys []map[string]any `json:"keys"`
}

// fetchJWKS reads url's /jwks and returns it and its ETag.
func fetchJWKS(t testing.TB, url string) (jwks, string) {
	t.Helper()
	r := harness.Get(t, url+"/jwks")
	if r.Status != http.StatusOK {
		t.Fatalf("GET /jwks: got %d %s", r.Status, r.Body)
	}
	var set jwks
	if err := json.Unmarshal(r.Body, &set); err != nil {
		t.Fatalf("GET /jwks: %s: %v", r.Body, err)
	}
	return set, r.Header.Get("ETag")
}

// kids are the key set's kids.
func (s jwks) kids() []string {
	var out []string
	for _, k := range s.Keys {
		kid, _ := k["kid"].(string)
		out = append(out, kid)
	}
	return out
}

// /jwks on both faces: the same public key set, kid its RFC 7638 thumbprint, cacheable for 300
// s under an ETag that a conditional request matches with 304 and no body.
func TestJWKSIsPublicCacheableAndConditional(t *testing.T) {
	t.Parallel()
	f := harness.StartFaces(t, nil)
	var first []byte
	for _, fc := range f.Faces() {
		r := harness.Get(t, fc.Url+"/jwks")
		etag := r.Header.Get("ETag")
		if r.Status != 200 || r.Header.Get("Cache-Control") != "max-age=300" || !strings.HasPrefix(etag, `"`) || len(etag) < 10 ||
			r.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("%s GET /jwks: got %d, Cache-Control %q, ETag %q, Content-Type %q", fc.Name, r.Status,
				r.Header.Get("Cache-Control"), etag, r.Header.Get("Content-Type"))
		}
		if first == nil {
			first = r.Body
		} else if !bytes.Equal(first, r.Body) {
			t.Errorf("the faces serve different key sets: %s and %s", first, r.Body)
		}
		var set jose.JSONWebKeySet
		if err := json.Unmarshal(r.Body, &set); err != nil || len(set.Keys) != 1 {
			t.Fatalf("%s /jwks: got %s (%v), want one key", fc.Name, r.Body, err)
		}
		k := set.Keys[0]
		tp, err := k.Thumbprint(crypto.SHA256)
		if err != nil || k.KeyID != base64.RawURLEncoding.EncodeToString(tp) || !k.IsPublic() || k.Algorithm != "EdDSA" || k.Use != "sig" {
			t.Errorf("%s /jwks: got kid %s alg %s use %s public %v, want the EdDSA public key under its thumbprint", fc.Name, k.KeyID, k.Algorithm, k.Use, k.IsPublic())
		}
		if strings.Contains(string(r.Body), `"d"`) {
			t.Errorf("%s /jwks carries a private part: %s", fc.Name, r.Body)
		}
		nm := harness.Get(t, fc.Url+"/jwks", "If-None-Match", etag)
		if nm.Status != http.StatusNotModified || len(nm.Body) != 0 || nm.Header.Get("ETag") != etag || nm.Header.Get("Cache-Control") != "max-age=300" {
			t.Errorf("%s If-None-Match the ETag: got %d %q, ETag %q, want 304, no body, the same ETag", fc.Name, nm.Status, nm.Body, nm.Header.Get("ETag"))
		}
		if other := harness.Get(t, fc.Url+"/jwks", "If-None-Match", `"not-it"`); other.Status != http.StatusOK || !bytes.Equal(other.Body, r.Body) {
			t.Errorf("%s If-None-Match another ETag: got %d, want 200 and the set", fc.Name, other.Status)
		}
	}
}

// The loopback door's capability has its own budget: 30 misses a minute are 401, then 429 (on
// either door); the right capability still works while it is spent, the public face's budget
// is untouched, and a minute later (on the plane's clock) misses are 401 again.
func TestLoopbackCapabilityMissesHaveTheirOwnBudget(t *testing.T) {
	t.Parallel()
	f := harness.StartFaces(t, nil)
	owner := harness.HumanOwner(t, f.TestPlane, f.Ip, "dana")
	harness.Grant(t, f.TestPlane, owner, "cli")
	good := map[string]any{"idpToken": f.Token(t, "dana", time.Hour), "actor": "cli"}
	loop := f.HTTPURL()
	for i := 1; i <= refusalsPerMinute; i++ {
		r := harness.Post(t, loop+"/exchange", good, "Authorization", "Bearer wrong-"+strconv.Itoa(i))
		refused(t, fmt.Sprintf("bad capability %d", i), r, 401, "unauthenticated")
	}
	r := harness.Post(t, loop+"/exchange", good, "Authorization", "Bearer wrong")
	refused(t, "bad capability 31", r, 429, "resource-exhausted")
	if msg := r.Field("error"); !strings.Contains(msg, "invalid-capability") {
		t.Errorf("bad capability 31: got %q, want the invalid-capability throttle", msg)
	}
	refused(t, "no capability on the other door", harness.Post(t, loop+"/manager-service-authority", map[string]any{"idpToken": "x", "request": map[string]any{"actor": "cli"}}), 429, "resource-exhausted")

	// The right capability is not throttled by others' misses: it mints, and its refusals are
	// refusals, not 429.
	if e := harness.Exchange(t, loop, good, f.Cap...); e.Owner != owner {
		t.Errorf("the right capability while misses are throttled: got owner %s, want %s", e.Owner, owner)
	}
	refused(t, "the right capability, a refused request", harness.Post(t, loop+"/exchange", map[string]any{"idpToken": "x", "actor": "cli"}, f.Cap...), 401, "unauthenticated")
	// The public face's budget is its own.
	refused(t, "a public refusal", harness.Post(t, f.PublicURL()+"/exchange", map[string]any{"idpToken": "x", "actor": "cli"}), 401, "unauthenticated")
	harness.Exchange(t, f.PublicURL(), good)

	// A minute on, the budget is back.
	f.Clock.Advance(time.Minute + time.Second)
	refused(t, "a bad capability a minute later", harness.Post(t, loop+"/exchange", good, "Authorization", "Bearer wrong"), 401, "unauthenticated")
	harness.Exchange(t, loop, good, f.Cap...)
}

// refusalsPerMinute is the budget docs/PROTOCOL.md gives ("The HTTP face") of refusals (and capability misses) a minute.
const refusalsPerMinute = 30

// refuseN posts n refused agent exchanges to the public face as peer hops (X-Forwarded-For)
// and wants each refused with its reason.
func refuseN(t testing.TB, f *harness.FacesPlane, n int, hops string) {
	t.Helper()
	for i := 1; i <= n; i++ {
		r := harness.Post(t, f.PublicURL()+"/exchange", map[string]any{"owner": harness.OwnerB, "actor": "ghost", "actorToken": "nope"}, "X-Forwarded-For", hops)
		refused(t, fmt.Sprintf("refusal %d from %s", i, hops), r, 401, "unauthenticated")
		if !strings.Contains(r.Field("error"), "unknown agent") {
			t.Fatalf("refusal %d from %s: got %q, want its reason", i, hops, r.Field("error"))
		}
	}
}

// throttledAnswer is the public face's answer past a peer's budget: no reason.
const throttledAnswer = "too many refused requests - wait a minute and retry"

// With --trusted-proxy the public face charges refusals to the last X-Forwarded-For hop: past
// 30 a minute a peer's refusals are 429 with their reason withheld, on both doors, while its
// valid credentials still succeed; another last hop, or the socket's address, has its own
// budget; a minute on (the plane's clock) the peer's budget is back.
func TestPublicRefusalsAreBudgetedPerPeerBehindATrustedProxy(t *testing.T) {
	t.Parallel()
	f := harness.StartFaces(t, func(c *service.Config) { c.TrustedProxy = true })
	owner := harness.HumanOwner(t, f.TestPlane, f.Ip, "erin")
	harness.Grant(t, f.TestPlane, owner, "cli")
	good := map[string]any{"idpToken": f.Token(t, "erin", time.Hour), "actor": "cli"}
	bad := map[string]any{"owner": harness.OwnerB, "actor": "ghost", "actorToken": "nope"}
	pub := f.PublicURL()

	refuseN(t, f, refusalsPerMinute, "198.51.100.1, 203.0.113.7")
	r := harness.Post(t, pub+"/exchange", bad, "X-Forwarded-For", "198.51.100.1, 203.0.113.7")
	refused(t, "refusal 31", r, 429, "resource-exhausted")
	if r.Field("error") != throttledAnswer {
		t.Errorf("refusal 31: got %q, want %q (the reason withheld)", r.Field("error"), throttledAnswer)
	}
	refused(t, "a refusal on the other door", harness.Post(t, pub+"/manager-service-authority",
		map[string]any{"idpToken": "x", "request": map[string]any{"actor": "cli"}}, "X-Forwarded-For", "203.0.113.7"), 429, "resource-exhausted")
	// Only the last hop names the peer; with two headers, the last header's.
	for _, hops := range [][]string{{"10.9.9.9, 203.0.113.7"}, {"203.0.113.7"}, {"203.0.113.8", "192.0.2.1, 203.0.113.7"}} {
		var h []string
		for _, v := range hops {
			h = append(h, "X-Forwarded-For", v)
		}
		r := send(t, http.MethodPost, pub+"/exchange", mustJSON(t, bad), append(h, "Content-Type", "application/json")...)
		refused(t, fmt.Sprintf("a refusal from %q", hops), r, 429, "resource-exhausted")
	}
	// A valid credential from the throttled peer still succeeds.
	if e := harness.Exchange(t, pub, good, "X-Forwarded-For", "203.0.113.7"); e.Owner != owner {
		t.Errorf("a throttled peer's valid exchange: got owner %s", e.Owner)
	}
	// Other peers: another last hop, the last hop of the last header, the socket.
	refuseN(t, f, 1, "198.51.100.1, 203.0.113.8")
	r = send(t, http.MethodPost, pub+"/exchange", mustJSON(t, bad), "X-Forwarded-For", "203.0.113.7", "X-Forwarded-For", "203.0.113.9", "Content-Type", "application/json")
	refused(t, "a refusal whose last header names another peer", r, 401, "unauthenticated")
	refused(t, "a refusal with no X-Forwarded-For", harness.Post(t, pub+"/exchange", bad), 401, "unauthenticated")

	// A minute on, the peer's budget is back; one more, and it is 30 again before 429.
	f.Clock.Advance(time.Minute + time.Second)
	refuseN(t, f, refusalsPerMinute, "203.0.113.7")
	refused(t, "refusal 31 of the next minute", harness.Post(t, pub+"/exchange", bad, "X-Forwarded-For", "203.0.113.7"), 429, "resource-exhausted")
}

// mustJSON marshals v.
func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Without --trusted-proxy, X-Forwarded-For is ignored: a client cannot mint itself a fresh
// budget by naming another hop. Its valid credential still succeeds, and the loopback face's
// refusal budget is separate from the public one.
func TestPublicRefusalsIgnoreForwardedForWithoutATrustedProxy(t *testing.T) {
	t.Parallel()
	f := harness.StartFaces(t, nil)
	owner := harness.HumanOwner(t, f.TestPlane, f.Ip, "faye")
	harness.Grant(t, f.TestPlane, owner, "cli")
	good := map[string]any{"idpToken": f.Token(t, "faye", time.Hour), "actor": "cli"}
	bad := map[string]any{"owner": harness.OwnerB, "actor": "ghost", "actorToken": "nope"}
	for i := 1; i <= refusalsPerMinute; i++ {
		refuseN(t, f, 1, "203.0.113."+strconv.Itoa(i))
	}
	for _, hops := range []string{"203.0.113.200", "198.51.100.1, 203.0.113.201"} {
		refused(t, "a refusal naming a fresh hop", harness.Post(t, f.PublicURL()+"/exchange", bad, "X-Forwarded-For", hops), 429, "resource-exhausted")
	}
	refused(t, "a refusal with no X-Forwarded-For", harness.Post(t, f.PublicURL()+"/exchange", bad), 429, "resource-exhausted")
	harness.Exchange(t, f.PublicURL(), good)
	refused(t, "a loopback refusal", harness.Post(t, f.HTTPURL()+"/exchange", bad, f.Cap...), 401, "unauthenticated")
	harness.Exchange(t, f.HTTPURL(), good, f.Cap...)
}

// The human arm: an IdP token and an actor with a ledger row buy a bearer of at most 900 s
// and no longer than the IdP token lives, ttlSec respected and never stretched past 900; the
// ops view is loopback-only and needs `admin`; no row, no bearer.
func TestHumanExchangeBoundsItsBearer(t *testing.T) {
	t.Parallel()
	f := harness.StartFaces(t, nil)
	owner := harness.HumanOwner(t, f.TestPlane, f.Ip, "frank")
	harness.Grant(t, f.TestPlane, owner, "cli")
	admins := harness.HumanOwner(t, f.TestPlane, f.Ip, "grace")
	harness.Grant(t, f.TestPlane, admins, "cli", "admin")
	frank := f.Token(t, "frank", time.Hour)
	kids, _ := fetchJWKS(t, f.PublicURL())

	for _, fc := range f.Faces() {
		t.Run(fc.Name, func(t *testing.T) {
			t.Parallel()
			ask := func(body map[string]any) harness.Reply { return harness.Post(t, fc.Url+"/exchange", body, fc.Auth...) }
			life := func(what string, body map[string]any, lo, hi int64) harness.Exchanged {
				t.Helper()
				before := time.Now().Unix()
				e := harness.Exchange(t, fc.Url, body, fc.Auth...)
				if left := e.Exp - before; left < lo || left > hi+1 { // +1: the second may turn
					t.Errorf("%s: bearer lives %d s, want %d to %d", what, left, lo, hi)
				}
				return e
			}

			e := life("default", map[string]any{"idpToken": frank, "actor": "cli"}, 895, 900)
			h, c := harness.JwtParts(t, e.Token)
			act, _ := c["act"].(map[string]any)
			if e.Owner != owner || c["sub"] != owner || act["owner"] != owner || act["actor"] != "cli" || act["view"] != "caller" || act["agent"] != nil ||
				c["iss"] != "urn:cotal:auth:"+harness.TestSpace || c["aud"] != harness.TestSpace || h["alg"] != "EdDSA" || h["kid"] != kids.kids()[0] {
				t.Errorf("the bearer: got header %v claims %v owner %s, want %s.cli, caller view, signed by %v", h, c, e.Owner, owner, kids.kids())
			}
			if iat, exp := c["iat"].(float64), c["exp"].(float64); exp-iat > 900 || int64(exp) != e.Exp {
				t.Errorf("the bearer: iat %v exp %v (reply exp %d), want at most 900 s and the reply's exp", iat, exp, e.Exp)
			}
			// No longer than the IdP token; ttlSec respected up to 900.
			short := f.Ip.Claims("frank", 2*time.Minute)
			e = harness.Exchange(t, fc.Url, map[string]any{"idpToken": f.Ip.Token(t, short), "actor": "cli"}, fc.Auth...)
			if idpExp := short["exp"].(int64); e.Exp > idpExp || e.Exp < idpExp-2 {
				t.Errorf("a 2-minute IdP token: bearer exp %d, want its exp %d", e.Exp, idpExp)
			}
			life("ttlSec 60", map[string]any{"idpToken": frank, "actor": "cli", "ttlSec": 60}, 58, 60)
			life("ttlSec 900", map[string]any{"idpToken": frank, "actor": "cli", "ttlSec": 900}, 898, 900)
			life("ttlSec 1", map[string]any{"idpToken": frank, "actor": "cli", "ttlSec": 1}, 1, 1)

			justExpired := f.Ip.Claims("frank", time.Hour)
			justExpired["exp"] = time.Now().Add(-2 * time.Second).Unix() // inside the verifier's skew
			for _, c := range []struct {
				name   string
				body   map[string]any
				status int
				code   string
			}{
				{"ttlSec 901", map[string]any{"idpToken": frank, "actor": "cli", "ttlSec": 901}, 400, "bad-request"},
				{"ttlSec 0", map[string]any{"idpToken": frank, "actor": "cli", "ttlSec": 0}, 400, "bad-request"},
				{"ttlSec -60", map[string]any{"idpToken": frank, "actor": "cli", "ttlSec": -60}, 400, "bad-request"},
				{"ttlSec a string", map[string]any{"idpToken": frank, "actor": "cli", "ttlSec": "60"}, 400, "bad-request"},
				{"ttlSec a fraction", map[string]any{"idpToken": frank, "actor": "cli", "ttlSec": 1.5}, 400, "bad-request"},
				{"an IdP token with no life left", map[string]any{"idpToken": f.Ip.Token(t, justExpired), "actor": "cli"}, 401, "unauthenticated"},
				{"no ledger row", map[string]any{"idpToken": f.Token(t, "heidi", time.Hour), "actor": "cli"}, 401, "unauthenticated"},
				{"another actor's row", map[string]any{"idpToken": frank, "actor": "other"}, 401, "unauthenticated"},
				{"an actor off its grammar", map[string]any{"idpToken": frank, "actor": "c li"}, 400, "bad-request"},
				{"no actor", map[string]any{"idpToken": frank}, 400, "bad-request"},
				{"an owner beside the IdP token", map[string]any{"idpToken": frank, "actor": "cli", "owner": owner}, 400, "bad-request"},
				{"an unknown view", map[string]any{"idpToken": frank, "actor": "cli", "view": "admin"}, 400, "bad-request"},
				{"null", nil, 400, "bad-request"},
			} {
				refused(t, c.name, ask(c.body), c.status, c.code)
			}

			// The ops view: public never; loopback for an admin-scoped row only.
			grace := map[string]any{"idpToken": f.Token(t, "grace", time.Hour), "actor": "cli", "view": "ops"}
			if fc.Name == "public" {
				refused(t, "ops in public", ask(grace), 403, "permission-denied")
				return
			}
			e = harness.Exchange(t, fc.Url, grace, fc.Auth...)
			if _, c := harness.JwtParts(t, e.Token); c["act"].(map[string]any)["view"] != "ops" || e.Owner != admins {
				t.Errorf("ops on loopback for admin: got %v", c)
			}
			refused(t, "ops without admin", ask(map[string]any{"idpToken": frank, "actor": "cli", "view": "ops"}), 403, "permission-denied")
		})
	}
}

// The agent arm: owner, actor and the agent's secret buy a bearer of at most 300 s (ttlSec
// only shortens it); an unknown agent and a wrong secret get the same bytes; the agent
// refreshes before expiry and gets a new bearer that outlives the old; a revocation refuses
// the next exchange and the next connection, without a restart.
func TestAgentExchangeRefreshAndRevoke(t *testing.T) {
	t.Parallel()
	f := harness.StartFaces(t, nil)
	secret, _, err := admin.SetAgent(harness.GrantCtx(t), f.Keys(), f.NATSURL(), harness.OwnerA, "worker")
	if err != nil {
		t.Fatal(err)
	}
	agent := map[string]any{"owner": harness.OwnerA, "actor": "worker", "actorToken": secret}
	b := harness.FetchBundle(t, f.PublicURL())

	for _, fc := range f.Faces() {
		before := time.Now().Unix()
		e := harness.Exchange(t, fc.Url, agent, fc.Auth...)
		_, c := harness.JwtParts(t, e.Token)
		act, _ := c["act"].(map[string]any)
		if left := e.Exp - before; left < 295 || left > 300 || e.Owner != harness.OwnerA || act["agent"] != true || act["view"] != "caller" || act["actor"] != "worker" {
			t.Errorf("%s agent exchange: got owner %s, %d s, act %v; want %s, 300 s, an agent's caller bearer", fc.Name, e.Owner, left, act, harness.OwnerA)
		}
		var rec audit.Decision
		harness.ReadRecord(t, f.TestPlane, subjects.AuditStream(harness.TestSpace), subjects.AuditSubject(harness.TestSpace, audit.Exchanged, harness.OwnerA, "worker"), &rec)
		if rec.Bearer == nil || *rec.Bearer != (audit.Bearer{View: "caller", Agent: true, Exp: e.Exp}) || rec.Endpoint != "exchange" || strings.Contains(string(mustJSON(t, rec)), e.Token) {
			t.Errorf("%s agent exchange: the exchanged record %+v, want the bearer's view, agent and exp (%d), never the token", fc.Name, rec, e.Exp)
		}
		// exp is rounded up to the second (a bearer lives at least its ttlSec), but never past
		// 300 s from now's second.
		for ttl, want := range map[int][2]int64{60: {60, 61}, 5000: {299, 300}} {
			body := map[string]any{"owner": harness.OwnerA, "actor": "worker", "actorToken": secret, "ttlSec": ttl}
			before := time.Now()
			exp := harness.Exchange(t, fc.Url, body, fc.Auth...).Exp
			if lo, hi := before.Add(time.Duration(want[0])*time.Second), time.Now().Unix()+want[1]; time.Unix(exp, 0).Before(lo) || exp > hi {
				t.Errorf("%s agent ttlSec %d: bearer exp %d, want %s to %d", fc.Name, ttl, exp, lo.Format(time.StampMilli), hi)
			}
		}

		unknown := harness.Post(t, fc.Url+"/exchange", map[string]any{"owner": harness.OwnerB, "actor": "worker", "actorToken": secret}, fc.Auth...)
		refused(t, fc.Name+" an unknown agent", unknown, 401, "unauthenticated")
		for name, body := range map[string]map[string]any{
			"a wrong secret":           {"owner": harness.OwnerA, "actor": "worker", "actorToken": secret + "x"},
			"an empty secret":          {"owner": harness.OwnerA, "actor": "worker", "actorToken": ""},
			"another actor":            {"owner": harness.OwnerA, "actor": "cli", "actorToken": secret},
			"an owner not an u_":       {"owner": "p_aaaaaaaaaaaaaaaaaaaaaaaaaa", "actor": "worker", "actorToken": secret},
			"an actor off its grammar": {"owner": harness.OwnerA, "actor": "work er", "actorToken": secret},
		} {
			r := harness.Post(t, fc.Url+"/exchange", body, fc.Auth...)
			if !bytes.Equal(r.Body, unknown.Body) || r.Status != unknown.Status {
				t.Errorf("%s %s: got %d %s, want the unknown agent's answer byte for byte: %s", fc.Name, name, r.Status, r.Body, unknown.Body)
			}
		}
		refused(t, fc.Name+" both idpToken and actorToken", harness.Post(t, fc.Url+"/exchange",
			map[string]any{"owner": harness.OwnerA, "actor": "worker", "actorToken": secret, "idpToken": f.Token(t, "x", time.Hour)}, fc.Auth...), 400, "bad-request")
		refused(t, fc.Name+" no owner", harness.Post(t, fc.Url+"/exchange", map[string]any{"actor": "worker", "actorToken": secret}, fc.Auth...), 400, "bad-request")
		for _, ttl := range []int{0, -60} {
			refused(t, fmt.Sprintf("%s agent ttlSec %d", fc.Name, ttl), harness.Post(t, fc.Url+"/exchange",
				map[string]any{"owner": harness.OwnerA, "actor": "worker", "actorToken": secret, "ttlSec": ttl}, fc.Auth...), 400, "bad-request")
		}
		// An agent never gets the ops view: the public face refuses any view first.
		status, code := 400, "bad-request"
		if fc.Name == "public" {
			status, code = 403, "permission-denied"
		}
		refused(t, fc.Name+" an agent asking for ops", harness.Post(t, fc.Url+"/exchange",
			map[string]any{"owner": harness.OwnerA, "actor": "worker", "actorToken": secret, "view": "ops"}, fc.Auth...), status, code)
	}

	// The refresh: before its bearer expires the agent exchanges again and gets a new bearer
	// that outlives the old; past the old one's life only the new one connects.
	old := harness.Exchange(t, f.PublicURL(), agent)
	mustConnect(t, b, old.Token, harness.OwnerA, "worker")
	f.Clock.Advance(250 * time.Second)
	fresh := harness.Exchange(t, f.PublicURL(), agent)
	if fresh.Token == old.Token || fresh.Exp < old.Exp+249 {
		t.Fatalf("the refresh: got exp %d (old %d), same token %v; want a new bearer 250 s later", fresh.Exp, old.Exp, fresh.Token == old.Token)
	}
	mustConnect(t, b, old.Token, harness.OwnerA, "worker")
	mustConnect(t, b, fresh.Token, harness.OwnerA, "worker")
	f.Clock.Advance(60 * time.Second)
	mustNotConnect(t, b, old.Token, harness.OwnerA, "worker", "the old bearer past its life")
	mustConnect(t, b, fresh.Token, harness.OwnerA, "worker")

	// Revoked: the next exchange and the next connection are refused, with no restart.
	if _, err := admin.RevokeAgent(harness.GrantCtx(t), f.Keys(), f.NATSURL(), harness.OwnerA, "worker"); err != nil {
		t.Fatal(err)
	}
	for _, fc := range f.Faces() {
		r := harness.Post(t, fc.Url+"/exchange", agent, fc.Auth...)
		refused(t, fc.Name+" a revoked agent", r, 401, "unauthenticated")
		if !strings.Contains(r.Field("error"), "unknown agent or wrong secret") {
			t.Errorf("%s a revoked agent: got %q, want the one agent refusal", fc.Name, r.Field("error"))
		}
	}
	mustNotConnect(t, b, fresh.Token, harness.OwnerA, "worker", "a revoked agent's bearer")
	// A new secret works; the old one stays refused.
	secret2, _, err := admin.SetAgent(harness.GrantCtx(t), f.Keys(), f.NATSURL(), harness.OwnerA, "worker")
	if err != nil {
		t.Fatal(err)
	}
	mustConnect(t, b, harness.Exchange(t, f.PublicURL(), map[string]any{"owner": harness.OwnerA, "actor": "worker", "actorToken": secret2}).Token, harness.OwnerA, "worker")
	refused(t, "the old secret after a new one", harness.Post(t, f.PublicURL()+"/exchange", agent), 401, "unauthenticated")
}

// mustConnect connects with a bearer through the callout and fails the test if refused.
func mustConnect(t testing.TB, b harness.Bundle, token, owner, actor string) {
	t.Helper()
	nc, err := harness.BearerConnect(t, b, token, owner, actor)
	if err != nil {
		t.Fatalf("connect with the bearer as %s: %v", subjects.Principal(owner, actor), err)
	}
	nc.Close()
}

// mustNotConnect fails the test unless the callout refuses the bearer.
func mustNotConnect(t testing.TB, b harness.Bundle, token, owner, actor, what string) {
	t.Helper()
	nc, err := harness.BearerConnect(t, b, token, owner, actor)
	if err == nil {
		nc.Close()
		t.Fatalf("%s connected, want the callout to refuse it", what)
	}
	if !errors.Is(err, nats.ErrAuthorization) && !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Fatalf("%s: got %v, want an authorization violation", what, err)
	}
}

// The manager-service-authority door runs the bus endpoint's dispatcher with the owner the IdP
// token derives as the caller: the same refusal for a bad request as on the bus, no credential
// without `supervise`, and with it a prepare mints credentials the broker accepts. Loopback
// needs the capability; public does not.
func TestManagerServiceAuthorityDoorIsTheBusDispatcher(t *testing.T) {
	t.Parallel()
	f := harness.StartFaces(t, nil)
	owner := harness.HumanOwner(t, f.TestPlane, f.Ip, "ivan")
	tok := f.Token(t, "ivan", time.Hour)
	nc := harness.CallerConn(t, f.TestPlane, owner, "cli")
	msa := func(fc harness.Face, request any) harness.Reply {
		return harness.Post(t, fc.Url+"/manager-service-authority", map[string]any{"idpToken": tok, "request": request}, fc.Auth...)
	}
	minted := harness.LastSeq(t, f.TestPlane, subjects.MintedStream(harness.TestSpace))

	nonsense := map[string]any{"kind": "nonsense", "actor": "cli"}
	bus := harness.Ask(t, nc, owner, "cli", subjects.EndpointManagerAuthority, nonsense)
	noRow := harness.Ask(t, nc, owner, "cli", subjects.EndpointManagerAuthority, harness.NewManagerKeys(t).Body(t, "prepare", "cli"))
	if bus.Code != "bad-request" || noRow.Code != "permission-denied" {
		t.Fatalf("on the bus: got %s and %s, want bad-request and permission-denied", bus.Code, noRow.Code)
	}
	harness.Grant(t, f.TestPlane, owner, "cli", "admin")
	for _, fc := range f.Faces() {
		refused(t, fc.Name+" a bad kind", msa(fc, nonsense), 400, bus.Code)
		refused(t, fc.Name+" a prepare with admin but not supervise", msa(fc, harness.NewManagerKeys(t).Body(t, "prepare", "cli")), 403, noRow.Code)
		refused(t, fc.Name+" a prepare as an actor with no row", msa(fc, harness.NewManagerKeys(t).Body(t, "prepare", "other")), 403, "permission-denied")
		refused(t, fc.Name+" a request that is an array", msa(fc, []any{1}), 400, "bad-request")
		refused(t, fc.Name+" an actor off its grammar", msa(fc, map[string]any{"kind": "nonsense", "actor": "c li"}), 400, "bad-request")
		refused(t, fc.Name+" no request", harness.Post(t, fc.Url+"/manager-service-authority", map[string]any{"idpToken": tok}, fc.Auth...), 400, "bad-request")
		refused(t, fc.Name+" no idpToken", harness.Post(t, fc.Url+"/manager-service-authority", map[string]any{"request": nonsense}, fc.Auth...), 400, "bad-request")
	}
	refused(t, "loopback without the capability", harness.Post(t, f.HTTPURL()+"/manager-service-authority",
		map[string]any{"idpToken": tok, "request": harness.NewManagerKeys(t).Body(t, "prepare", "cli")}), 401, "unauthenticated")
	if after := harness.LastSeq(t, f.TestPlane, subjects.MintedStream(harness.TestSpace)); after != minted {
		t.Fatalf("the refusals minted (%d → %d)", minted, after)
	}

	harness.Grant(t, f.TestPlane, owner, "cli", "supervise")
	for _, fc := range f.Faces() {
		m := harness.NewManagerKeys(t)
		r := msa(fc, m.Body(t, "prepare", "cli"))
		if r.Status != http.StatusOK {
			t.Fatalf("%s prepare with supervise: got %d %s, want 200", fc.Name, r.Status, r.Body)
		}
		var mat client.Material
		if err := json.Unmarshal(r.Body, &mat); err != nil {
			t.Fatal(err)
		}
		if mat.Owner != owner || mat.Operation != "prepare" || mat.InstanceID != m.Iid || mat.RegistrationProof == "" {
			t.Errorf("%s prepare: got owner %s op %s instance %s, want %s prepare %s with a proof", fc.Name, mat.Owner, mat.Operation, mat.InstanceID, owner, m.Iid)
		}
		harness.WantDuties(t, fc.Name+" prepare", mat, "supervisor", "executor")
		for duty, c := range mat.Credentials {
			claims, err := jwt.DecodeUserClaims(c.JWT)
			if err != nil || claims.Subject != m.Pub(t, subjects.Duty(duty)) || claims.IssuerAccount != f.Account() {
				t.Errorf("%s %s: got %+v (%v), want the manager's own key in the data account", fc.Name, duty, claims, err)
			}
			harness.Flush(t, harness.DutyConn(t, f.TestPlane, m, owner, subjects.Duty(duty), c.JWT))
		}
	}
}

// The bundle names the configured public URL (not the bound port) for both doors and the
// advertised server, when they are set.
func TestBundleNamesTheConfiguredPublicURLAndServer(t *testing.T) {
	t.Parallel()
	f := harness.StartFaces(t, func(c *service.Config) {
		c.PublicPort = 0
		c.PublicURL = "https://mesh.example"
		c.AdvertisedServer = "tls://nats.mesh.example:4222"
	})
	if f.PublicURL() != "https://mesh.example" {
		t.Errorf("the plane reports public URL %q, want the configured one", f.PublicURL())
	}
	b := harness.FetchBundle(t, f.Info.PublicListen)
	e := b.UserAuth.Endpoints
	if e.URL != "https://mesh.example" || e.ManagerAuthorityURL != "https://mesh.example/manager-service-authority" {
		t.Errorf("bundle endpoints: got %+v, want https://mesh.example and its /manager-service-authority", e)
	}
	if b.Server != "tls://nats.mesh.example:4222" || !b.TLSRequired || b.Space != harness.TestSpace || b.UserAuth.Provider != "cotal" {
		t.Errorf("bundle: got server %q tls %v space %q provider %q, want the advertised tls server", b.Server, b.TLSRequired, b.Space, b.UserAuth.Provider)
	}
	if b.UserAuth.IdP.Issuer != f.Ip.Issuer || b.UserAuth.IdP.Audience != f.Ip.Audience || b.UserAuth.IdP.URL != f.Ip.Server.URL {
		t.Errorf("bundle idp: got %+v", b.UserAuth.IdP)
	}
}

// Without them, the bundle names the bound port and the plane's own broker; its sentinel
// creds are a deny-all user that connects to nothing without a bearer.
func TestBundleSentinelCredsAreDenyAll(t *testing.T) {
	t.Parallel()
	f := harness.StartFaces(t, nil)
	b := harness.FetchBundle(t, f.PublicURL())
	if b.Server != f.NATSURL() || b.TLSRequired || b.UserAuth.Endpoints.URL != f.PublicURL() || !strings.HasPrefix(f.PublicURL(), "http://127.0.0.1:") {
		t.Errorf("bundle: got server %q tls %v url %q, want %s, false, the bound public face", b.Server, b.TLSRequired, b.UserAuth.Endpoints.URL, f.NATSURL())
	}
	token, err := jwt.ParseDecoratedJWT([]byte(b.SentinelCreds))
	if err != nil {
		t.Fatal(err)
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		t.Fatal(err)
	}
	if len(uc.Pub.Allow) != 0 || len(uc.Sub.Allow) != 0 || !uc.Pub.Deny.Contains(">") || !uc.Sub.Deny.Contains(">") || uc.IssuerAccount != f.Keys().Callout.Public() {
		t.Errorf("sentinel: got pub %+v sub %+v issuer account %s, want deny-all in the callout account", uc.Pub, uc.Sub, uc.IssuerAccount)
	}
	path := filepath.Join(t.TempDir(), "sentinel.creds")
	if err := os.WriteFile(path, []byte(b.SentinelCreds), 0o600); err != nil {
		t.Fatal(err)
	}
	if nc, err := nats.Connect(b.Server, nats.UserCredentials(path), nats.MaxReconnects(0), nats.Timeout(5*time.Second)); err == nil {
		nc.Close()
		t.Fatal("the sentinel creds with no token connected, want the callout to refuse")
	} else if !errors.Is(err, nats.ErrAuthorization) && !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Fatalf("the sentinel creds with no token: got %v, want an authorization violation", err)
	}
}

// keysAt opens the plane's bearer key set on a clock ahead of now by ahead: how an operator's
// `keys retire` looks once the retire floor has passed.
func keysAt(t testing.TB, p *harness.TestPlane, ahead time.Duration) *bearer.Keys {
	t.Helper()
	nc, err := admin.ConnectPlaneAccount(p.Keys(), p.NATSURL(), "keys-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	kv, err := store.OpenBucket(harness.GrantCtx(t), nc, subjects.KeysBucket(harness.TestSpace))
	if err != nil {
		t.Fatal(err)
	}
	return bearer.New(kv, func() time.Time { return time.Now().Add(ahead) })
}

// Rotation: /jwks publishes both kids at once, a bearer of the old key still connects and new
// bearers carry the new kid; the old key cannot be retired before the floor (1,200 s), the
// active one never; past the floor it retires, its bearers stop connecting and /jwks drops it.
func TestRotationKeepsOldBearersUntilTheRetireFloor(t *testing.T) {
	t.Parallel()
	f := harness.StartFaces(t, nil)
	owner := harness.HumanOwner(t, f.TestPlane, f.Ip, "judy")
	harness.Grant(t, f.TestPlane, owner, "cli")
	good := map[string]any{"idpToken": f.Token(t, "judy", time.Hour), "actor": "cli"}
	b := harness.FetchBundle(t, f.PublicURL())

	set, etag := fetchJWKS(t, f.PublicURL())
	oldKid := set.kids()[0]
	old := harness.Exchange(t, f.PublicURL(), good)
	if h, _ := harness.JwtParts(t, old.Token); h["kid"] != oldKid {
		t.Fatalf("a bearer before rotation: kid %v, want %s", h["kid"], oldKid)
	}
	keys, done, err := admin.BearerKeys(harness.GrantCtx(t), f.Keys(), f.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	newKid, err := keys.Rotate(harness.GrantCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, fc := range f.Faces() {
		set, etag2 := fetchJWKS(t, fc.Url)
		if kids := set.kids(); len(kids) != 2 || kids[0] != oldKid || kids[1] != newKid || etag2 == etag {
			t.Errorf("%s /jwks after rotation: got %v (ETag %s, was %s), want %s and %s under a new ETag", fc.Name, kids, etag2, etag, oldKid, newKid)
		}
		if r := harness.Get(t, fc.Url+"/jwks", "If-None-Match", etag); r.Status != http.StatusOK {
			t.Errorf("%s /jwks with the old ETag after rotation: got %d, want 200", fc.Name, r.Status)
		}
	}
	mustConnect(t, b, old.Token, owner, "cli")
	fresh := harness.Exchange(t, f.PublicURL(), good)
	if h, _ := harness.JwtParts(t, fresh.Token); h["kid"] != newKid {
		t.Fatalf("a bearer after rotation: kid %v, want %s", h["kid"], newKid)
	}
	mustConnect(t, b, fresh.Token, owner, "cli")

	if err := keys.Retire(harness.GrantCtx(t), oldKid); !errors.Is(err, bearer.ErrTooSoon) {
		t.Fatalf("retire the old key at once: got %v, want ErrTooSoon", err)
	}
	later := keysAt(t, f.TestPlane, bearer.RetireFloor+time.Second)
	if err := later.Retire(harness.GrantCtx(t), newKid); err == nil || errors.Is(err, bearer.ErrTooSoon) {
		t.Fatalf("retire the active key: got %v, want refused as active", err)
	}
	mustConnect(t, b, old.Token, owner, "cli")
	if err := later.Retire(harness.GrantCtx(t), oldKid); err != nil {
		t.Fatalf("retire past the floor: %v", err)
	}
	mustNotConnect(t, b, old.Token, owner, "cli", "a bearer of a retired key")
	mustConnect(t, b, fresh.Token, owner, "cli")
	for _, fc := range f.Faces() {
		if set, _ := fetchJWKS(t, fc.Url); len(set.kids()) != 1 || set.kids()[0] != newKid {
			t.Errorf("%s /jwks after retiring: got %v, want only %s", fc.Name, set.kids(), newKid)
		}
	}
}
