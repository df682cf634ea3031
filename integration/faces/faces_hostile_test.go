package faces

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"

	"github.com/cotal-ai/authplane/handlers"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// Hostile callers of the HTTP faces: forged and foreign tokens presented as IdP tokens, a flood
// of unknown kids, a body that trickles, and more requests than the public face holds.

// Every forged or foreign token is refused as an IdP token by both doors that take one, 401
// unauthenticated with no bearer and no credential, although its subject holds a row with
// `supervise` (a forgery that passed would mint); the genuine token then works on both.
func TestHostileIdPTokensAreRefusedByBothDoors(t *testing.T) {
	t.Parallel()
	f := harness.StartFaces(t, func(c *service.Config) { c.TrustedProxy = true })
	owner := harness.HumanOwner(t, f.TestPlane, f.Ip, "someone") // the forgeries' subject
	harness.Grant(t, f.TestPlane, owner, "cli", "supervise")
	genuine := f.Token(t, "someone", time.Hour)
	planeBearer := harness.Exchange(t, f.PublicURL(), map[string]any{"idpToken": genuine, "actor": "cli"}).Token

	creds, err := os.ReadFile(harness.WriteCallerCreds(t, f.Keys(), owner, "cli"))
	if err != nil {
		t.Fatal(err)
	}
	natsJWT, err := jwt.ParseDecoratedJWT(creds)
	if err != nil {
		t.Fatal(err)
	}
	other := testkit.NewIdP(t) // another IdP's key, under this IdP's kid, issuer and audience
	claims := f.Ip.Claims("someone", time.Hour)
	forgeries := append(f.Ip.Forgeries(t),
		testkit.Forgery{Name: "a plane bearer", Token: planeBearer},
		testkit.Forgery{Name: "a NATS user JWT", Token: natsJWT},
		testkit.Forgery{Name: "another IdP's key under this IdP's kid", Token: other.Sign(t, claims, map[string]any{"kid": f.Ip.KID})},
		testkit.Forgery{Name: "an x5c header", Token: f.Ip.Sign(t, claims, map[string]any{"kid": f.Ip.KID, "x5c": []string{"MIIBfake"}})},
		testkit.Forgery{Name: "a crit header", Token: f.Ip.Sign(t, claims, map[string]any{"kid": f.Ip.KID, "crit": []string{"exp"}})},
		testkit.Forgery{Name: "an empty token", Token: ""},
	)
	if len(forgeries) > 250 {
		t.Fatal("too many forgeries for one peer each")
	}
	minted := harness.LastSeq(t, f.TestPlane, subjects.MintedStream(harness.TestSpace))
	for i, fg := range forgeries {
		// Each forgery from its own peer, so no answer is the throttle's 429.
		peer := fmt.Sprintf("192.0.2.%d", i+1)
		r := harness.Post(t, f.PublicURL()+"/exchange", map[string]any{"idpToken": fg.Token, "actor": "cli"}, "X-Forwarded-For", peer)
		refused(t, fg.Name+" at /exchange", r, 401, "unauthenticated")
		r = harness.Post(t, f.PublicURL()+"/manager-service-authority", map[string]any{"idpToken": fg.Token, "request": harness.NewManagerKeys(t).Body(t, "prepare", "cli")}, "X-Forwarded-For", peer)
		refused(t, fg.Name+" at /manager-service-authority", r, 401, "unauthenticated")
		if msg := r.Field("error"); !strings.HasPrefix(msg, "the IdP token is refused") || (len(fg.Token) > 16 && strings.Contains(msg, fg.Token[:16])) {
			t.Errorf("%s: got %q, want the IdP check's refusal, never echoing the token", fg.Name, msg)
		}
	}
	if after := harness.LastSeq(t, f.TestPlane, subjects.MintedStream(harness.TestSpace)); after != minted {
		t.Fatalf("the forgeries minted (%d → %d)", minted, after)
	}
	// The genuine token works on both doors: the refusals were the tokens'.
	if e := harness.Exchange(t, f.PublicURL(), map[string]any{"idpToken": genuine, "actor": "cli"}); e.Owner != owner {
		t.Errorf("the genuine token: got owner %s, want %s", e.Owner, owner)
	}
	if r := harness.Post(t, f.PublicURL()+"/manager-service-authority", map[string]any{"idpToken": genuine, "request": harness.NewManagerKeys(t).Body(t, "prepare", "cli")}); r.Status != http.StatusOK {
		t.Errorf("the genuine token's prepare: got %d %s, want 200", r.Status, r.Body)
	}
}

