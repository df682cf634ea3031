package integration

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/internal/idp"
	"github.com/cotal-ai/authplane/internal/idp/idptest"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// The HTTP faces' harness: a plane with a public face trusting a test IdP, and a client that
// speaks to the faces with net/http as any client would.

// startFacesPlane starts a plane with a public face that trusts ip, changed by mutate (which
// may be nil).
func startFacesPlane(t testing.TB, ip *idptest.IdP, mutate func(*service.Config)) *testPlane {
	t.Helper()
	return startPlane(t, func(c *service.Config) {
		c.PublicPort = 0
		c.IdP = idp.Config{URL: ip.Server.URL, Issuer: ip.Issuer, Audience: ip.Audience, JWKS: ip.JWKS()}
		if mutate != nil {
			mutate(c)
		}
	})
}

// humanOwner is the owner the plane derives for sub at the test IdP.
func humanOwner(t testing.TB, p *testPlane, ip *idptest.IdP, sub string) string {
	t.Helper()
	o, err := admin.Owner(p.Keys(), ip.Issuer, sub)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// reply is one HTTP answer: its status, headers and body.
type reply struct {
	Status int
	Header http.Header
	Body   []byte
}

// field is a JSON field of the answer's body ("" when absent or not a string).
func (r reply) field(name string) string {
	var m map[string]any
	if json.Unmarshal(r.Body, &m) != nil {
		return ""
	}
	s, _ := m[name].(string)
	return s
}

// code is the refusal's code.
func (r reply) code() string { return r.field("code") }

// post sends body (marshalled unless it is already []byte or a string) to url as JSON, with
// headers.
func post(t testing.TB, url string, body any, headers ...string) reply {
	t.Helper()
	var data []byte
	switch b := body.(type) {
	case []byte:
		data = b
	case string:
		data = []byte(b)
	default:
		var err error
		if data, err = json.Marshal(body); err != nil {
			t.Fatal(err)
		}
	}
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	return do(t, req)
}

// get fetches url.
func get(t testing.TB, url string, headers ...string) reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	return do(t, req)
}

func do(t testing.TB, req *http.Request) reply {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for name := range resp.Header {
		if strings.HasPrefix(strings.ToLower(name), "access-control-") {
			t.Errorf("%s %s: header %s, want no CORS header ever", req.Method, req.URL, name)
		}
	}
	return reply{Status: resp.StatusCode, Header: resp.Header, Body: raw}
}

// capHeader is the loopback capability of the plane whose state is in dir, as a header.
func capHeader(t testing.TB, dir string) []string {
	t.Helper()
	info, err := admin.ReadServiceInfo(dir)
	if err != nil {
		t.Fatal(err)
	}
	return []string{"Authorization", "Bearer " + info.Cap}
}

// bundle is the discovery bundle as a client reads it.
type bundle struct {
	Space       string `json:"space"`
	Server      string `json:"server"`
	TLSRequired bool   `json:"tlsRequired"`
	UserAuth    struct {
		Provider string `json:"provider"`
		IdP      struct {
			URL      string `json:"url"`
			Issuer   string `json:"issuer"`
			Audience string `json:"audience"`
		} `json:"idp"`
		Endpoints struct {
			URL                 string `json:"url"`
			ManagerAuthorityURL string `json:"managerAuthorityUrl"`
		} `json:"endpoints"`
	} `json:"userAuth"`
	SentinelCreds string `json:"sentinelCreds"`
}

