package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/cotal-ai/authplane/internal/capability/bearer"
	"github.com/cotal-ai/authplane/internal/capability/manager"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/subjects"
)

// How a storm's connections reach the broker.
const (
	// ViaCallout: the bundle's sentinel creds and a bearer, through the plane's auth callout.
	ViaCallout = "callout"
	// ViaCeiling: the same bearers through a callout that signs a fixed user and reads nothing.
	ViaCeiling = "callout ceiling"
	// ViaJWT: a user JWT per connection, signed beforehand; no callout.
	ViaJWT = "jwt"
)

// stormActor is every storm principal's actor; each has its own owner.
const stormActor = "storm"

// stormTimeout bounds one storm: a connection not made by then is counted as not connected.
const stormTimeout = 2 * time.Minute

// Storm is one reconnect storm: N connections started at once, each retried as nats.go
// reconnects (nats.DefaultReconnectWait plus up to nats.DefaultReconnectJitter) until it is
// connected or the storm's time is up.
type Storm struct {
	Via string `json:"via"`
	N   int    `json:"n"`
	// Connected counts the connections made; AllS is the time from the start until the last of
	// them (0 when some never connected), and ConnectsPerS is Connected over it (over the
	// storm's bound when some never connected).
	Connected    int     `json:"connected"`
	AllS         float64 `json:"all_connected_s"`
	ConnectsPerS float64 `json:"connects_per_s"`
	// P50 and P99 are the times from the start until a connection was made, in milliseconds.
	P50 float64 `json:"p50_ms"`
	P99 float64 `json:"p99_ms"`
	// Attempts counts every connect; FailedAttempts those the broker refused or timed out (the
	// callout did not answer within the broker's wait).
	Attempts       int `json:"attempts"`
	FailedAttempts int `json:"failed_attempts"`
	// Errors counts the failed attempts by what the client saw.
	Errors map[string]int `json:"errors,omitempty"`
	// Answers counts the plane's callout answers during the storm by code ("ok" or the
	// refusal's), from its metrics; only for ViaCallout.
	Answers map[string]int `json:"callout_answers,omitempty"`
	// CPUPerConnect is the process's CPU time per connection made, in microseconds.
	CPUPerConnect float64 `json:"cpu_us_per_connect"`
	// RatioToCeiling compares a callout storm's connects/s with the ceiling's at the same N.
	RatioToCeiling float64 `json:"ratio_to_ceiling,omitempty"`
}

