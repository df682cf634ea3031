package faces

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/handlers"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/capability/bearer"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/service"
)

// The HTTP faces' budgets: a peer's share of the public face's slots, the loopback doors'
// slots, and the wait for a body. Each is held by real slow bodies over real sockets.

// slowBody opens a door request on addr whose body never comes, from source address from
// (nil: the system's choice), with headers after the method line's (a Content-Type is always
// sent). It returns the connection and the answer's first line: "HTTP/1.1 100 Continue" when
// the door is reading the body (the request holds a slot until the body's deadline), or the
// refusal's status line when it was refused before.
func slowBody(t testing.TB, addr string, from net.IP, path string, headers ...string) (net.Conn, *bufio.Reader, string) {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second}
	if from != nil {
		d.LocalAddr = &net.TCPAddr{IP: from}
	}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	req := "POST " + path + " HTTP/1.1\r\nHost: mesh\r\nContent-Type: application/json\r\nContent-Length: 1000\r\nExpect: 100-continue\r\n"
	for i := 0; i+1 < len(headers); i += 2 {
		req += headers[i] + ": " + headers[i+1] + "\r\n"
	}
	if _, err := io.WriteString(c, req+"\r\n"); err != nil {
		t.Fatal(err)
	}
	if err := c.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(c)
	line, err := rd.ReadString('\n')
	if err != nil {
		t.Fatalf("a slow body to %s: %v", path, err)
	}
	if strings.HasPrefix(line, "HTTP/1.1 100") {
		if _, err := rd.ReadString('\n'); err != nil { // the blank line after 100 Continue
			t.Fatal(err)
		}
		if _, err := io.WriteString(c, "{"); err != nil {
			t.Fatal(err)
		}
	}
	return c, rd, strings.TrimSpace(line)
}

// One peer sending slow bodies as fast as it can holds its own share of the public face's
// slots and no more: past it each request is 429 before its body is read, counted in
// /metrics, and another peer's valid exchange is served meanwhile. Before the cap, 64 slow
// bodies from one peer held every slot and every other peer got 503 for as long as they
// lasted. The peer is the socket's address, or behind the trusted proxy the last
// X-Forwarded-For hop.
func TestOnePeerCannotHoldEveryPublicSlot(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		proxy     bool
		from      net.IP   // the flood's source address
		flood, ok []string // the flood's and the other peer's headers
	}{
		{"peers by their address", false, net.IPv4(127, 0, 0, 2), nil, nil},
		{"peers behind the trusted proxy", true, nil,
			[]string{"X-Forwarded-For", "198.51.100.1, 203.0.113.7"}, []string{"X-Forwarded-For", "203.0.113.8"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := harness.StartFaces(t, func(c *service.Config) {
				c.TrustedProxy = tt.proxy
				c.HTTPBodyTimeout = handlers.PublicDeadline // the flood's bodies stay held through the test
			})
			owner := harness.HumanOwner(t, f.TestPlane, f.Ip, "mia")
			harness.Grant(t, f.TestPlane, owner, "cli")
			good := map[string]any{"idpToken": f.Token(t, "mia", time.Hour), "actor": "cli"}
			addr := strings.TrimPrefix(f.PublicURL(), "http://")

			const flood = 70 // past the peer's 8 slots and the face's 64
			var held []net.Conn
			statuses := map[string]int{}
			for range flood {
				c, _, line := slowBody(t, addr, tt.from, "/exchange", tt.flood...)
				statuses[line]++
				if strings.HasPrefix(line, "HTTP/1.1 100") {
					held = append(held, c)
				}
			}
			// Another peer is served while the flood holds its share.
			if r := harness.Post(t, f.PublicURL()+"/exchange", good, tt.ok...); r.Status != http.StatusOK {
				t.Errorf("the other peer's exchange during the flood: got %d %s, want 200", r.Status, r.Body)
			}
			refusedPeer := flood - handlers.DefaultPeerInFlight
			if len(held) != handlers.DefaultPeerInFlight || statuses["HTTP/1.1 429 Too Many Requests"] != refusedPeer {
				t.Fatalf("%d slow bodies from one peer: got %v, want %d held and %d refused 429", flood, statuses, handlers.DefaultPeerInFlight, refusedPeer)
			}
			// The flooding peer's next request is refused before its body, whatever the route.
			r := harness.Get(t, f.PublicURL()+"/health", tt.flood...)
			if tt.from == nil {
				refused(t, "the flooding peer's next request", r, http.StatusTooManyRequests, "resource-exhausted")
			}
			m := harness.Scrape(t, f.HTTPURL())
			if got := harness.Sample(m, "authplane_http_refused_total", map[string]string{"face": "public", "budget": "peer_inflight"}); got < float64(refusedPeer) {
				t.Errorf("authplane_http_refused_total{public, peer_inflight}: got %v, want at least %d", got, refusedPeer)
			}
			if got := harness.Sample(m, "authplane_http_refused_total", map[string]string{"face": "public", "budget": "inflight"}); got != 0 {
				t.Errorf("authplane_http_refused_total{public, inflight}: got %v, want 0 (the face was never full)", got)
			}

			// Released, the peer's slots come back.
			for _, c := range held {
				c.Close()
			}
			testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
				if c, _, line := slowBody(t, addr, tt.from, "/exchange", tt.flood...); !strings.HasPrefix(line, "HTTP/1.1 100") {
					return fmt.Errorf("after releasing: got %q, want the body read", line)
				} else {
					c.Close()
				}
				return nil
			})
		})
	}
}

