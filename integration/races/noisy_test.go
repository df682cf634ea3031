package races

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	dto "github.com/prometheus/client_model/go"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/handlers"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/core/audit"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// The noisy-neighbour test: one owner runs every flood a tenant can aim at another, at once and
// at full rate, against one plane with both faces, while another owner goes about its work.

// noisyFlood is how long the noisy owner floods at least; past it, the flood goes on until
// each of its budgets has refused something, at most until noisyFloodMax (a loaded machine
// under the race detector serves fewer of its requests a second). noisyFloodMax keeps the
// victim within its owner's 64 instances and its 60 full exchanged records a minute.
const (
	noisyFlood    = 20 * time.Second
	noisyFloodMax = 28 * time.Second
)

// victimDeadline is the deadline of each of the victim's requests, as a client sets one. A
// victim request is sent once: no retry. Every refusal the floods could cause it says "retry"
// (busy, too many, unavailable), so a client that retried them would hide exactly what the
// budgets are for. The one wait within a deadline is for a run-start to reach the victim's
// witness (polled) before its admission is asked: its manager, which receives the run-start
// as the witness does, asks then.
const victimDeadline = 10 * time.Second

// victimEvery paces the victim's rounds: a client at work, not a flood. At most
// noisyFlood/victimEvery rounds prepare a fresh instance each, within the owner's 64.
const victimEvery = 500 * time.Millisecond

// A peer address of the noisy owner for its slow bodies, another for its exchanges, and the
// victim's (the system's choice: 127.0.0.1). Every 127/8 address is the loopback interface's.
var (
	slowPeer     = net.IPv4(127, 0, 0, 2)
	exchangePeer = net.IPv4(127, 0, 0, 3)
)

