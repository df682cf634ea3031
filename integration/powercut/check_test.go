package powercut

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/capability/manager"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/internal/platform/broker"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/subjects"
)

// loss is one thing a cut took back: an acknowledged write the restart does not show, or a
// credential or request the broker or the plane let through because of it.
type loss struct {
	kind string
	what string
}

func (l loss) String() string { return l.kind + ": " + l.what }

// checker looks, after a restart, for everything a acknowledged.
type checker struct {
	t      *testing.T
	tg     target
	a      *acks
	js     jetstream.JetStream // a plane-account user's
	sys    *nats.Conn          // a system-account user's
	losses []loss
	// stored is every bucket's newest entry ("<bucket> <key>") and every minted record, as
	// read from the streams.
	stored map[string]jetstream.Msg
}

func (c *checker) lost(kind, format string, args ...any) {
	c.losses = append(c.losses, loss{kind, fmt.Sprintf(format, args...)})
}

// check runs every check after a restart and returns what was lost.
func check(t *testing.T, tg target, a *acks) []loss {
	t.Helper()
	p := harness.BinaryPlane(t, admin.ServiceInfo{NATSURL: tg.url, SpaceDir: tg.spaceDir, URL: tg.http})
	nc, js := harness.PlaneConn(t, tg.keys, tg.url)
	defer nc.Close()
	sys := harness.SystemConn(t, p)
	defer sys.Close()
	c := &checker{t: t, tg: tg, a: a, js: js, sys: sys}
	c.read()
	a.mu.Lock()
	c.credentials()
	c.epochs()
	c.runs()
	c.assignments()
	c.scopes()
	c.agents()
	a.mu.Unlock()
	c.finishEnds()
	c.endedRefused()
	c.staleRefused()
	c.revokedRunsRefused()
	c.revokedAgentsRefused()
	return c.losses
}

// read reads the newest entry of every key of the buckets the checks need, and every minted
// record, through ordered consumers of a plane-account user; a whole pass again while one
// fails (a cluster back from a cut may not place a consumer yet).
func (c *checker) read() {
	c.t.Helper()
	streams := map[string]string{subjects.MintedStream(harness.TestSpace): ""}
	for _, b := range []string{subjects.AuthBucket(harness.TestSpace), subjects.AdmissionBucket(harness.TestSpace),
		subjects.PlatformBucket(harness.TestSpace), subjects.ActorsBucket(harness.TestSpace)} {
		streams["KV_"+b] = b
	}
	testkit.CheckFor(c.t, retryWithin, 100*time.Millisecond, func() error {
		c.stored = map[string]jetstream.Msg{}
		for stream, bucket := range streams {
			msgs, err := readStream(c.js, stream)
			if err != nil {
				return err
			}
			for _, m := range msgs {
				if bucket == "" {
					c.stored[m.Subject()] = m
				} else {
					c.stored[bucket+" "+strings.TrimPrefix(m.Subject(), "$KV."+bucket+".")] = m
				}
			}
		}
		return nil
	})
}

// readStream reads every message of stream with an ordered consumer, until the consumer says
// none is pending: a fetch that comes back empty is not the end (on a cluster the stream's
// leader may be another server, and slow to deliver).
func readStream(js jetstream.JetStream, stream string) ([]jetstream.Msg, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", stream, err)
	}
	if st.CachedInfo().State.Msgs == 0 {
		return nil, nil
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, fmt.Errorf("ordered consumer on %s: %w", stream, err)
	}
	var out []jetstream.Msg
	for {
		batch, err := cons.Fetch(500, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return nil, fmt.Errorf("fetch from %s: %w", stream, err)
		}
		pending := uint64(1)
		for m := range batch.Messages() {
			out = append(out, m)
			md, err := m.Metadata()
			if err != nil {
				return nil, fmt.Errorf("fetch from %s: %w", stream, err)
			}
			pending = md.NumPending
		}
		if err := batch.Error(); err != nil {
			return nil, fmt.Errorf("fetch from %s: %w", stream, err)
		}
		if pending == 0 {
			return out, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("read %s: %d messages, more pending: %w", stream, len(out), ctx.Err())
		}
	}
}

// row is the newest value of key in bucket, or nil if there is none or it is a delete marker.
func (c *checker) row(bucket, key string) []byte {
	m, ok := c.stored[bucket+" "+key]
	if !ok || m.Headers().Get("KV-Operation") != "" {
		return nil
	}
	return m.Data()
}