// A door waits for a body at most --http-body-timeout (2 s) after the headers, on either face:
// a body sent a byte at a time, as the slowloris did (a byte every 1.5 s), is cut then with
// 503, well before the public face's 10 s deadline, and counted in /metrics.
func TestABodyMustArriveWithinTwoSecondsOfItsHeaders(t *testing.T) {
	t.Parallel()
	f := harness.StartFaces(t, nil)
	for _, fc := range f.Faces() {
		t.Run(fc.Name, func(t *testing.T) {
			start := time.Now()
			c, rd, line := slowBody(t, strings.TrimPrefix(fc.Url, "http://"), nil, "/exchange", fc.Auth...)
			if !strings.HasPrefix(line, "HTTP/1.1 100") {
				t.Fatalf("a slow body: got %q, want the door reading it", line)
			}
			stop := make(chan struct{})
			defer close(stop)
			go func() {
				tick := time.NewTicker(1500 * time.Millisecond)
				defer tick.Stop()
				for {
					select {
					case <-stop:
						return
					case <-tick.C:
						if _, err := c.Write([]byte(" ")); err != nil {
							return
						}
					}
				}
			}()
			if err := c.SetReadDeadline(time.Now().Add(handlers.PublicDeadline + 5*time.Second)); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(rd, nil)
			elapsed := time.Since(start)
			if err != nil {
				t.Fatalf("after %s: %v, want a 503", elapsed, err)
			}
			defer resp.Body.Close()
			raw, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			refused(t, "a trickling body", harness.Reply{Status: resp.StatusCode, Header: resp.Header, Body: raw}, http.StatusServiceUnavailable, "unavailable")
			want := fmt.Sprintf("request body not received within %s of its headers", handlers.DefaultBodyTimeout)
			if !strings.Contains(string(raw), want) || elapsed < handlers.DefaultBodyTimeout || elapsed >= handlers.PublicDeadline {
				t.Errorf("a trickling body: got %s after %s, want %q after %s", raw, elapsed, want, handlers.DefaultBodyTimeout)
			}
			if got := harness.Sample(harness.Scrape(t, f.HTTPURL()), "authplane_http_refused_total", map[string]string{"face": fc.Name, "budget": "body_timeout"}); got != 1 {
				t.Errorf("authplane_http_refused_total{%s, body_timeout}: got %v, want 1", fc.Name, got)
			}
		})
	}
}

