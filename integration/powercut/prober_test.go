package powercut

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// A restart must not admit an ended credential even for a moment: the broker listens before
// the plane has done anything, and what it holds then is what the disk kept. A prober tries
// credentials of ended instances against the restarting server from the cut on, until the
// checks are done.

// probeCreds is how many ended credentials a prober tries, one instance each where it can.
const probeCreds = 8

// prober connects with ended credentials, round after round, and keeps what got in.
type prober struct {
	url      string
	creds    []*cred
	cut      time.Time
	stop     chan struct{}
	done     chan struct{}
	mu       sync.Mutex
	attempts int
	admitted map[string]loss // by nkey: the first time it got in
}

// endedCreds picks up to probeCreds unexpired credentials of ended instances with their seeds,
// one per instance first.
func (a *acks) endedCreds() []*cred {
	a.mu.Lock()
	defer a.mu.Unlock()
	soon := time.Now().Add(time.Minute).Unix()
	byInstance := map[string][]*cred{}
	for _, k := range slices.Sorted(maps.Keys(a.creds)) {
		cr := a.creds[k]
		if _, ended := a.ends[cr.Instance]; ended && cr.Exp > soon && cr.seed != nil {
			byInstance[cr.Instance] = append(byInstance[cr.Instance], cr)
		}
	}
	var out []*cred
	for round := 0; len(out) < probeCreds; round++ {
		added := false
		for _, iid := range slices.Sorted(maps.Keys(byInstance)) {
			if cs := byInstance[iid]; round < len(cs) && len(out) < probeCreds {
				out, added = append(out, cs[round]), true
			}
		}
		if !added {
			break
		}
	}
	return out
}

// startProber probes url with creds from now on (the cut was at cut).
func startProber(url string, creds []*cred, cut time.Time) *prober {
	p := &prober{url: url, creds: creds, cut: cut, stop: make(chan struct{}), done: make(chan struct{}), admitted: map[string]loss{}}
	go func() {
		defer close(p.done)
		if len(creds) == 0 {
			return
		}
		for {
			for _, cr := range creds {
				select {
				case <-p.stop:
					return
				default:
				}
				nc, err := nats.Connect(url, nats.UserJWTAndSeed(cr.jwt, string(cr.seed)), nats.MaxReconnects(0), nats.Timeout(2*time.Second))
				p.mu.Lock()
				p.attempts++
				if _, seen := p.admitted[cr.NKey]; err == nil && !seen {
					p.admitted[cr.NKey] = loss{kindEnd, fmt.Sprintf("the restarting broker admitted the %s credential %s of ended instance %s, %s after the cut",
						cr.Duty, cr.NKey, cr.Instance, time.Since(cut).Round(time.Millisecond))}
				}
				if err == nil {
					nc.Close()
				}
				p.mu.Unlock()
			}
			select {
			case <-p.stop:
				return
			case <-time.After(50 * time.Millisecond): // the next round: the server may be up by then
			}
		}
	}()
	return p
}

// finish stops the prober and returns what got in, and how many connects it tried.
func (p *prober) finish() ([]loss, int) {
	close(p.stop)
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Collect(maps.Values(p.admitted)), p.attempts
}