// credentials: every credential received has its minted record and its claim.
func (c *checker) credentials() {
	auth := subjects.AuthBucket(harness.TestSpace)
	minted := c.mintedByKey()
	for _, k := range slices.Sorted(maps.Keys(c.a.creds)) {
		cr := c.a.creds[k]
		what := fmt.Sprintf("%s credential %s of instance %s (received in cut %d)", cr.Duty, cr.NKey, cr.Instance, cr.Trial)
		before := len(c.losses)
		if got, ok := minted[cr.Instance+" "+cr.NKey]; !ok {
			c.lost(kindCredential, "%s: no minted record of its instance names it", what)
		} else if got.Duty != cr.Duty {
			c.lost(kindCredential, "%s: its minted record names it as %s", what, got.Duty)
		}
		var claim struct {
			InstanceID string `json:"instanceId"`
		}
		if raw := c.row(auth, subjects.NKeyClaimKey(cr.NKey)); raw == nil {
			c.lost(kindCredential, "%s: its claim is gone", what)
		} else if err := json.Unmarshal(raw, &claim); err != nil || claim.InstanceID != cr.Instance {
			c.lost(kindCredential, "%s: its claim is %s", what, raw)
		}
		if len(c.losses) > before {
			delete(c.a.creds, k) // reported once
		}
	}
}

// mintedByKey is every credential the stored `minted` records name, by "<instance> <nkey>": an
// instance's records (one a set of keys) name each key it was minted, in the last record of each
// set. A record that does not decode names nothing.
func (c *checker) mintedByKey() map[string]harness.MintedCredential {
	prefix := "cotal." + harness.TestSpace + ".minted."
	out := map[string]harness.MintedCredential{}
	for subject, m := range c.stored {
		if !strings.HasPrefix(subject, prefix) {
			continue
		}
		var rec harness.MintedRecord
		if err := json.Unmarshal(m.Data(), &rec); err != nil {
			continue
		}
		for _, cr := range rec.Credentials {
			out[rec.InstanceID+" "+cr.NKey] = cr
		}
	}
	return out
}

// gate is the manager gate of iid as stored, or nil.
func (c *checker) gate(iid string) *issue.GateRow {
	raw := c.row(subjects.AuthBucket(harness.TestSpace), subjects.GateKey(subjects.GateEndpointManager, iid))
	if raw == nil {
		return nil
	}
	g, err := issue.ParseGate(raw)
	if err != nil {
		return nil
	}
	return &g
}

// epochs: every instance's gate is at least at the newest epoch a prepare acknowledged.
func (c *checker) epochs() {
	for _, iid := range slices.Sorted(maps.Keys(c.a.epochs)) {
		e := c.a.epochs[iid]
		if g := c.gate(iid); g == nil {
			c.lost(kindEpoch, "the gate of instance %s (epoch %d acknowledged in cut %d) is gone", iid, e.Epoch, e.Trial)
			delete(c.a.epochs, iid)
		} else if g.ProcessEpoch < e.Epoch {
			c.lost(kindEpoch, "the gate of instance %s is at epoch %d, want %d (acknowledged in cut %d)", iid, g.ProcessEpoch, e.Epoch, e.Trial)
			delete(c.a.epochs, iid)
		}
	}
}