// oneShot is a client whose every request has its own connection, closed after it: a burst
// of concurrent requests leaves no spare connection open (a connection that never carried a
// request would hold the plane's shutdown up).
var oneShot = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}

// postQuiet posts body as JSON to url from any goroutine: the status and code, or an error.
func postQuiet(url string, body any, headers ...string) (int, string, error) {
	data, err := json.Marshal(body)
	if err != nil {
		return 0, "", err
	}
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(data))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := oneShot.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, "", err
	}
	var m struct {
		Code  string `json:"code"`
		Token string `json:"token"`
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return resp.StatusCode, "", fmt.Errorf("%d %q: %w", resp.StatusCode, raw, err)
	}
	if m.Token != "" {
		return resp.StatusCode, m.Code, fmt.Errorf("a bearer was issued: %s", raw)
	}
	return resp.StatusCode, m.Code, nil
}

// randomKid is a kid no key set has.
func randomKid(t testing.TB) string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// A flood of tokens under unknown kids, signed with the IdP's own key and sent at once, is
// refused without a flood of JWKS fetches: at most one refetch per refresh interval. Once the
// interval has passed (on the plane's clock) an unknown kid refetches once, and the genuine
// token works throughout.
func TestAnUnknownKidFloodFetchesTheIdPKeySetOnce(t *testing.T) {
	t.Parallel()
	f := harness.StartFaces(t, func(c *service.Config) { c.TrustedProxy = true })
	owner := harness.HumanOwner(t, f.TestPlane, f.Ip, "kate")
	harness.Grant(t, f.TestPlane, owner, "cli")
	good := map[string]any{"idpToken": f.Token(t, "kate", time.Hour), "actor": "cli"}
	harness.Exchange(t, f.PublicURL(), good) // the first token fetches the key set
	if n := f.Ip.Fetches.Load(); n != 1 {
		t.Fatalf("the first exchange fetched the key set %d times, want once", n)
	}

	const flood = 50
	tokens := make([]string, flood)
	for i := range tokens {
		tokens[i] = f.Ip.Sign(t, f.Ip.Claims("kate", time.Hour), map[string]any{"kid": randomKid(t)})
	}
	var wg sync.WaitGroup
	errs := make(chan error, flood)
	for i, tok := range tokens {
		wg.Go(func() {
			status, code, err := postQuiet(f.PublicURL()+"/exchange", map[string]any{"idpToken": tok, "actor": "cli"}, "X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i+1))
			if err == nil && (status != 401 || code != "unauthenticated") {
				err = fmt.Errorf("got %d %s, want 401 unauthenticated", status, code)
			}
			if err != nil {
				errs <- fmt.Errorf("unknown kid %d: %w", i, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := f.Ip.Fetches.Load(); n > 2 {
		t.Fatalf("%d tokens under unknown kids fetched the key set %d times, want at most 2", flood, n)
	}
	harness.Exchange(t, f.PublicURL(), good)

	before := f.Ip.Fetches.Load()
	f.Clock.Advance(11 * time.Second)
	for i := range 2 {
		r := harness.Post(t, f.PublicURL()+"/exchange", map[string]any{"idpToken": f.Ip.Sign(t, f.Ip.Claims("kate", time.Hour), map[string]any{"kid": randomKid(t)}), "actor": "cli"})
		refused(t, "an unknown kid past the interval", r, 401, "unauthenticated")
		if n := f.Ip.Fetches.Load(); n != before+1 {
			t.Fatalf("unknown kid %d past the refresh interval: %d fetches, want %d (one refetch, then none)", i, n, before+1)
		}
	}
	harness.Exchange(t, f.PublicURL(), good)
}

// A public request whose body trickles in slower than the deadline is answered 503 when the
// deadline passes, however often a byte arrives: the deadline is on the whole request, not on
// each read. (Here the wait for a body is as long as the deadline; by default a body is cut
// after 2 s, TestABodyMustArriveWithinTwoSecondsOfItsHeaders.)
func TestASlowPublicBodyIsCutAtTheDeadline(t *testing.T) {
	harness.Long(t, "waits out the public face's 10 s deadline")
	t.Parallel()
	f := harness.StartFaces(t, func(c *service.Config) { c.HTTPBodyTimeout = handlers.PublicDeadline })
	conn, err := net.Dial("tcp", strings.TrimPrefix(f.PublicURL(), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	if _, err := io.WriteString(conn, "POST /exchange HTTP/1.1\r\nHost: mesh\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if _, err := conn.Write([]byte(" ")); err != nil {
					return
				}
			}
		}
	})
	defer wg.Wait()
	defer close(stop)
	if err := conn.SetReadDeadline(time.Now().Add(handlers.PublicDeadline + 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	elapsed := time.Since(start)
	if err != nil {
		t.Fatalf("after %s: %v, want a 503", elapsed, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	refused(t, "a trickling body", harness.Reply{Status: resp.StatusCode, Header: resp.Header, Body: raw}, 503, "unavailable")
	if !strings.Contains(string(raw), "request deadline exceeded") || elapsed < handlers.PublicDeadline-time.Second || elapsed > handlers.PublicDeadline+3*time.Second {
		t.Errorf("a trickling body: got %s after %s, want the deadline's refusal after %s", raw, elapsed, handlers.PublicDeadline)
	}
}

// holdPublic opens a public /exchange request from peer (its X-Forwarded-For) that waits on
// its body, and returns once the door is reading it (the server's 100 Continue says so): it
// holds one of the face's slots until the connection closes or the body's deadline passes.
func holdPublic(t testing.TB, addr, peer string) net.Conn {
	t.Helper()
	c, _, line := slowBody(t, addr, nil, "/exchange", "X-Forwarded-For", peer)
	if !strings.HasPrefix(line, "HTTP/1.1 100") {
		t.Fatalf("a held request: got %q, want 100 Continue", line)
	}
	return c
}

// The public face holds at most 64 requests at once, every peer's together: with 64 waiting
// on their bodies (8 peers' shares), any further request is 503 busy, whatever its route and
// whoever sends it (the loopback face's slots are its own); released, the slots return.
func TestThePublicFaceCapsRequestsInFlight(t *testing.T) {
	t.Parallel()
	f := harness.StartFaces(t, func(c *service.Config) {
		c.TrustedProxy = true
		c.HTTPBodyTimeout = handlers.PublicDeadline // the held bodies stay held through the test
	})
	owner := harness.HumanOwner(t, f.TestPlane, f.Ip, "liam")
	harness.Grant(t, f.TestPlane, owner, "cli")
	good := map[string]any{"idpToken": f.Token(t, "liam", time.Hour), "actor": "cli"}
	addr := strings.TrimPrefix(f.PublicURL(), "http://")
	var held []net.Conn
	for i := range handlers.PublicMaxInFlight {
		held = append(held, holdPublic(t, addr, fmt.Sprintf("192.0.2.%d", 1+i/handlers.DefaultPeerInFlight)))
	}
	busy := func(r harness.Reply) error {
		if r.Status != http.StatusServiceUnavailable || r.Code() != "unavailable" || r.Field("error") != "busy - retry shortly" {
			return fmt.Errorf("got %d %s, want 503 busy", r.Status, r.Body)
		}
		return nil
	}
	for what, r := range map[string]harness.Reply{
		"a valid exchange": harness.Post(t, f.PublicURL()+"/exchange", good),
		"the bundle":       harness.Get(t, f.PublicURL()+"/.well-known/cotal-mesh"),
		"health":           harness.Get(t, f.PublicURL()+"/health"),
		"an unknown path":  harness.Get(t, f.PublicURL()+"/nope"),
	} {
		if err := busy(r); err != nil {
			t.Errorf("%s past the cap: %v", what, err)
		}
	}
	harness.Exchange(t, f.HTTPURL(), good, f.Cap...)

	// Released (their clients gone), the slots come back.
	for _, c := range held {
		c.Close()
	}
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		if r := harness.Get(t, f.PublicURL()+"/health"); r.Status != http.StatusOK {
			return fmt.Errorf("after releasing: got %d %s, want 200", r.Status, r.Body)
		}
		return nil
	})
	harness.Exchange(t, f.PublicURL(), good)
}

// An anonymous caller that sends a junk token under an unknown kid and hangs up at once does
// not blind the plane to the IdP's key set: the fetch it set off is the plane's, and lands, and
// a genuine login after it gets its bearer. Before, the hang-up cancelled the fetch, which still
// counted as the interval's refresh: every human was refused for 10 s, per anonymous request.
func TestAHungUpJunkTokenDoesNotBlindTheIdPVerifier(t *testing.T) {
	t.Parallel()
	f := harness.StartFaces(t, nil)
	owner := harness.HumanOwner(t, f.TestPlane, f.Ip, "victim")
	harness.Grant(t, f.TestPlane, owner, "cli")
	junk := testkit.Unsigned(t, map[string]any{"alg": "EdDSA", "kid": "nope"}, map[string]any{"sub": "x"}, []byte("sig"))
	body := fmt.Sprintf(`{"idpToken":%q,"actor":"cli"}`, junk)
	c, err := net.Dial("tcp", strings.TrimPrefix(f.PublicURL(), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Fprintf(c, "POST /exchange HTTP/1.1\r\nHost: mesh\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body); err != nil {
		t.Fatal(err)
	}
	c.Close() // hang up at once
	testkit.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		if f.Ip.Fetches.Load() == 0 {
			return errors.New("the junk token's key set fetch never reached the IdP")
		}
		return nil
	})
	r := harness.Post(t, f.PublicURL()+"/exchange", map[string]any{"idpToken": f.Token(t, "victim", time.Hour), "actor": "cli"})
	if r.Status != http.StatusOK {
		t.Fatalf("a genuine exchange after a hung-up junk token: got %d %s, want 200", r.Status, r.Body)
	}
}

// An IdP whose key set cannot be fetched is the plane's outage, answered 503 unavailable by
// both doors, and the answer names neither the key set's address nor the dial error.
func TestAnUnreachableIdPIsUnavailableAndItsAddressIsNotShown(t *testing.T) {
	t.Parallel()
	dead := fmt.Sprintf("127.0.0.1:%d", harness.FreePorts(t, 1)[0]) // nothing listens there: every fetch is refused
	f := harness.StartFaces(t, func(c *service.Config) { c.IdP.JWKS = "http://" + dead + "/jwks" })
	token := f.Token(t, "kate", time.Hour)
	for path, body := range map[string]any{
		"/exchange":                  map[string]any{"idpToken": token, "actor": "cli"},
		"/manager-service-authority": map[string]any{"idpToken": token, "request": harness.NewManagerKeys(t).Body(t, "prepare", "cli")},
	} {
		r := harness.Post(t, f.PublicURL()+path, body)
		if r.Status != http.StatusServiceUnavailable || r.Code() != "unavailable" {
			t.Fatalf("%s: got %d %s, want 503 unavailable", path, r.Status, r.Body)
		}
		if bytes.Contains(r.Body, []byte(dead)) || bytes.Contains(r.Body, []byte("/jwks")) || bytes.Contains(r.Body, []byte("connection refused")) {
			t.Fatalf("%s: the refusal shows the key set's address or the dial error: %s", path, r.Body)
		}
	}
}
