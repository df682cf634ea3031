package harness

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
	"github.com/cotal-ai/authplane/internal/capability/bearer"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// The HTTP faces' harness: a plane with a public face trusting a test IdP, and a client that
// speaks to the faces with net/http as any client would.

// StartFacesPlane starts a plane with a public face that trusts ip, changed by mutate (which
// may be nil).
func StartFacesPlane(t testing.TB, ip *testkit.IdP, mutate func(*service.Config)) *TestPlane {
	t.Helper()
	return StartPlane(t, func(c *service.Config) {
		c.PublicPort = 0
		c.IdP = bearer.IdPConfig{URL: ip.Server.URL, Issuer: ip.Issuer, Audience: ip.Audience, JWKS: ip.JWKS()}
		if mutate != nil {
			mutate(c)
		}
	})
}

// HumanOwner is the owner the plane derives for sub at the test IdP.
func HumanOwner(t testing.TB, p *TestPlane, ip *testkit.IdP, sub string) string {
	t.Helper()
	o, err := admin.Owner(p.Keys(), ip.Issuer, sub)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// Reply is one HTTP answer: its status, headers and body.
type Reply struct {
	Status int
	Header http.Header
	Body   []byte
}

// Field is a JSON field of the answer's body ("" when absent or not a string).
func (r Reply) Field(name string) string {
	var m map[string]any
	if json.Unmarshal(r.Body, &m) != nil {
		return ""
	}
	s, _ := m[name].(string)
	return s
}

// Code is the refusal's code.
func (r Reply) Code() string { return r.Field("code") }

// Post sends body (marshalled unless it is already []byte or a string) to url as JSON, with
// headers.
func Post(t testing.TB, url string, body any, headers ...string) Reply {
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
	return Do(t, req)
}

// Get fetches url.
func Get(t testing.TB, url string, headers ...string) Reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	return Do(t, req)
}

func Do(t testing.TB, req *http.Request) Reply {
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
	return Reply{Status: resp.StatusCode, Header: resp.Header, Body: raw}
}

// CapHeader is the loopback capability of the plane whose state is in dir, as a header.
func CapHeader(t testing.TB, dir string) []string {
	t.Helper()
	info, err := admin.ReadServiceInfo(dir)
	if err != nil {
		t.Fatal(err)
	}
	return []string{"Authorization", "Bearer " + info.Cap}
}

// Bundle is the discovery bundle as a client reads it.
type Bundle struct {
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

// FetchBundle reads the bundle at the public face's well-known path.
func FetchBundle(t testing.TB, publicURL string) Bundle {
	t.Helper()
	r := Get(t, publicURL+"/.well-known/cotal-mesh")
	if r.Status != http.StatusOK {
		t.Fatalf("bundle: got %d %s, want 200", r.Status, r.Body)
	}
	var b Bundle
	dec := json.NewDecoder(bytes.NewReader(r.Body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		t.Fatalf("bundle %s: %v", r.Body, err)
	}
	return b
}

// Exchanged is `/exchange`'s answer.
type Exchanged struct {
	Token string `json:"token"`
	Owner string `json:"owner"`
	Exp   int64  `json:"exp"`
}

// Exchange posts body to the face at url's /exchange and wants a bearer.
func Exchange(t testing.TB, url string, body any, headers ...string) Exchanged {
	t.Helper()
	r := Post(t, url+"/exchange", body, headers...)
	if r.Status != http.StatusOK {
		t.Fatalf("exchange: got %d %s, want 200", r.Status, r.Body)
	}
	var e Exchanged
	if err := json.Unmarshal(r.Body, &e); err != nil || e.Token == "" {
		t.Fatalf("exchange: %s: %v", r.Body, err)
	}
	return e
}

// BearerConnect connects to server through the auth callout: the bundle's sentinel creds, and
// the bearer as the token.
func BearerConnect(t testing.TB, b Bundle, token, owner, actor string, opts ...nats.Option) (*nats.Conn, error) {
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

// GrantCtx is a context for an admin call.
func GrantCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// FakeClock is a plane's clock (service.Config.Now) that a test moves forward instead of
// sleeping: time.Now plus an offset.
type FakeClock struct{ off atomic.Int64 }

func (c *FakeClock) Now() time.Time { return time.Now().Add(time.Duration(c.off.Load())) }

// Advance moves the clock d forward.
func (c *FakeClock) Advance(d time.Duration) { c.off.Add(int64(d)) }

// FacesPlane is a plane with both faces, trusting its own test IdP, on a clock the test moves;
// cap is the loopback capability as a header.
type FacesPlane struct {
	*TestPlane
	Ip    *testkit.IdP
	Clock *FakeClock
	Cap   []string
}

// StartFaces starts a faces plane with a fresh IdP and clock, changed by mutate (may be nil).
func StartFaces(t testing.TB, mutate func(*service.Config)) *FacesPlane {
	t.Helper()
	ip := testkit.NewIdP(t)
	clock := &FakeClock{}
	var dir string
	p := StartFacesPlane(t, ip, func(c *service.Config) {
		c.Now = clock.Now
		if mutate != nil {
			mutate(c)
		}
		dir = c.Dir
	})
	return &FacesPlane{TestPlane: p, Ip: ip, Clock: clock, Cap: CapHeader(t, dir)}
}

// Token is a valid IdP token for sub that lives ttl.
func (f *FacesPlane) Token(t testing.TB, sub string, ttl time.Duration) string {
	t.Helper()
	return f.Ip.Token(t, f.Ip.Claims(sub, ttl))
}

// Face is one of a plane's two faces as a client reaches it: its base URL and the headers a
// door there needs (the capability on loopback, none in public).
type Face struct {
	Name string
	Url  string
	Auth []string
}

// Faces are the plane's loopback and public faces.
func (f *FacesPlane) Faces() []Face {
	return []Face{{"loopback", f.HTTPURL(), f.Cap}, {"public", f.PublicURL(), nil}}
}

// With is the face's door headers followed by more.
func (fc Face) With(more ...string) []string { return append(slices.Clone(fc.Auth), more...) }

// JwtParts decodes a compact JWT's header and claims, unverified.
func JwtParts(t testing.TB, token string) (header, claims map[string]any) {
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
