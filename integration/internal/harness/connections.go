package harness

import (
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/admin"
)

// Hog opens connections with one credential as fast as the broker lets it, and opens another
// whenever one is closed, until stop: what one caller can do to the data account's 40
// connections. It reports the longest life of a connection that was closed under it.
type Hog struct {
	live    atomic.Int64
	Opened  atomic.Int64
	Refused atomic.Int64
	Longest atomic.Int64 // nanoseconds
	ending  atomic.Bool
	stop    chan struct{}
	done    chan struct{}

	mu    sync.Mutex
	conns []hogConn
}

type hogConn struct {
	nc     *nats.Conn
	opened time.Time
}

// Held counts the hog's connections that are up and older than d.
func (h *Hog) Held(d time.Duration) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, c := range h.conns {
		if c.nc.IsConnected() && time.Since(c.opened) > d {
			n++
		}
	}
	return n
}

// StartHogWith is startHog for any credential: auth says how the hog's connections
// authenticate (a bearer through the auth callout, say).
func StartHogWith(t *testing.T, url string, want int, auth ...nats.Option) *Hog {
	t.Helper()
	h := &Hog{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(h.done)
		for {
			select {
			case <-h.stop:
				h.ending.Store(true) // what is closed from here on, the hog closed
				h.mu.Lock()
				for _, c := range h.conns {
					c.nc.Close()
				}
				h.mu.Unlock()
				return
			default:
			}
			if h.live.Load() >= int64(want) {
				time.Sleep(5 * time.Millisecond) // the hog's pacing, not a wait for the plane
				continue
			}
			// A kick may land before Connect returns: the life counts from the attempt.
			opened := time.Now()
			nc, err := nats.Connect(url, append(slices.Clone(auth), nats.NoReconnect(), nats.Name("hog"),
				nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}), // held out: "authentication revoked"
				nats.ClosedHandler(func(*nats.Conn) {
					h.live.Add(-1)
					if h.ending.Load() {
						return
					}
					if life := time.Since(opened); int64(life) > h.Longest.Load() {
						h.Longest.Store(int64(life))
					}
				}))...)
			if err != nil {
				h.Refused.Add(1)
				time.Sleep(5 * time.Millisecond)
				continue
			}
			h.live.Add(1)
			h.Opened.Add(1)
			time.Sleep(5 * time.Millisecond) // the hog's pacing: 200 connects a second at most
			h.mu.Lock()
			h.conns = append(h.conns, hogConn{nc, opened})
			h.mu.Unlock()
		}
	}()
	t.Cleanup(h.End)
	return h
}

func (h *Hog) End() {
	select {
	case <-h.stop:
	default:
		close(h.stop)
	}
	<-h.done
}

// AgentBearer makes owner.actor a managed agent and exchanges its secret on p's public face.
func AgentBearer(t *testing.T, p *TestPlane, owner, actor string) string {
	t.Helper()
	secret, _, err := admin.SetAgent(GrantCtx(t), p.Keys(), p.NATSURL(), owner, actor)
	if err != nil {
		t.Fatal(err)
	}
	return Exchange(t, p.PublicURL(), map[string]any{"owner": owner, "actor": actor, "actorToken": secret}).Token
}