// runs: every admission is there, every run fence at least at its acknowledged takeover, every
// revocation's marker there and its run fence revoked.
func (c *checker) runs() {
	adm, auth := subjects.AdmissionBucket(harness.TestSpace), subjects.AuthBucket(harness.TestSpace)
	for _, id := range slices.Sorted(maps.Keys(c.a.runs)) {
		r := c.a.runs[id]
		if c.row(adm, subjects.AdmissionKey(id)) == nil {
			c.lost(kindAdmission, "run %s of instance %s (admitted in cut %d): its admission is gone", id, r.Instance, r.Trial)
			delete(c.a.runs, id)
		}
		if r.Epoch == 0 {
			continue
		}
		var fence struct {
			Epoch        uint64 `json:"epoch"`
			FencingToken uint64 `json:"fencingToken"`
			Revoked      bool   `json:"revoked"`
		}
		raw := c.row(auth, subjects.RunFenceKey(id))
		if raw == nil || json.Unmarshal(raw, &fence) != nil {
			c.lost(kindAttempt, "run %s: its run fence (epoch %d acknowledged) is %q", id, r.Epoch, raw)
			delete(c.a.runs, id)
			continue
		}
		if fence.Epoch < r.Epoch || fence.FencingToken < r.Token {
			c.lost(kindAttempt, "run %s: its run fence is at %d/%d, want %d/%d", id, fence.Epoch, fence.FencingToken, r.Epoch, r.Token)
			delete(c.a.runs, id)
		}
		if _, revoked := c.a.revoked[id]; revoked && !fence.Revoked {
			c.lost(kindRunRevoke, "run %s: its run fence is not revoked", id)
			delete(c.a.revoked, id)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(c.a.revoked)) {
		if c.row(adm, subjects.RevokedKey(id)) == nil {
			c.lost(kindRunRevoke, "run %s of instance %s: its revocation marker is gone", id, c.a.revoked[id].Instance)
			delete(c.a.revoked, id)
		}
	}
}

// assignments: every assignment is there, and every acknowledged end has the assignment ended
// and the gate retired.
func (c *checker) assignments() {
	for _, iid := range slices.Sorted(maps.Keys(c.a.assigned)) {
		as := c.a.assigned[iid]
		var row client.Assignment
		raw := c.row(subjects.PlatformBucket(harness.TestSpace), subjects.AssignmentKey(as.Owner))
		if raw == nil || json.Unmarshal(raw, &row) != nil || row.InstanceID != iid {
			c.lost(kindAssign, "the assignment of owner %s to instance %s (cut %d) is %q", as.Owner, iid, as.Trial, raw)
			delete(c.a.assigned, iid)
			delete(c.a.ends, iid)
			continue
		}
		end, ended := c.a.ends[iid]
		if !ended {
			continue
		}
		before := len(c.losses)
		if row.State != client.StateEnded {
			c.lost(kindEnd, "owner %s's assignment of instance %s (ended in cut %d) is %s, want ended", as.Owner, iid, end.Trial, row.State)
		}
		if g := c.gate(iid); g == nil || g.State != issue.GateRetired {
			state := "gone"
			if g != nil {
				state = g.State
			}
			c.lost(kindEnd, "the gate of instance %s (ended in cut %d) is %s, want retired", iid, end.Trial, state)
		}
		if len(c.losses) > before {
			delete(c.a.ends, iid) // reported once
		}
	}
}

// scopes: every principal's scope is the one acknowledged, or one sent since. What the row
// says then settles what the next check expects.
func (c *checker) scopes() {
	actors := subjects.ActorsBucket(harness.TestSpace)
	for _, principal := range slices.Sorted(maps.Keys(c.a.scopes)) {
		s := c.a.scopes[principal]
		owner, actor, _ := subjects.SplitPrincipal(principal)
		var row manager.ActorRow
		var got []string
		if raw := c.row(actors, subjects.ActorKey(owner, actor)); raw != nil {
			if err := json.Unmarshal(raw, &row); err != nil {
				c.lost(kindScope, "%s: its ledger row %q does not decode: %v", principal, raw, err)
				continue
			}
			got = row.Scope
		}
		same := func(want []string) bool {
			return slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(want)))
		}
		if !same(s.Scope) && !slices.ContainsFunc(s.pending, same) {
			c.lost(kindScope, "%s has scope %q, want %q (acknowledged in cut %d)", principal, got, s.Scope, s.Trial)
		}
		s.Scope, s.pending = got, nil
	}
}

// agents: every agent's secret is the one acknowledged (none once revoked), unless a change
// was under way.
func (c *checker) agents() {
	actors := subjects.ActorsBucket(harness.TestSpace)
	for _, principal := range slices.Sorted(maps.Keys(c.a.agents)) {
		ag := c.a.agents[principal]
		owner, actor, _ := subjects.SplitPrincipal(principal)
		var row manager.ActorRow
		if raw := c.row(actors, subjects.ActorKey(owner, actor)); raw != nil {
			if err := json.Unmarshal(raw, &row); err != nil {
				c.lost(kindAgent, "%s: its ledger row %q does not decode: %v", principal, raw, err)
				continue
			}
		}
		if ag.pending {
			ag.Revoked, ag.pending = row.TokenHash == "", false
			if !ag.Revoked {
				ag.secret = "" // some secret of the load's, not known which
			}
			continue
		}
		want := ""
		if !ag.Revoked {
			sum := sha256.Sum256([]byte(ag.secret))
			want = hex.EncodeToString(sum[:])
		}
		switch {
		case ag.Revoked && row.TokenHash != "":
			c.lost(kindAgent, "%s was revoked in cut %d, and has a secret again", principal, ag.Trial)
		case !ag.Revoked && ag.secret != "" && row.TokenHash != want:
			c.lost(kindAgent, "%s's secret set in cut %d is not its secret", principal, ag.Trial)
		}
	}
}