// runStorms runs, for each N of cfg.Storm, a storm of N connections through the callout
// ceiling, through the plane's callout, and with direct JWTs, each principal its own.
func runStorms(ctx context.Context, t Target, s *side, cfg Config, progress io.Writer) ([]Storm, error) {
	most := slices.Max(cfg.Storm)
	limit, err := raiseFileLimit(uint64(2*most + 1024))
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(progress, "bench: storm: %d principals (file descriptors: %d)\n", most, limit)
	ps, err := stormPrincipals(ctx, t, s, most)
	if err != nil {
		return nil, err
	}
	data, err := issue.NewIssuer(t.Keys.Data.Public(), t.Keys.Data.Signer, time.Now)
	if err != nil {
		return nil, err
	}
	ceiling, err := startCeiling(ctx, t, s, data)
	if err != nil {
		return nil, fmt.Errorf("the callout ceiling: %w", err)
	}
	defer ceiling.close()
	sentinel, err := t.Keys.SentinelCreds()
	if err != nil {
		return nil, err
	}
	sentinelJWT, sentinelSeed, err := decodeCreds(sentinel)
	if err != nil {
		return nil, err
	}
	baseline, err := s.connections(ctx)
	if err != nil {
		return nil, err
	}
	var out []Storm
	for _, n := range cfg.Storm {
		ps := ps[:n]
		// The first storm of a size meets a process that has never held so many connections
		// (its heap, its goroutine stacks, the servers' client buffers grow under it) and fared
		// worse than the same storm after it, whichever came first: an unmeasured storm of
		// direct connects goes first.
		fmt.Fprintf(progress, "bench: storm of %d with direct JWTs to warm up\n", n)
		if _, err := storm(ctx, t.NATSURL, ps, jwtOptions(ps), nil); err != nil {
			return out, err
		}
		if err := s.settle(ctx, baseline); err != nil {
			return out, err
		}
		var runs []Storm
		for _, via := range []string{ViaCeiling, ViaCallout, ViaJWT} {
			opts := func(i int) []nats.Option {
				p := ps[i]
				switch via {
				case ViaCeiling:
					return []nats.Option{nats.UserJWTAndSeed(ceiling.sentinelJWT, ceiling.sentinelSeed), nats.Token(p.bearer)}
				case ViaCallout:
					return []nats.Option{nats.UserJWTAndSeed(sentinelJWT, sentinelSeed), nats.Token(p.bearer)}
				default:
					return jwtOptions(ps)(i)
				}
			}
			var before map[string]int
			if via == ViaCallout {
				if before, err = calloutAnswers(ctx, t.HTTPURL); err != nil {
					return out, err
				}
			}
			fmt.Fprintf(progress, "bench: storm of %d via %s\n", n, via)
			var prof io.Writer
			if via == ViaCallout && n == most {
				prof = cfg.StormProfile
			}
			run, err := storm(ctx, t.NATSURL, ps, opts, prof)
			if err != nil {
				return out, err
			}
			run.Via = via
			if via == ViaCallout {
				after, err := calloutAnswers(ctx, t.HTTPURL)
				if err != nil {
					return out, err
				}
				run.Answers = map[string]int{}
				for code, v := range after {
					if d := v - before[code]; d > 0 {
						run.Answers[code] = d
					}
				}
			}
			if err := s.settle(ctx, baseline); err != nil {
				return out, err
			}
			fmt.Fprintf(progress, "bench: storm of %d via %s: all connected in %.2f s (%d of %d), %.0f connects/s, p50 %.0f ms, p99 %.0f ms, %d failed attempts of %d %v\n",
				n, via, run.AllS, run.Connected, n, run.ConnectsPerS, run.P50, run.P99, run.FailedAttempts, run.Attempts, run.Errors)
			if via == ViaCeiling {
				fmt.Fprintf(progress, "bench: the ceiling dropped %d requests for their age and failed %d\n", ceiling.stale.Load(), ceiling.failed.Load())
			}
			runs = append(runs, run)
		}
		if runs[0].ConnectsPerS > 0 {
			runs[1].RatioToCeiling = runs[1].ConnectsPerS / runs[0].ConnectsPerS
		}
		out = append(out, runs...)
	}
	return out, nil
}

// stormPrincipal is one connection of a storm: its own principal `<owner>.storm`, granted
// `supervise`, with a bearer for the callouts and a user JWT of its own for the direct connects.
type stormPrincipal struct {
	owner  string
	bearer string
	jwt    string
	seed   string
}

// stormPrincipals grants n fresh principals and issues each a bearer (with the plane's key
// set, as /exchange would) and a caller user JWT (as `authplane creds` would).
func stormPrincipals(ctx context.Context, t Target, s *side, n int) ([]stormPrincipal, error) {
	actors, err := s.bucket(ctx, subjects.ActorsBucket(t.Keys.Space))
	if err != nil {
		return nil, err
	}
	keysKV, err := s.bucket(ctx, subjects.KeysBucket(t.Keys.Space))
	if err != nil {
		return nil, err
	}
	bearers := bearer.New(keysKV, time.Now)
	scope := []string{manager.Supervise}
	ps := make([]stormPrincipal, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for i := range ps {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			p := stormPrincipal{owner: newOwner()}
			rctx, cancel := context.WithTimeout(ctx, requestTimeout)
			defer cancel()
			if _, err := manager.SetScope(rctx, actors, p.owner, stormActor, scope, time.Now()); err != nil {
				errs[i] = fmt.Errorf("grant %s.%s: %w", p.owner, stormActor, err)
				return
			}
			var err error
			if p.bearer, _, err = bearers.Issue(rctx, t.Keys.Space, bearer.Claims{Owner: p.owner, Actor: stormActor, Scope: scope, View: bearer.ViewCaller}, bearer.MaxTTL); err != nil {
				errs[i] = fmt.Errorf("a bearer for %s.%s: %w", p.owner, stormActor, err)
				return
			}
			p.jwt, p.seed, errs[i] = callerCreds(t, p.owner, stormActor)
			ps[i] = p
		})
	}
	wg.Wait()
	return ps, errors.Join(errs...)
}

// jwtOptions connects principal i of ps with its own user JWT.
func jwtOptions(ps []stormPrincipal) func(i int) []nats.Option {
	return func(i int) []nats.Option { return []nats.Option{nats.UserJWTAndSeed(ps[i].jwt, ps[i].seed)} }
}