// fetchBundle reads the bundle at the public face's well-known path.
func fetchBundle(t testing.TB, publicURL string) bundle {
	t.Helper()
	r := get(t, publicURL+"/.well-known/cotal-mesh")
	if r.Status != http.StatusOK {
		t.Fatalf("bundle: got %d %s, want 200", r.Status, r.Body)
	}
	var b bundle
	dec := json.NewDecoder(bytes.NewReader(r.Body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		t.Fatalf("bundle %s: %v", r.Body, err)
	}
	return b
}

// exchanged is `/exchange`'s answer.
type exchanged struct {
	Token string `json:"token"`
	Owner string `json:"owner"`
	Exp   int64  `json:"exp"`
}

// exchange posts body to the face at url's /exchange and wants a bearer.
func exchange(t testing.TB, url string, body any, headers ...string) exchanged {
	t.Helper()
	r := post(t, url+"/exchange", body, headers...)
	if r.Status != http.StatusOK {
		t.Fatalf("exchange: got %d %s, want 200", r.Status, r.Body)
	}
	var e exchanged
	if err := json.Unmarshal(r.Body, &e); err != nil || e.Token == "" {
		t.Fatalf("exchange: %s: %v", r.Body, err)
	}
	return e
}

// bearerConnect connects to server through the auth callout: the bundle's sentinel creds, and
// the bearer as the token.
func bearerConnect(t testing.TB, b bundle, token, owner, actor string, opts ...nats.Option) (*nats.Conn, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sentinel.creds")
	if err := os.WriteFile(path, []byte(b.SentinelCreds), 0o600); err != nil {
		t.Fatal(err)
	}
	all := append([]nats.Option{
		nats.UserCredentials(path),
		nats.Token(token),
		nats.CustomInboxPrefix(subjects.InboxPrefix(owner, actor)),
		nats.MaxReconnects(0),
		nats.Timeout(5 * time.Second),
	}, opts...)
	nc, err := nats.Connect(b.Server, all...)
	if err == nil {
		t.Cleanup(nc.Close)
	}
	return nc, err
}

// grantCtx is a context for an admin call.
func grantCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// fakeClock is a plane's clock (service.Config.Now) that a test moves forward instead of
// sleeping: time.Now plus an offset.
type fakeClock struct{ off atomic.Int64 }

func (c *fakeClock) now() time.Time { return time.Now().Add(time.Duration(c.off.Load())) }

// advance moves the clock d forward.
func (c *fakeClock) advance(d time.Duration) { c.off.Add(int64(d)) }

// facesPlane is a plane with both faces, trusting its own test IdP, on a clock the test moves;
// cap is the loopback capability as a header.
type facesPlane struct {
	*testPlane
	ip    *idptest.IdP
	clock *fakeClock
	cap   []string
}

// startFaces starts a faces plane with a fresh IdP and clock, changed by mutate (may be nil).
func startFaces(t testing.TB, mutate func(*service.Config)) *facesPlane {
	t.Helper()
	ip := idptest.New(t)
	clock := &fakeClock{}
	var dir string
	p := startFacesPlane(t, ip, func(c *service.Config) {
		c.Now = clock.now
		if mutate != nil {
			mutate(c)
		}
		dir = c.Dir
	})
	return &facesPlane{testPlane: p, ip: ip, clock: clock, cap: capHeader(t, dir)}
}

// token is a valid IdP token for sub that lives ttl.
func (f *facesPlane) token(t testing.TB, sub string, ttl time.Duration) string {
	t.Helper()
	return f.ip.Token(t, f.ip.Claims(sub, ttl))
}

// face is one of a plane's two faces as a client reaches it: its base URL and the headers a
// door there needs (the capability on loopback, none in public).
type face struct {
	name string
	url  string
	auth []string
}

// faces are the plane's loopback and public faces.
func (f *facesPlane) faces() []face {
	return []face{{"loopback", f.HTTPURL(), f.cap}, {"public", f.PublicURL(), nil}}
}

// with is the face's door headers followed by more.
func (fc face) with(more ...string) []string { return append(slices.Clone(fc.auth), more...) }

// send sends a request as given: method, body (nil for none) and headers, nothing added.
func send(t testing.TB, method, url string, body []byte, headers ...string) reply {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	return do(t, req)
}

// refused fails the test unless r is a refusal with status and code whose body is exactly
// {error, code}: no bearer, no credential, nothing else.
func refused(t testing.TB, what string, r reply, status int, code string) {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.Body, &m); err != nil {
		t.Errorf("%s: got %d %q, want a JSON refusal %d %s", what, r.Status, r.Body, status, code)
		return
	}
	_, hasError := m["error"]
	if r.Status != status || m["code"] != code || !hasError || len(m) != 2 {
		t.Errorf("%s: got %d %s, want %d {error, code: %s} and nothing else", what, r.Status, r.Body, status, code)
	}
}

// jwtParts decodes a compact JWT's header and claims, unverified.
func jwtParts(t testing.TB, token string) (header, claims map[string]any) {
	t.Helper()
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		t.Fatalf("%q is not a compact JWT", token)
	}
	for i, v := range []*map[string]any{&header, &claims} {
		raw, err := base64.RawURLEncoding.DecodeString(parts[i])
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(raw, v); err != nil {
			t.Fatal(err)
		}
	}
	return header, claims
}