// Every loopback peer is 127.0.0.1 and every loopback door needs the one capability, so the
// loopback face's budget is global: its holders share --loopback-inflight door slots. Past
// them a door is 503 busy; /health, /jwks and /metrics read no body and are not in the budget,
// and the public face's slots are its own.
func TestTheLoopbackDoorsShareOneBudget(t *testing.T) {
	t.Parallel()
	const slots = 4
	f := harness.StartFaces(t, func(c *service.Config) {
		c.LoopbackInFlight = slots
		c.HTTPBodyTimeout = handlers.PublicDeadline
	})
	owner := harness.HumanOwner(t, f.TestPlane, f.Ip, "noa")
	harness.Grant(t, f.TestPlane, owner, "cli")
	good := map[string]any{"idpToken": f.Token(t, "noa", time.Hour), "actor": "cli"}
	addr := strings.TrimPrefix(f.HTTPURL(), "http://")
	var held []net.Conn
	for i := range slots {
		path := "/exchange"
		if i%2 == 1 {
			path = "/manager-service-authority"
		}
		c, _, line := slowBody(t, addr, nil, path, f.Cap...)
		if !strings.HasPrefix(line, "HTTP/1.1 100") {
			t.Fatalf("slow body %d: got %q, want the door reading it", i, line)
		}
		held = append(held, c)
	}
	r := harness.Post(t, f.HTTPURL()+"/exchange", good, f.Cap...)
	refused(t, "a loopback door past its slots", r, http.StatusServiceUnavailable, "unavailable")
	if r.Field("error") != "busy - retry shortly" {
		t.Errorf("a loopback door past its slots: got %s, want busy", r.Body)
	}
	if r := harness.Get(t, f.HTTPURL()+"/health"); r.Status != http.StatusOK {
		t.Errorf("loopback /health while the doors are full: got %d %s, want 200", r.Status, r.Body)
	}
	harness.Exchange(t, f.PublicURL(), good)
	if got := harness.Sample(harness.Scrape(t, f.HTTPURL()), "authplane_http_refused_total", map[string]string{"face": "loopback", "budget": "inflight"}); got != 1 {
		t.Errorf("authplane_http_refused_total{loopback, inflight}: got %v, want 1", got)
	}
	for _, c := range held {
		c.Close()
	}
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		if r := harness.Post(t, f.HTTPURL()+"/exchange", good, f.Cap...); r.Status != http.StatusOK {
			return fmt.Errorf("after releasing: got %d %s, want 200", r.Status, r.Body)
		}
		return nil
	})
}

// The body's deadline ends with the body: a door whose work outlasts it (here the IdP's key set
// answering late) still answers. Kept on the connection, the deadline would have cut the
// server's read after the body, which cancels the request under the door.
func TestADoorWhoseWorkOutlastsTheBodyTimeoutStillAnswers(t *testing.T) {
	t.Parallel()
	const wait = 100 * time.Millisecond
	f := harness.StartFaces(t, func(c *service.Config) { c.HTTPBodyTimeout = wait })
	owner := harness.HumanOwner(t, f.TestPlane, f.Ip, "ola")
	harness.Grant(t, f.TestPlane, owner, "cli")
	for _, fc := range f.Faces() {
		t.Run(fc.Name, func(t *testing.T) {
			// A key the plane has not fetched yet: the exchange waits on a fresh fetch.
			f.Clock.Advance(bearer.RefreshEvery + time.Second) // past the verifier's refresh interval
			stall := make(chan struct{})
			f.Ip.Stall.Store(&stall)
			before := f.Ip.Fetches.Load()
			got := make(chan harness.Reply, 1)
			token := f.Ip.Sign(t, f.Ip.Claims("ola", 2*time.Hour), map[string]any{"kid": randomKid(t)})
			go func() {
				// An unknown kid: refused 401 once the fetch lands; 503 if the request was cut.
				status, code, err := postQuiet(fc.Url+"/exchange", map[string]any{"idpToken": token, "actor": "cli"}, fc.Auth...)
				if err != nil {
					code = err.Error()
				}
				got <- harness.Reply{Status: status, Body: []byte(code)}
			}()
			testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
				if f.Ip.Fetches.Load() == before {
					return fmt.Errorf("no key set fetch yet")
				}
				return nil
			})
			<-time.After(10 * wait) // the work outlasts the body's deadline tenfold
			f.Ip.Stall.Store(nil)
			close(stall)
			if r := <-got; r.Status != http.StatusUnauthorized || string(r.Body) != "unauthenticated" {
				t.Errorf("a door answering after its body's deadline: got %d %s, want 401 unauthenticated (the token's kid judged, not the request cut)", r.Status, r.Body)
			}
		})
	}
}