// storm connects every principal of ps at once, each with opts(i) and its own inbox prefix,
// retrying each as nats.go reconnects, until all are connected or stormTimeout passes, then
// closes them. prof, when set, receives a CPU profile of the storm.
func storm(ctx context.Context, url string, ps []stormPrincipal, opts func(i int) []nats.Option, prof io.Writer) (Storm, error) {
	run := Storm{N: len(ps)}
	type result struct {
		at       time.Duration
		attempts int
		failed   int
		errs     map[string]int
		nc       *nats.Conn
	}
	results := make([]result, len(ps))
	sctx, cancel := context.WithTimeout(ctx, stormTimeout)
	defer cancel()
	start := make(chan struct{})
	var wg sync.WaitGroup
	var began time.Time
	for i := range ps {
		wg.Go(func() {
			o := append(opts(i), nats.CustomInboxPrefix(subjects.InboxPrefix(ps[i].owner, stormActor)),
				nats.MaxReconnects(0), nats.Timeout(5*time.Second), nats.Name("authplane bench storm"))
			r := &results[i]
			<-start
			for sctx.Err() == nil {
				r.attempts++
				nc, err := nats.Connect(url, o...)
				if err == nil {
					r.at, r.nc = time.Since(began), nc
					return
				}
				r.failed++
				if r.errs == nil {
					r.errs = map[string]int{}
				}
				r.errs[errorKind(err)]++
				wait := nats.DefaultReconnectWait + rand.N(nats.DefaultReconnectJitter)
				select {
				case <-sctx.Done():
				case <-time.After(wait):
				}
			}
		})
	}
	stop, err := startProfile(prof)
	if err != nil {
		return run, err
	}
	cpu := cpuTime()
	began = time.Now()
	close(start)
	wg.Wait()
	used := cpuTime() - cpu
	stop()

	var at []time.Duration
	for _, r := range results {
		run.Attempts += r.attempts
		run.FailedAttempts += r.failed
		for k, v := range r.errs {
			if run.Errors == nil {
				run.Errors = map[string]int{}
			}
			run.Errors[k] += v
		}
		if r.nc != nil {
			at = append(at, r.at)
			r.nc.Close()
		}
	}
	slices.Sort(at)
	run.Connected = len(at)
	run.P50, run.P99 = ms(percentile(at, 50)), ms(percentile(at, 99))
	if run.Connected > 0 {
		run.CPUPerConnect = float64(used.Microseconds()) / float64(run.Connected)
	}
	switch {
	case run.Connected == run.N && run.N > 0:
		run.AllS = at[len(at)-1].Seconds()
		run.ConnectsPerS = float64(run.N) / run.AllS
	default:
		run.ConnectsPerS = float64(run.Connected) / stormTimeout.Seconds()
	}
	return run, ctx.Err()
}

// errorKind names what a failed connect saw, in a few words.
func errorKind(err error) string {
	switch {
	case errors.Is(err, nats.ErrAuthorization):
		return "authorization violation"
	case errors.Is(err, nats.ErrAuthExpired), errors.Is(err, nats.ErrAuthRevoked):
		return "authorization expired"
	case errors.Is(err, nats.ErrTimeout), errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		return "timeout"
	case errors.Is(err, nats.ErrNoServers):
		return "no servers available"
	}
	msg := strings.ToLower(err.Error())
	for _, kind := range []string{"authorization violation", "authentication timeout", "timeout", "connection refused", "connection reset",
		"broken pipe", "eof", "maximum connections", "expected 'pong'"} {
		if strings.Contains(msg, kind) {
			return kind
		}
	}
	// The last part of a socket error says what happened; the first names the addresses.
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		msg = msg[i+2:]
	}
	if len(msg) > 48 {
		msg = msg[:48]
	}
	return msg
}

// calloutAnswers reads the plane's count of callout answers by code from its metrics.
func calloutAnswers(ctx context.Context, httpURL string) (map[string]int, error) {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, httpURL+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("the plane's metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("the plane's metrics: %s", resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("the plane's metrics: %w", err)
	}
	out := map[string]int{}
	if f := families["authplane_requests_total"]; f != nil {
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["endpoint"] == "auth-callout" {
				out[labels["code"]] += int(m.GetCounter().GetValue())
			}
		}
	}
	return out, nil
}