// finishEnds asks again for every end that was under way at the cut: each must complete.
func (c *checker) finishEnds() {
	c.t.Helper()
	c.a.mu.Lock()
	underway := slices.Collect(maps.Values(c.a.underway))
	c.a.mu.Unlock()
	if len(underway) == 0 {
		return
	}
	pa := c.caller(harness.OwnerP, adminActor)
	defer pa.Close()
	for _, end := range underway {
		err := retried(func(ctx context.Context) error {
			r, err := pa.End(ctx, client.End{Owner: end.Owner, InstanceID: end.Instance, LifecycleUID: end.Lifecycle, Reason: "the power-cut test ends it again"})
			if err == nil && !r.Done {
				err = fmt.Errorf("answered not done: %+v", *r)
			}
			return err
		})
		if err != nil {
			c.lost(kindEnd, "the end of instance %s, under way at the cut, does not complete when asked again: %v", end.Instance, err)
			continue
		}
		c.a.mu.Lock()
		delete(c.a.underway, end.Instance)
		c.a.ends[end.Instance] = end
		c.a.mu.Unlock()
	}
}

// retryWithin is how long a check asks again while the plane answers unavailable (or not at
// all): a cluster back from a cut elects its stream leaders while the plane already serves.
const retryWithin = time.Minute