// For noisyFlood, owner B (the noisy owner) runs every flood at once, each from one
// goroutine at full rate, the next request as soon as the last is answered (so each is as fast
// as one client can go, and the test takes a fixed share of the machine from the rest of the
// suite, about a core under -race): 1 MiB run-starts on its own subjects; exchanges of its
// agent's secret, every other one refused; re-registrations of one instance with fresh keys;
// connections of a JWT credential and of its agent's bearer, as many as the broker lets in
// (at the hog's 200 connects a second); slow bodies from one peer address, holding every
// public slot it can.
// Meanwhile owner A (the victim) prepares a fresh instance, renews, has a run-start it
// published admitted, exchanges its agent's secret and connects with the bearer, and revokes
// the run, every round, each request once within its deadline: every one succeeds. Its audit,
// witness and minted records written before the flood are there after it, and its run-start
// witnessed before the flood is admitted after it. Each flood ran into its budget: the
// plane's metrics count what each refused.
//
// Without a budget the victim fails: one witness stream for every owner and its admissions
// are "not witnessed"; no per-peer HTTP cap and its exchanges are 503 busy; no per-principal
// connection cap and its connections are refused.
func TestANoisyOwnersFloodsLeaveAnotherOwnerWorkingAndItsRecordsKept(t *testing.T) {
	harness.Long(t, "a race's volume")
	t.Parallel()
	f := harness.StartFaces(t, func(c *service.Config) {
		// The connection test's account: small enough for one credential to fill it.
		c.MaxConnections, c.ReservedConnections, c.MaxConnectionsPerPrincipal = 40, 4, 4
		// The least audit stream a start takes, and a minted stream that re-registrations at
		// one client's full rate (164 a second, about 1 KiB of minted records each) would fill
		// within the flood were they not budgeted; the budgeted floods write tens of KiB.
		c.AuditBytes, c.MintedBytes = 1<<20, 4<<20
		c.Hooks = &service.Hooks{WitnessSampleEvery: time.Second}
	})
	p := f.TestPlane
	b := harness.FetchBundle(t, p.PublicURL())
	sentinel := filepath.Join(t.TempDir(), "sentinel.creds")
	if err := os.WriteFile(sentinel, []byte(b.SentinelCreds), 0o600); err != nil {
		t.Fatal(err)
	}

	// The victim, owner A: a registered manager, a caller that starts runs, an agent, and a
	// second instance it leaves alone.
	env := harness.NewRunEnv(t, p)
	kept := harness.NewManagerKeys(t)
	harness.Registered(t, env.Cli.Conn(), harness.OwnerA, "cli", kept)
	victimSecret, _, err := admin.SetAgent(harness.GrantCtx(t), p.Keys(), p.NATSURL(), harness.OwnerA, "agent")
	if err != nil {
		t.Fatal(err)
	}
	victimAgent := map[string]any{"owner": harness.OwnerA, "actor": "agent", "actorToken": victimSecret}

	// Its records before the flood: an exchange, an admitted and revoked run, a refusal, and a
	// run-start witnessed and not yet admitted.
	harness.Exchange(t, p.PublicURL(), victimAgent)
	if _, err := env.Revoke(env.Cli, env.Admitted(), "before the flood"); err != nil {
		t.Fatal(err)
	}
	_, err = env.Cli.Admit(env.Ctx(), env.M.Manager, env.Cur, client.NewRunID(), "cotal."+harness.TestSpace+".ep.v1.one.manager.run-start.never")
	if client.CodeOf(err) == "" {
		t.Fatalf("admitting a run-start never published: got %v, want a refusal", err)
	}
	early := env.RunStart(subjects.RouteOne, "")
	before := victimRecords(t, p, kept, early)

	// The noisy owner, B: a registered manager (so its run-starts are witnessed, in its own
	// stream), an agent, and three callers.
	noisyFrom := time.Now() // before the noisy owner's first record
	harness.Grant(t, p, harness.OwnerB, "cli", "supervise")
	noisyCli := harness.CallerConn(t, p, harness.OwnerB, "cli")
	nm := harness.NewManagerKeys(t)
	harness.Registered(t, noisyCli, harness.OwnerB, "cli", nm)
	noisySecret, _, err := admin.SetAgent(harness.GrantCtx(t), p.Keys(), p.NATSURL(), harness.OwnerB, "agent")
	if err != nil {
		t.Fatal(err)
	}
	noisyAgent := map[string]any{"owner": harness.OwnerB, "actor": "agent", "actorToken": noisySecret}
	noisyBearer := harness.Exchange(t, p.PublicURL(), noisyAgent).Token
	publisher := harness.CallerConn(t, p, harness.OwnerB, "flood")

	ctx, cancel := context.WithTimeout(context.Background(), noisyFloodMax)
	defer cancel()
	floodFrom := time.Now()
	var floods sync.WaitGroup
	t.Cleanup(func() { cancel(); floods.Wait() })
	var (
		runStarts  = floodRunStarts(ctx, &floods, publisher, nm.Uid)
		exchanges  = floodExchanges(ctx, &floods, p.PublicURL(), noisyAgent)
		reregs     = floodReregistrations(ctx, &floods, noisyCli, nm)
		slowBodies = floodSlowBodies(ctx, &floods, strings.TrimPrefix(p.PublicURL(), "http://"))
		jwtHog     = harness.StartHogWith(t, p.NATSURL(), 40, nats.UserCredentials(harness.WriteCallerCreds(t, p.Keys(), harness.OwnerB, "hog")))
		bearerHog  = harness.StartHogWith(t, p.NATSURL(), 40, nats.UserCredentials(sentinel), nats.Token(noisyBearer))
	)

	// The victim's rounds, in this goroutine, for as long as the flood lasts.
	v := &victim{t: t, env: env, url: p.PublicURL(), server: b.Server, sentinel: sentinel, agent: victimAgent,
		http: &http.Client{Timeout: victimDeadline}, stats: map[string]*victimStat{}}
	tick := time.NewTicker(victimEvery)
	defer tick.Stop()
	for ctx.Err() == nil {
		v.rounds++
		v.round(v.rounds)
		if time.Since(floodFrom) >= noisyFlood && len(unmet(noisyBudgets(harness.Scrape(t, p.HTTPURL())))) == 0 {
			cancel()
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
	floods.Wait()
	flooded := time.Since(floodFrom)
	jwtHog.End()
	bearerHog.End()

	// The victim's records from before the flood are all there, and its early run-start is
	// admitted now.
	after := victimRecords(t, p, kept, early)
	for what, seq := range before {
		if after[what] != seq {
			t.Errorf("the victim's %s after the flood: got sequence %d, want it still at %d", what, after[what], seq)
		}
	}
	if _, err := env.Cli.Admit(env.Ctx(), env.M.Manager, env.Cur, client.NewRunID(), early); err != nil {
		t.Errorf("admitting the victim's run-start witnessed before the flood: %v, want it admitted", err)
	}
	// The noisy instance was registered again no more often than its budget of an hour allows.
	if n := reregs["ok"]; n > service.Defaults().ReregistrationsPerInstance {
		t.Errorf("the noisy instance was registered again %d times in %s, want at most %d (--reregistrations-per-instance, an hour)", n, noisyFlood, service.Defaults().ReregistrationsPerInstance)
	}
	// The noisy owner's full records of each decision kept within its budget of each minute
	// (a window opens at an owner's first record of the decision, and lasts a minute).
	windows := int(time.Since(noisyFrom)/time.Minute) + 1
	for _, d := range []string{audit.Exchanged, audit.Refused} {
		if n := auditRecords(t, p, d, harness.OwnerB); n > windows*audit.DefaultPerMinute {
			t.Errorf("the noisy owner's full %s records: got %d, want at most %d a minute (%d in %d windows)", d, n, audit.DefaultPerMinute, windows*audit.DefaultPerMinute, windows)
		}
	}
	for name, nc := range map[string]*nats.Conn{"cli": env.Cli.Conn(), "starter": env.Starter} {
		if !nc.IsConnected() {
			t.Errorf("the victim's %s connection from before the flood: got %s, want it connected", name, nc.Status())
		}
	}

	// What each flood achieved, and each ran into its budget.
	m := harness.Scrape(t, p.HTTPURL())
	refusedBy := func(name string, labels map[string]string) float64 { return harness.Sample(m, name, labels) }
	budgets := noisyBudgets(m)
	for _, bc := range unmet(budgets) {
		t.Errorf("%s: got %v in %s, want at least 1 (the flood ran into its budget)", bc.what, bc.n, flooded.Round(time.Millisecond))
	}
	var lines []string
	for _, bc := range budgets {
		lines = append(lines, fmt.Sprintf("  %s: %v", bc.what, bc.n))
	}
	lines = append(lines,
		fmt.Sprintf("  the public face's whole cap: %v; the tenants' connection budget: %v (callout), %v (kick); re-registrations past the owner's: %v, new keys past the owner's: %v",
			refusedBy("authplane_http_refused_total", map[string]string{"face": "public", "budget": "inflight"}),
			refusedBy("authplane_connections_refused_total", map[string]string{"budget": "tenants", "by": "callout"}),
			refusedBy("authplane_connections_refused_total", map[string]string{"budget": "tenants", "by": "kick"}),
			refusedBy("authplane_tenant_budget_refused_total", map[string]string{"budget": "reregistrations_owner"}),
			refusedBy("authplane_tenant_budget_refused_total", map[string]string{"budget": "new_keys_owner"})),
		fmt.Sprintf("  the floods sent: %d run-starts (%d MiB); exchanges %s; re-registrations %s; slow bodies %s; connections: JWT %d opened, %d refused, bearer %d opened, %d refused",
			runStarts.n, runStarts.bytes>>20, exchanges, reregs, slowBodies,
			jwtHog.Opened.Load(), jwtHog.Refused.Load(), bearerHog.Opened.Load(), bearerHog.Refused.Load()),
		fmt.Sprintf("  streams after: audit %s, minted %s, the noisy owner's witness %s",
			streamUse(t, p, subjects.AuditStream(harness.TestSpace)), streamUse(t, p, subjects.MintedStream(harness.TestSpace)), streamUse(t, p, harness.WitnessStream(harness.OwnerB))),
		"  the victim, "+v.String())
	harness.Report(t, "for %s one owner flooded every budget and another did %d rounds:\n%s", flooded.Round(time.Millisecond), v.rounds, strings.Join(lines, "\n"))
}

// budgetCount is what one of the noisy owner's budgets refused, as the plane's metrics count it.
type budgetCount struct {
	what string
	n    float64
}

// noisyBudgets reads from the metrics m what each budget the noisy owner's floods run into
// refused.
func noisyBudgets(m map[string]*dto.MetricFamily) []budgetCount {
	refusedBy := func(name string, labels map[string]string) float64 { return harness.Sample(m, name, labels) }
	return []budgetCount{
		{"witness run-starts pushed out (the noisy owner's own)", refusedBy("authplane_witness_evicted_total", nil)},
		{"exchanged records summarized", refusedBy("authplane_audit_summarized_total", map[string]string{"decision": "exchanged"})},
		{"refused records summarized", refusedBy("authplane_audit_summarized_total", map[string]string{"decision": "refused"})},
		{"re-registrations past the instance's budget", refusedBy("authplane_tenant_budget_refused_total", map[string]string{"budget": "reregistrations_instance"})},
		{"connections past the principal's cap, kicked", refusedBy("authplane_connections_refused_total", map[string]string{"budget": "principal", "by": "kick"})},
		{"connections past the principal's cap, refused by the callout", refusedBy("authplane_connections_refused_total", map[string]string{"budget": "principal", "by": "callout"})},
		{"public requests past the peer's in-flight cap", refusedBy("authplane_http_refused_total", map[string]string{"face": "public", "budget": "peer_inflight"})},
		{"public bodies not in within the body timeout", refusedBy("authplane_http_refused_total", map[string]string{"face": "public", "budget": "body_timeout"})},
	}
}

// unmet returns the budgets of bs that refused nothing yet.
func unmet(bs []budgetCount) []budgetCount {
	var out []budgetCount
	for _, b := range bs {
		if b.n < 1 {
			out = append(out, b)
		}
	}
	return out
}

// victimRecords names and locates what the victim wrote that a flood could push out: every
// audit record of owner A (its subject and sequence), the minted records of kept's keys,
// and the witnessed run-start early.
func victimRecords(t *testing.T, p *harness.TestPlane, kept *harness.ManagerKeys, early string) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	st, err := p.JS(t).Stream(t.Context(), subjects.AuditStream(harness.TestSpace))
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(t.Context(), jetstream.WithSubjectFilter(subjects.AuditSubject(harness.TestSpace, "*", harness.OwnerA, "*")))
	if err != nil {
		t.Fatal(err)
	}
	for subject := range info.State.Subjects {
		// Each audit subject's first record: what the flood would push out first.
		m, err := st.GetMsg(t.Context(), 1, jetstream.WithGetMsgSubject(subject))
		if err != nil {
			t.Fatalf("the audit record on %s: %v", subject, err)
		}
		out["audit record "+subject] = m.Sequence
	}
	for _, d := range []string{audit.Exchanged, audit.Admitted, audit.Revoked, audit.Refused} {
		if !slices.ContainsFunc(slices.Collect(maps.Keys(out)), func(k string) bool {
			return strings.HasPrefix(k, "audit record "+subjects.AuditSubject(harness.TestSpace, d, harness.OwnerA, ""))
		}) {
			t.Fatalf("the victim's audit records: got %v, want one of each decision: exchanged, admitted, revoked, refused", slices.Sorted(maps.Keys(out)))
		}
	}
	for subject := range harness.MintedRecords(t, p, kept.Iid) {
		if m, err := harness.LastMsg(t, p, subjects.MintedStream(harness.TestSpace), subject); err == nil {
			out["minted record "+subject] = m.Sequence
		}
	}
	if got, want := harness.MintedKeys(t, p, kept.Iid), harness.IdentityKeys(t, kept); !slices.Equal(got, want) {
		t.Fatalf("the minted records of the victim's kept instance: got keys %v, want its %d keys %v", got, len(want), want)
	}
	if m, err := harness.LastMsg(t, p, harness.WitnessStream(harness.OwnerA), early); err == nil {
		out["witnessed run-start "+early] = m.Sequence
	}
	return out
}

// auditRecords counts owner's full records of decision, every actor's.
func auditRecords(t *testing.T, p *harness.TestPlane, decision, owner string) int {
	t.Helper()
	st, err := p.JS(t).Stream(t.Context(), subjects.AuditStream(harness.TestSpace))
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(t.Context(), jetstream.WithSubjectFilter(subjects.AuditSubject(harness.TestSpace, decision, owner, "*")))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range info.State.Subjects {
		n += int(c)
	}
	return n
}

// streamUse is a stream's messages and bytes, and its byte bound.
func streamUse(t *testing.T, p *harness.TestPlane, name string) string {
	t.Helper()
	info, err := harness.StreamInfo(t, p, name)
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("%d records in %d KiB of %d KiB", info.State.Msgs, info.State.Bytes>>10, info.Config.MaxBytes>>10)
}

// victim is owner A at work through the flood: what it asked, and how that went.
type victim struct {
	t        *testing.T
	env      *harness.RunEnv
	url      string // the public face
	server   string
	sentinel string
	agent    map[string]any
	http     *http.Client
	rounds   int
	stats    map[string]*victimStat
}

// victimStat counts one of the victim's requests.
type victimStat struct {
	attempts, failures int
	slowest            time.Duration
}

// do makes the victim's request what once, within victimDeadline, and reports whether it
// succeeded; a failure fails the test, naming the round.
func (v *victim) do(round int, what string, fn func(ctx context.Context) error) bool {
	v.t.Helper()
	s := v.stats[what]
	if s == nil {
		s = &victimStat{}
		v.stats[what] = s
	}
	ctx, cancel := context.WithTimeout(context.Background(), victimDeadline)
	defer cancel()
	start := time.Now()
	err := fn(ctx)
	s.attempts++
	s.slowest = max(s.slowest, time.Since(start))
	if err != nil {
		s.failures++
		v.t.Errorf("the victim's %s, round %d: %v", what, round, err)
		return false
	}
	return true
}

// round is one round of the victim's work: prepare a fresh instance, renew, publish a
// run-start and have it admitted, exchange the agent's secret and connect with the bearer,
// revoke the run.
func (v *victim) round(n int) {
	env := v.env
	v.do(n, "prepare", func(ctx context.Context) error {
		m, _, err := client.NewManager()
		if err != nil {
			return err
		}
		_, err = env.Cli.Prepare(ctx, m)
		return err
	})
	v.do(n, "renew", func(ctx context.Context) error {
		mat, err := env.Cli.Renew(ctx, env.M.Manager, env.Cur)
		if err == nil && len(mat.Credentials) != 2 {
			err = fmt.Errorf("got %d credentials, want 2", len(mat.Credentials))
		}
		return err
	})
	runID := client.NewRunID()
	admitted := v.do(n, "run admission", func(ctx context.Context) error {
		subject, err := v.runStart(ctx)
		if err != nil {
			return err
		}
		_, err = env.Cli.Admit(ctx, env.M.Manager, env.Cur, runID, subject)
		return err
	})
	var token string
	if v.do(n, "exchange", func(ctx context.Context) error {
		var err error
		token, err = v.exchange(ctx)
		return err
	}) {
		v.do(n, "bearer connection", func(ctx context.Context) error {
			dl, _ := ctx.Deadline()
			nc, err := nats.Connect(v.server, nats.UserCredentials(v.sentinel), nats.Token(token),
				nats.CustomInboxPrefix(subjects.InboxPrefix(harness.OwnerA, "agent")), nats.NoReconnect(), nats.Timeout(time.Until(dl)))
			if err != nil {
				return err
			}
			defer nc.Close()
			return nc.FlushWithContext(ctx)
		})
	}
	if admitted {
		v.do(n, "run revoke", func(ctx context.Context) error {
			_, err := env.Cli.Revoke(ctx, env.M.Manager, env.Cur, runID, "round done")
			return err
		})
	}
}

// runStart publishes a run-start of ownerA.starter and returns its subject once the victim's
// witness holds it: a manager asks to admit a run-start it received, which the witness took
// as the manager did.
func (v *victim) runStart(ctx context.Context) (string, error) {
	nonce := make([]byte, 12)
	if _, err := rand.Read(nonce); err != nil {
		return "", err
	}
	subject := subjects.RunStart{Space: harness.TestSpace, Route: subjects.RouteOne, Owner: harness.OwnerA, Actor: "starter",
		UID: v.env.M.Uid, Generation: "1", Nonce: hex.EncodeToString(nonce)}.Subject()
	if err := v.env.Starter.Publish(subject, []byte(`{}`)); err != nil {
		return "", err
	}
	if err := v.env.Starter.FlushWithContext(ctx); err != nil {
		return "", err
	}
	st, err := v.env.P.JS(v.t).Stream(ctx, harness.WitnessStream(harness.OwnerA))
	if err != nil {
		return "", err
	}
	for {
		_, err := st.GetLastMsgForSubject(ctx, subject)
		if err == nil {
			return subject, nil
		}
		if !errors.Is(err, jetstream.ErrMsgNotFound) {
			return "", fmt.Errorf("the run-start in the witness: %w", err)
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("the run-start is not in the witness: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// exchange exchanges the victim's agent secret on the public face for a bearer.
func (v *victim) exchange(ctx context.Context) (string, error) {
	status, body, err := postJSON(ctx, v.http, v.url+"/exchange", v.agent)
	if err != nil {
		return "", err
	}
	var e harness.Exchanged
	if status != http.StatusOK || json.Unmarshal(body, &e) != nil || e.Token == "" {
		return "", fmt.Errorf("got %d %s, want 200 and a bearer", status, bytes.TrimSpace(body))
	}
	return e.Token, nil
}

func (v *victim) String() string {
	var parts []string
	for _, name := range slices.Sorted(maps.Keys(v.stats)) {
		s := v.stats[name]
		parts = append(parts, fmt.Sprintf("%s %d/%d failed (slowest %s)", name, s.failures, s.attempts, s.slowest.Round(time.Millisecond)))
	}
	return strings.Join(parts, ", ")
}

// postJSON posts body as JSON to url with cl and returns the answer's status and body.
func postJSON(ctx context.Context, cl *http.Client, url string, body any) (int, []byte, error) {
	data, err := json.Marshal(body)
	if err != nil {
		return 0, nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(data))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := cl.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	return resp.StatusCode, raw, err
}

// outcomes counts a flood's answers by name: written by the flood's one goroutine, read once
// the flood is over.
type outcomes map[string]int

func (o outcomes) String() string {
	var parts []string
	for _, name := range slices.Sorted(maps.Keys(o)) {
		parts = append(parts, fmt.Sprintf("%s %d", name, o[name]))
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// sentRunStarts is what the run-start flood sent.
type sentRunStarts struct{ n, bytes int }

// floodRunStarts publishes, until ctx ends, run-starts of 1 MiB (all but the room for the
// subject) of ownerB.flood for the noisy manager's lifecycle uid, each flushed before the next.
func floodRunStarts(ctx context.Context, wg *sync.WaitGroup, nc *nats.Conn, uid string) *sentRunStarts {
	sent := &sentRunStarts{}
	payload := make([]byte, 1<<20-4<<10)
	wg.Go(func() {
		for ctx.Err() == nil {
			nonce := make([]byte, 12)
			if _, err := rand.Read(nonce); err != nil {
				return
			}
			s := subjects.RunStart{Space: harness.TestSpace, Route: subjects.RouteOne, Owner: harness.OwnerB, Actor: "flood", UID: uid,
				Generation: "1", Nonce: hex.EncodeToString(nonce)}.Subject()
			if nc.Publish(s, payload) != nil || nc.FlushWithContext(ctx) != nil {
				return
			}
			sent.n++
			sent.bytes += len(payload)
		}
	})
	return sent
}

// floodExchanges exchanges the noisy agent's secret on the public face from exchangePeer until
// ctx ends, every other time with a ttlSec that is refused (charged to the agent: its secret
// matched), and counts the answers by status.
func floodExchanges(ctx context.Context, wg *sync.WaitGroup, url string, agent map[string]any) outcomes {
	got := outcomes{}
	refused := map[string]any{"ttlSec": 0}
	for k, v := range agent {
		refused[k] = v
	}
	tr := &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: exchangePeer}}).DialContext}
	cl := &http.Client{Transport: tr, Timeout: handlers.PublicDeadline + 5*time.Second}
	wg.Go(func() {
		defer tr.CloseIdleConnections()
		for i := 0; ctx.Err() == nil; i++ {
			body := agent
			if i%2 == 1 {
				body = refused
			}
			status, _, err := postJSON(ctx, cl, url+"/exchange", body)
			if err != nil {
				if ctx.Err() == nil {
					got["error"]++
				}
				continue
			}
			got[fmt.Sprint(status)]++
		}
	})
	return got
}

// floodReregistrations re-registers the noisy manager's instance with fresh keys as ownerB.cli
// until ctx ends, and counts the answers by refusal code ("ok" when issued).
func floodReregistrations(ctx context.Context, wg *sync.WaitGroup, nc *nats.Conn, nm *harness.ManagerKeys) outcomes {
	got := outcomes{}
	wg.Go(func() {
		c, err := harness.PrincipalClient(nc, harness.OwnerB, "cli")
		if err != nil {
			got[err.Error()]++
			return
		}
		for ctx.Err() == nil {
			m, _, err := client.NewManager()
			if err != nil {
				got[err.Error()]++
				return
			}
			m.InstanceID, m.LifecycleUID = nm.Iid, nm.Uid
			_, err = c.Prepare(ctx, m)
			switch code := client.CodeOf(err); {
			case err == nil:
				got["ok"]++
			case code != "":
				got[code]++
			case ctx.Err() == nil:
				got["transport"]++
			}
		}
	})
	return got
}

// floodSlowBodies holds public slots from slowPeer until ctx ends: it opens door requests whose
// body never comes, one after another, and keeps each the door reads until the door has cut it
// (past the body timeout); it counts the answers' first lines.
func floodSlowBodies(ctx context.Context, wg *sync.WaitGroup, addr string) outcomes {
	got := outcomes{}
	wg.Go(func() {
		type held struct {
			c  net.Conn
			at time.Time
		}
		var holding []held
		defer func() {
			for _, h := range holding {
				h.c.Close()
			}
		}()
		for ctx.Err() == nil {
			for len(holding) > 0 && time.Since(holding[0].at) > handlers.DefaultBodyTimeout+time.Second {
				holding[0].c.Close()
				holding = holding[1:]
			}
			c, line, err := holdSlot(addr, slowPeer)
			switch {
			case err != nil:
				got["error"]++
			case strings.HasPrefix(line, "HTTP/1.1 100"):
				got["held"]++
				holding = append(holding, held{c, time.Now()})
			default:
				got[line]++
				closeAtOnce(c)
			}
		}
	})
	return got
}

// holdSlot sends a public door request's headers from address from, and the first byte of a
// body of 1,000 once the door reads it; it returns the connection and the answer's first line
// ("HTTP/1.1 100 Continue" when the door is reading the body).
func holdSlot(addr string, from net.IP) (net.Conn, string, error) {
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: from}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, "", err
	}
	fail := func(err error) (net.Conn, string, error) { closeAtOnce(c); return nil, "", err }
	if _, err := io.WriteString(c, "POST /exchange HTTP/1.1\r\nHost: mesh\r\nContent-Type: application/json\r\nContent-Length: 1000\r\nExpect: 100-continue\r\n\r\n"); err != nil {
		return fail(err)
	}
	if err := c.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		return fail(err)
	}
	rd := bufio.NewReader(c)
	line, err := rd.ReadString('\n')
	if err != nil {
		return fail(err)
	}
	if strings.HasPrefix(line, "HTTP/1.1 100") {
		if _, err := rd.ReadString('\n'); err != nil {
			return fail(err)
		}
		if _, err := io.WriteString(c, "{"); err != nil {
			return fail(err)
		}
	}
	return c, strings.TrimSpace(line), nil
}

// closeAtOnce closes c with a reset, leaving no TIME_WAIT behind: the flood opens thousands.
func closeAtOnce(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		if err := tc.SetLinger(0); err != nil {
			c.Close() // a plain close, then
			return
		}
	}
	c.Close()
}