// retried calls ask, each call with its own request timeout, again while it fails with
// unavailable or no answer, for at most retryWithin: the caller's retry policy.
func retried(ask func(ctx context.Context) error) error {
	deadline := time.Now().Add(retryWithin)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
		err := ask(ctx)
		cancel()
		code := client.CodeOf(err)
		if err == nil || (code != "unavailable" && code != "" && code != "503") || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// caller connects as owner.actor with a caller credential.
func (c *checker) caller(owner, actor string) *client.Client {
	c.t.Helper()
	cl, err := client.Connect(c.tg.url, harness.TestSpace, owner, actor,
		nats.UserCredentials(callerCreds(c.t, c.tg.keys, owner, actor)), nats.MaxReconnects(0))
	if err != nil {
		c.t.Fatalf("connect as %s after the restart: %v", subjects.Principal(owner, actor), err)
	}
	return cl
}

// endedRefused: every server of the broker refuses every unexpired credential of an ended
// instance at connect, and lists no connection of one.
func (c *checker) endedRefused() {
	c.t.Helper()
	var creds []*cred
	c.a.mu.Lock()
	soon := time.Now().Add(10 * time.Second).Unix()
	for _, cr := range c.a.creds {
		if _, ended := c.a.ends[cr.Instance]; ended && cr.Exp > soon && cr.seed != nil {
			creds = append(creds, cr)
		}
	}
	c.a.mu.Unlock()
	if len(creds) == 0 {
		return
	}
	type probe struct {
		cr  *cred
		url string
	}
	var (
		mu       sync.Mutex
		wg       sync.WaitGroup
		next     = make(chan probe)
		admitted = map[string]bool{}
	)
	for range 8 {
		wg.Go(func() {
			for p := range next {
				nc, err := nats.Connect(p.url, nats.UserJWTAndSeed(p.cr.jwt, string(p.cr.seed)), nats.MaxReconnects(0), nats.Timeout(10*time.Second))
				if err != nil {
					continue
				}
				nc.Close()
				mu.Lock()
				c.lost(kindEnd, "the broker at %s admitted the %s credential %s of ended instance %s", p.url, p.cr.Duty, p.cr.NKey, p.cr.Instance)
				admitted[p.cr.NKey] = true
				mu.Unlock()
			}
		})
	}
	var users []string
	for _, cr := range creds {
		users = append(users, cr.NKey)
		for _, url := range c.tg.servers {
			next <- probe{cr, url}
		}
	}
	close(next)
	wg.Wait()
	c.a.mu.Lock()
	for k := range admitted {
		delete(c.a.creds, k) // reported once
	}
	c.a.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	conns, answered, err := broker.Account{NC: c.sys, Public: c.tg.keys.Data.Public()}.ListConnections(ctx, len(c.tg.servers))
	if err != nil || len(answered) < len(c.tg.servers) {
		c.t.Fatalf("list the connections of the ended instances' keys: %d of %d servers answered: %v", len(answered), len(c.tg.servers), err)
	}
	held := map[string]int{}
	for _, conn := range conns {
		if slices.Contains(users, conn.User) {
			held[conn.User]++
		}
	}
	for _, k := range slices.Sorted(maps.Keys(held)) {
		c.lost(kindEnd, "the broker lists %d connections of key %s of an ended instance", held[k], k)
	}
}

// staleRefused: a renewal with the proof of an epoch before the newest acknowledged is refused.
func (c *checker) staleRefused() {
	c.t.Helper()
	c.a.mu.Lock()
	var stale []*epochAck
	for _, e := range c.a.epochs {
		if e.old != nil {
			stale = append(stale, e)
		}
	}
	c.a.mu.Unlock()
	if len(stale) == 0 {
		return
	}
	cli := c.caller(harness.OwnerA, cliActor)
	defer cli.Close()
	for _, e := range stale {
		var mat *client.Material
		err := retried(func(ctx context.Context) (err error) {
			mat, err = cli.Renew(ctx, e.mgr.m, *e.old)
			return err
		})
		if err == nil {
			c.a.material(e.mgr.m, e.mgr.keys, mat.Credentials)
			c.lost(kindEpoch, "a renewal of instance %s at epoch %d, older than its acknowledged %d, was answered with credentials", e.Instance, e.old.Epoch, e.Epoch)
		} else if client.CodeOf(err) != "conflict" || !strings.Contains(err.Error(), "stale") {
			c.lost(kindEpoch, "a renewal of instance %s at epoch %d, older than its acknowledged %d: got %v, want conflict: processEpoch is stale", e.Instance, e.old.Epoch, e.Epoch, err)
		} else {
			continue
		}
		c.a.mu.Lock()
		delete(c.a.epochs, e.Instance) // reported once
		c.a.mu.Unlock()
	}
}

// revokedRunsRefused: the next attempt on a revoked run is refused as revoked.
func (c *checker) revokedRunsRefused() {
	c.t.Helper()
	c.a.mu.Lock()
	var runs []*runAck
	for _, r := range c.a.revoked {
		if r.mgr.ok {
			runs = append(runs, r)
		}
	}
	c.a.mu.Unlock()
	if len(runs) == 0 {
		return
	}
	cli := c.caller(harness.OwnerA, cliActor)
	defer cli.Close()
	for _, r := range runs {
		driver, mediator := userKey(), userKey()
		a := client.Attempt{RunID: r.RunID, TakeoverID: hex.EncodeToString(random(8)), Epoch: r.Epoch + 1, FencingToken: r.Token + 1,
			DriverID: public(driver), MediatorID: public(mediator)}
		err := retried(func(ctx context.Context) error {
			_, err := cli.Attempt(ctx, r.mgr.m, r.mgr.cur, a)
			return err
		})
		if err == nil {
			c.lost(kindRunRevoke, "an attempt on revoked run %s was answered with credentials", r.RunID)
		} else if client.CodeOf(err) != "permission-denied" || !strings.Contains(err.Error(), "was revoked") {
			c.lost(kindRunRevoke, "an attempt on revoked run %s: got %v, want permission-denied: was revoked", r.RunID, err)
		} else {
			continue
		}
		c.a.mu.Lock()
		delete(c.a.revoked, r.RunID) // reported once
		c.a.mu.Unlock()
	}
}

// revokedAgentsRefused: a revoked agent's last secret is refused at the exchange, and its last
// bearer by the broker.
func (c *checker) revokedAgentsRefused() {
	c.t.Helper()
	c.a.mu.Lock()
	revoked := map[string]agentAck{}
	for p, ag := range c.a.agents {
		if ag.Revoked && ag.secret != "" {
			revoked[p] = *ag
		}
	}
	c.a.mu.Unlock()
	if len(revoked) == 0 {
		return
	}
	sentinel := filepath.Join(c.t.TempDir(), "sentinel.creds")
	raw, err := c.tg.keys.SentinelCreds()
	if err != nil {
		c.t.Fatal(err)
	}
	if err := os.WriteFile(sentinel, raw, 0o600); err != nil {
		c.t.Fatal(err)
	}
	for _, p := range slices.Sorted(maps.Keys(revoked)) {
		ag := revoked[p]
		owner, actor, _ := subjects.SplitPrincipal(p)
		err := retried(func(ctx context.Context) error {
			_, err := exchange(ctx, c.tg, owner, actor, ag.secret)
			return err
		})
		if err == nil || client.CodeOf(err) != "401" {
			c.lost(kindAgent, "%s, revoked in cut %d: its secret's exchange got %v, want 401", p, ag.Trial, err)
		}
		if ag.bearer.Exp < time.Now().Add(10*time.Second).Unix() {
			continue
		}
		nc, err := nats.Connect(c.tg.url, nats.UserCredentials(sentinel), nats.Token(ag.bearer.Token), nats.MaxReconnects(0), nats.Timeout(10*time.Second))
		if err == nil {
			nc.Close()
			c.lost(kindAgent, "%s, revoked in cut %d: the broker admitted its last bearer", p, ag.Trial)
		}
	}
}
