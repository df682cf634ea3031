package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	dto "github.com/prometheus/client_model/go"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/internal/core/store"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// The load generator's retry policy. Retries belong to the caller (the plane retries its own
// store calls within a request's deadline, never a whole request): an answer of `unavailable`,
// or none within the attempt timeout (a reply lost as a broker went away, no responders while
// the serving connections reconnect), is asked again, at most nodeLossAttempts times in all,
// nodeLossBackoff apart. Any other refusal is final. The attempt timeout outlasts the plane's
// request deadline, so an attempt the plane gave up on is answered `unavailable`.
const (
	nodeLossAttempts       = 4
	nodeLossAttemptTimeout = nodeLossDeadline + 500*time.Millisecond
	nodeLossBackoff        = 100 * time.Millisecond
	// nodeLossRecovery is the bound on the time from an event to the end of the first request
	// sent after it that succeeded, on a quiet machine (testkit.Stretched widens it on a busy one).
	nodeLossRecovery = 5 * time.Second
	// nodeLossDeadline is the replicas' --request-timeout: shorter than the default 5 s, as a
	// manager renewing on a cluster would want a lost answer given up on sooner.
	nodeLossDeadline = 3 * time.Second
)

// TestRenewalsSurviveLosingANodeAndTheMetaLeader runs a three-node cluster (R3 stores) with
// two plane replicas under steady renew load from several managers, each its own instance on
// its own connection, while a registrar registers fresh managers. One server that is not the
// JetStream meta leader is shut down and brought back, then the meta leader's server. After each
// event the plane serves again within 5 s, every request succeeds within the caller's bounded
// retries, every plane connection that was on a stopped server reconnects to another node and
// its replica issues again, no fence committed before a loss is lost, no write-once row is
// written twice, and every credential a client received has its `minted` record. It logs a
// table of each event's requests.
func TestRenewalsSurviveLosingANodeAndTheMetaLeader(t *testing.T) {
	harness.Long(t, "a three-node cluster")
	// Not parallel: the recovery bound is timed, and the stores' error counters it reports are
	// the process's.
	c := startCluster(t, harness.TestSpace, 3)

	// Replica one is given one server, a non-leader, and finds the others as the cluster
	// announces them; replica two is given all three, as an operator gives --nats-url.
	seed := slices.IndexFunc(c.servers, func(s *server.Server) bool { return !s.JetStreamIsLeader() })
	planes := []*harness.TestPlane{
		harness.StartPlane(t, func(cfg *service.Config) { againstCluster(c)(cfg); cfg.NATSURL = c.URL(seed); nodeLossPlane(cfg) }),
		harness.StartPlane(t, func(cfg *service.Config) { againstCluster(c)(cfg); nodeLossPlane(cfg) }),
	}
	observer := newClusterObserver(t, c)
	harness.Grant(t, planes[1], harness.OwnerA, "cli", "supervise")

	l := newNodeLossLoad(t, c)
	l.planes = planes
	const renewers = 4
	for i := range renewers {
		l.startRenewer(t, i)
	}
	l.startRegistrar(t)
	l.mark(t, "steady load")
	l.waitServedAfter(t, time.Now())

	// (a) A server that is not the meta leader: replica one's, unless it has become the leader
	// (then (b) stops it).
	first := seed
	if c.metaLeader() == seed {
		first = slices.IndexFunc(c.servers, func(s *server.Server) bool { return !s.JetStreamIsLeader() })
	}
	observer.check(t, "before the first event", nil)
	l.stopNode(t, observer, planes, first, fmt.Sprintf("stop %s (not the meta leader)", c.servers[first].Name()))
	l.startNode(t, observer, first)

	// (b) The meta leader's server, once the first is a current replica again (two down lose
	// quorum).
	leader := c.metaLeader()
	if leader < 0 {
		t.Fatal("no meta leader to stop")
	}
	l.stopNode(t, observer, planes, leader, fmt.Sprintf("stop %s (the meta leader)", c.servers[leader].Name()))
	l.startNode(t, observer, leader)

	l.mark(t, "steady again")
	l.waitServedAfter(t, time.Now())
	l.finish()
	l.end.retries = l.retries(t) // every requester has stopped: no fence write retries after this

	observer.verify(t, l)
	l.report(t)
	if !l.droppedServing {
		t.Errorf("no plane replica's serving connection was on a stopped server; want replica one's (seeded with %s)", c.servers[seed].Name())
	}
	l.checkMinted(t, observer)
}

// nodeLossPlane configures a replica for the load: four workers, room for every manager the
// registrar registers, and the request deadline.
func nodeLossPlane(cfg *service.Config) {
	cfg.Workers = 4
	cfg.MaxInstancesPerOwner = 1000
	cfg.RequestTimeout = nodeLossDeadline
}

// loadRequest is one request of the load, as its caller saw it.
type loadRequest struct {
	who, op string
	// sent is when its first attempt was sent, okSent when the attempt that succeeded was.
	sent, okSent, done time.Time
	attempts           int
	// retried are the answers of the attempts that were asked again.
	retried []string
	// code is the final refusal ("" on success), message its text.
	code, message string
}

// loadEvent is one event of the test and what is measured after it.
type loadEvent struct {
	name string
	at   time.Time
	// unknown and retries are the stores' unknown outcomes (a 503 such as 10163 or 10008, a
	// timeout, no responders) and fence CAS retries counted in this process when it began.
	unknown, retries int64
	// lost and dups are the fences lost and write-once rows written twice, as the check after
	// the event found them.
	lost, dups int
	checked    bool
}

// receivedKey is a credential a client received: its nkey, duty and instance.
type receivedKey struct {
	iid  string
	duty string
}

// nodeLossLoad is the load: renewers and a registrar, each on its own connection, every
// request recorded.
type nodeLossLoad struct {
	c *cluster
	// planes are the replicas under load: their fence retries are counted.
	planes []*harness.TestPlane
	stop   chan struct{}
	wg     sync.WaitGroup
	// clients close once every requester has stopped.
	clients []*client.Client

	mu       sync.Mutex
	requests []loadRequest
	events   []loadEvent
	received map[string]receivedKey
	// droppedServing says a replica's serving connection was on a stopped server.
	droppedServing bool
	// ended is when the load stopped; end is that moment as an event, for the report.
	ended time.Time
	end   loadEvent
}

func newNodeLossLoad(t *testing.T, c *cluster) *nodeLossLoad {
	l := &nodeLossLoad{c: c, stop: make(chan struct{}), received: map[string]receivedKey{}}
	t.Cleanup(l.finish)
	return l
}

// connect connects as principal owner.actor to every server of the cluster, reconnecting for
// as long as it takes, until finish.
func (l *nodeLossLoad) connect(t *testing.T, actor string, auth nats.Option) *client.Client {
	t.Helper()
	cl, err := client.Connect(l.c.URLs(), harness.TestSpace, harness.OwnerA, actor, auth,
		nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.ReconnectJitter(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	l.clients = append(l.clients, cl)
	l.mu.Unlock()
	return cl
}

// retryable says whether the caller asks again after this answer.
func retryable(err error) bool {
	code := client.CodeOf(err)
	return code == "unavailable" || code == "" // "": no answer (a timeout, no responders)
}

// do runs one request under the retry policy and records it; it returns the material, or nil.
func (l *nodeLossLoad) do(who, op string, call func(ctx context.Context) (*client.Material, error)) *client.Material {
	r := loadRequest{who: who, op: op, sent: time.Now()}
	var mat *client.Material
	for r.attempts < nodeLossAttempts {
		r.attempts++
		sent := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), nodeLossAttemptTimeout)
		m, err := call(ctx)
		cancel()
		if err == nil {
			mat, r.okSent = m, sent
			break
		}
		r.code, r.message = client.CodeOf(err), err.Error()
		if r.code == "" {
			r.code = "no answer"
		}
		if !retryable(err) || r.attempts == nodeLossAttempts {
			break
		}
		r.retried = append(r.retried, r.code)
		select {
		case <-l.stop:
			return nil // cut short by the end of the load: not given its retries, not counted
		case <-time.After(nodeLossBackoff):
		}
	}
	if mat != nil {
		r.code, r.message = "", ""
	}
	r.done = time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended.IsZero() || r.sent.Before(l.ended) {
		l.requests = append(l.requests, r)
	}
	return mat
}

// keep records the credentials of mat as received by manager m.
func (l *nodeLossLoad) keep(m client.Manager, mat *client.Material) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for duty, cred := range mat.Credentials {
		uc, err := jwt.DecodeUserClaims(cred.JWT)
		if err != nil {
			return fmt.Errorf("the %s credential does not decode: %w", duty, err)
		}
		if want := m.Identities.Of(subjects.Duty(duty)); uc.Subject != want {
			return fmt.Errorf("the %s credential is for %s, want the manager's %s", duty, uc.Subject, want)
		}
		l.received[uc.Subject] = receivedKey{iid: m.InstanceID, duty: duty}
	}
	return nil
}

// startRenewer registers manager i with ownerA.cli, then renews it, alternating renew and
// renewStandingBundle, every 50 ms, until finish.
func (l *nodeLossLoad) startRenewer(t *testing.T, i int) {
	t.Helper()
	cli := l.connect(t, "cli", nats.UserCredentials(harness.WriteCallerCreds(t, l.c.material, harness.OwnerA, "cli")))
	m, keys, err := client.NewManager()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A first prepare waits for a signing of the data account's JWT that lists its key: on a
	// loaded machine, four at once may pass the 3 s deadline, and are asked again.
	var prep *client.Material
	for try := 1; ; try++ {
		if prep, err = cli.Prepare(ctx, m); err == nil || !retryable(err) || try == nodeLossAttempts {
			break
		}
	}
	if err != nil {
		t.Fatalf("prepare manager %d: %v", i, err)
	}
	act, err := cli.Activate(ctx, m, prep.RegistrationProof)
	if err != nil {
		t.Fatalf("activate manager %d: %v", i, err)
	}
	renewal := act.Renewal()
	// Its supervisor and its executor renew it, each on its own connection: renewals of one
	// gate in flight at once, from either replica.
	for _, d := range []subjects.Duty{subjects.DutySupervisor, subjects.DutyExecutor} {
		seed, err := keys[d].Seed()
		if err != nil {
			t.Fatal(err)
		}
		own := l.connect(t, subjects.DutyActor(d, m.InstanceID, ""), nats.UserJWTAndSeed(prep.Credentials[string(d)].JWT, string(seed)))
		who := fmt.Sprintf("manager %d %s", i, d)
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			for n := 0; ; n++ {
				select {
				case <-l.stop:
					return
				case <-tick.C:
				}
				op, renew := client.OpRenew, own.Renew
				if n%2 == 1 {
					op, renew = client.OpRenewStandingBundle, own.RenewStandingBundle
				}
				mat := l.do(who, op, func(ctx context.Context) (*client.Material, error) { return renew(ctx, m, renewal) })
				if mat != nil {
					if err := l.keep(m, mat); err != nil {
						t.Error(err)
					}
				}
			}
		}()
	}
}

// startRegistrar registers a fresh manager every 300 ms (prepare, then activate with the
// proof of the prepare that answered), as ownerA.cli on its own connection, until finish: the
// fence and write-once rows written while nodes come and go.
func (l *nodeLossLoad) startRegistrar(t *testing.T) {
	t.Helper()
	cli := l.connect(t, "cli", nats.UserCredentials(harness.WriteCallerCreds(t, l.c.material, harness.OwnerA, "cli")))
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		tick := time.NewTicker(300 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-l.stop:
				return
			case <-tick.C:
			}
			m, _, err := client.NewManager()
			if err != nil {
				t.Error(err)
				return
			}
			prep := l.do("registrar", client.OpPrepare, func(ctx context.Context) (*client.Material, error) { return cli.Prepare(ctx, m) })
			if prep == nil {
				continue
			}
			if err := l.keep(m, prep); err != nil {
				t.Error(err)
			}
			act := l.do("registrar", client.OpActivate, func(ctx context.Context) (*client.Material, error) {
				return cli.Activate(ctx, m, prep.RegistrationProof)
			})
			if act != nil {
				if err := l.keep(m, act); err != nil {
					t.Error(err)
				}
			}
		}
	}()
}

// retries counts the fence writes the replicas retried, as their metrics export them.
func (l *nodeLossLoad) retries(t *testing.T) int64 {
	var n int64
	for _, p := range l.planes {
		n += int64(harness.Sample(harness.Scrape(t, p.HTTPURL()), "authplane_cas_retries_total", nil))
	}
	return n
}

// mark begins event name now.
func (l *nodeLossLoad) mark(t *testing.T, name string) loadEvent {
	ev := loadEvent{name: name, at: time.Now(), unknown: store.Errors.UnknownOutcome.Load(), retries: l.retries(t)}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, ev)
	return ev
}

// finish stops the load and waits for every requester.
func (l *nodeLossLoad) finish() {
	l.mu.Lock()
	if !l.ended.IsZero() {
		l.mu.Unlock()
		return
	}
	l.ended = time.Now()
	l.end = loadEvent{name: "end", at: l.ended, unknown: store.Errors.UnknownOutcome.Load()}
	l.mu.Unlock()
	close(l.stop)
	l.wg.Wait()
	for _, cl := range l.clients {
		cl.Close()
	}
}

// nodeLossServed is how many requests sent after an event every requester must have had
// succeed before the next event: each state of the cluster carries load for a while.
const nodeLossServed = 10

// waitServedAfter waits until every requester has had nodeLossServed requests sent after at
// succeed.
func (l *nodeLossLoad) waitServedAfter(t *testing.T, at time.Time) {
	t.Helper()
	testkit.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		l.mu.Lock()
		defer l.mu.Unlock()
		served := map[string]int{}
		for _, r := range l.requests {
			n := served[r.who]
			if r.code == "" && !r.okSent.Before(at) {
				n++
			}
			served[r.who] = n
		}
		if len(served) == 0 {
			return errors.New("no request yet")
		}
		for who, n := range served {
			want := nodeLossServed
			if who == "registrar" {
				// A first registration waits for the next signing of the data account's JWT,
				// one a second across the replicas, that lists its instance's key.
				want = nodeLossServed / 2
			}
			if n < want {
				return fmt.Errorf("%s has had %d requests sent after %s succeed, want %d", who, n, at.Format("15:04:05.000"), want)
			}
		}
		return nil
	})
}

// stopNode shuts server i down (event name) and waits until the load is served again: every
// plane connection that was on it is on another server, and its replica has issued since.
// Then every row of the stores as last observed is checked.
func (l *nodeLossLoad) stopNode(t *testing.T, o *clusterObserver, planes []*harness.TestPlane, i int, name string) {
	t.Helper()
	s := l.c.servers[i]
	on := planeConnsOn(t, s)
	led := l.c.streamsLedBy(i)
	ev := l.mark(t, name)
	l.c.stop(t, i)
	t.Logf("%s: stopped in %s; it led %d of the plane's %d streams; plane connections on it: %v",
		name, time.Since(ev.at).Round(time.Millisecond), len(led), len(l.c.planeStreams()), on)

	for _, p := range planes {
		var dropped []string
		for _, conn := range on {
			if strings.HasSuffix(conn, " "+p.InstanceID()) {
				dropped = append(dropped, conn)
			}
		}
		if len(dropped) == 0 {
			continue
		}
		if slices.Contains(dropped, "authplane serving "+p.InstanceID()) {
			l.mu.Lock()
			l.droppedServing = true
			l.mu.Unlock()
		}
		var issued float64
		testkit.CheckFor(t, 20*time.Second, 20*time.Millisecond, func() error {
			for _, conn := range dropped {
				if where := serverOf(t, l.c, conn); where == "" {
					return fmt.Errorf("%s is on no running server", conn)
				}
			}
			issued = total(harness.Scrape(t, p.HTTPURL()), "authplane_credentials_issued_total")
			return nil
		})
		testkit.CheckFor(t, 20*time.Second, 20*time.Millisecond, func() error {
			if now := total(harness.Scrape(t, p.HTTPURL()), "authplane_credentials_issued_total"); now <= issued {
				return fmt.Errorf("the replica %s has issued nothing since it reconnected (%v credentials)", p.InstanceID(), now)
			}
			return nil
		})
		took := time.Since(ev.at)
		var where []string
		for _, conn := range dropped {
			where = append(where, strings.TrimSuffix(conn, " "+p.InstanceID())+" → "+serverOf(t, l.c, conn))
		}
		t.Logf("%s: replica %s reconnected and issued again within %s: %s", name, p.InstanceID(), took.Round(time.Millisecond), strings.Join(where, ", "))
		if bound := testkit.Stretched(nodeLossRecovery); took > bound {
			t.Errorf("%s: replica %s issued again after %s, want within %s (%s on a quiet machine)", name, p.InstanceID(), took.Round(time.Millisecond), bound, nodeLossRecovery)
		}
	}
	l.waitServedAfter(t, ev.at)
	o.check(t, name, l)
}

// startNode brings server i back (event "start <name>") and waits until it is a current
// replica of every stream and the load is served again. Then every row of the stores as last
// observed is checked.
func (l *nodeLossLoad) startNode(t *testing.T, o *clusterObserver, i int) {
	t.Helper()
	ev := l.mark(t, "start "+l.c.servers[i].Name())
	l.c.start(t, i)
	l.c.waitFormed(t)
	l.c.waitCurrent(t, 30*time.Second)
	t.Logf("%s: formed and current in %s", ev.name, time.Since(ev.at).Round(time.Millisecond))
	l.waitServedAfter(t, ev.at)
	o.check(t, ev.name, l)
}

// report logs a table of the events: for each, the requests first sent during it that
// succeeded and failed, the attempts retried, the time from the event to the end of the first
// request sent after it that succeeded (failing the test past nodeLossRecovery), and the
// stores' unknown outcomes and CAS retries the planes settled. It fails the test on any
// request that failed after its retries.
func (l *nodeLossLoad) report(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "\n%-32s %9s %9s %5s %6s %7s %13s %9s %11s %8s  %s\n", "event", "served in", "all in", "ok", "failed", "retried",
		"store unknown", "CAS retry", "fences lost", "dup rows", "retried answers")
	lost, dups := 0, 0
	for k, ev := range l.events {
		next := l.end
		if k+1 < len(l.events) {
			next = l.events[k+1]
		}
		ok, failed, retried := 0, 0, 0
		answers := map[string]int{}
		first := time.Duration(-1)
		each := map[string]time.Duration{} // each requester's first success after the event
		for _, r := range l.requests {
			if r.code == "" && !r.okSent.Before(ev.at) {
				took := r.done.Sub(ev.at)
				if first < 0 || took < first {
					first = took
				}
				if e, seen := each[r.who]; !seen || took < e {
					each[r.who] = took
				}
			}
			if r.sent.Before(ev.at) || !r.sent.Before(next.at) {
				continue
			}
			if r.code == "" {
				ok++
			} else {
				failed++
				t.Errorf("%s: %s %s failed after %d attempts: %s %s", ev.name, r.who, r.op, r.attempts, r.code, r.message)
			}
			retried += len(r.retried)
			for _, a := range r.retried {
				answers[a]++
			}
		}
		servedIn, allIn := "-", "-"
		if first >= 0 {
			servedIn = first.Round(time.Millisecond).String()
			allIn = slices.Max(slices.Collect(maps.Values(each))).Round(time.Millisecond).String()
		}
		if bound := testkit.Stretched(nodeLossRecovery); first < 0 || first > bound {
			t.Errorf("%s: the plane served again after %s, want within %s (%s on a quiet machine)", ev.name, servedIn, bound, nodeLossRecovery)
		}
		var kinds []string
		for _, a := range slices.Sorted(maps.Keys(answers)) {
			kinds = append(kinds, fmt.Sprintf("%s×%d", a, answers[a]))
		}
		checkedLost, checkedDups := "-", "-"
		if ev.checked {
			checkedLost, checkedDups = strconv.Itoa(ev.lost), strconv.Itoa(ev.dups)
			lost, dups = lost+ev.lost, dups+ev.dups
		}
		fmt.Fprintf(&b, "%-32s %9s %9s %5d %6d %7d %13d %9d %11s %8s  %s\n", ev.name, servedIn, allIn, ok, failed, retried,
			next.unknown-ev.unknown, next.retries-ev.retries, checkedLost, checkedDups, strings.Join(kinds, " "))
	}
	fmt.Fprintf(&b, "in all: %d fences lost, %d write-once rows written twice; credentials received for %d nkeys", lost, dups, len(l.received))
	harness.Report(t, "%s", b.String())
}

// checkMinted checks that every nkey a client received a credential for has a `minted`
// record of its instance and duty.
func (l *nodeLossLoad) checkMinted(t *testing.T, o *clusterObserver) {
	t.Helper()
	byKey := map[string]map[string]harness.MintedRecord{} // instance → nkey → the record naming it
	missing := 0
	for nkey, k := range l.received {
		if byKey[k.iid] == nil {
			byKey[k.iid] = map[string]harness.MintedRecord{}
			for _, rec := range harness.MintedRecordsIn(t, o.js, k.iid) {
				for _, key := range rec.Keys() {
					byKey[k.iid][key] = rec
				}
			}
		}
		rec, ok := byKey[k.iid][nkey]
		if !ok {
			missing++
			t.Errorf("%s credential %s of instance %s: no minted record names it", k.duty, nkey, k.iid)
			continue
		}
		if c, _ := rec.Of(nkey); rec.InstanceID != k.iid || c.Duty != k.duty {
			t.Errorf("minted record of %s: got %+v, want instance %s duty %s", nkey, rec, k.iid, k.duty)
		}
	}
	harness.Report(t, "minted records: %d of %d nkeys received, %d missing", len(l.received)-missing, len(l.received), missing)
}

// planeConnsOn names the plane replicas' connections on s ("authplane <role> <instance>"), but
// the system users pinned to one server each ("system1", "system2", …): those wait for their
// server to come back.
func planeConnsOn(t *testing.T, s *server.Server) []string {
	t.Helper()
	connz, err := s.Connz(&server.ConnzOptions{Limit: 4096})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, ci := range connz.Conns {
		if f := strings.Fields(ci.Name); len(f) == 3 && f[0] == "authplane" && subjects.ValidUID(f[2]) && !pinned.MatchString(f[1]) {
			names = append(names, ci.Name)
		}
	}
	slices.Sort(names)
	return names
}

// pinned is the role of a plane's system user pinned to one server.
var pinned = regexp.MustCompile(`^system[0-9]+$`)

// serverOf names the running server the connection called name is on, or "".
func serverOf(t *testing.T, c *cluster, name string) string {
	t.Helper()
	for _, i := range c.running() {
		if slices.Contains(planeConnsOn(t, c.servers[i]), name) {
			return c.servers[i].Name()
		}
	}
	return ""
}

// total sums every sample of the counter family name.
func total(families map[string]*dto.MetricFamily, name string) float64 {
	var sum float64
	if f, ok := families[name]; ok {
		for _, m := range f.Metric {
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

// storedRow is a bucket's latest entry for one key: its revision and bytes.
type storedRow struct {
	rev  uint64
	data []byte
}

// storeSnapshot is every key of every bucket of the space, "<bucket> <key>" → its row, read
// from each stream's leader.
type storeSnapshot map[string]storedRow

// clusterObserver reads the plane's buckets as an auditor would, on its own plane-account
// connection to every server, and remembers each write-once row as it first saw it.
type clusterObserver struct {
	js      jetstream.JetStream
	buckets []string
	once    storeSnapshot
	// last is the stores as the last check read them.
	last storeSnapshot
}

func newClusterObserver(t *testing.T, c *cluster) *clusterObserver {
	t.Helper()
	_, js := harness.PlaneConn(t, c.material, c.URLs())
	o := &clusterObserver{js: js, once: storeSnapshot{}}
	for _, spec := range store.Specs(harness.TestSpace, store.Options{}) {
		if spec.Bucket != "" {
			o.buckets = append(o.buckets, spec.Bucket)
		}
	}
	return o
}

// writeOnce says whether the row at key of bucket is written once for life: a claim on an
// nkey, or any row of a write-once or create-only bucket.
func writeOnce(bucket, key string) bool {
	switch bucket {
	case subjects.AcceptedBucket(harness.TestSpace), subjects.AdmissionBucket(harness.TestSpace), subjects.SecretsBucket(harness.TestSpace):
		return true
	}
	return bucket == subjects.AuthBucket(harness.TestSpace) && strings.HasPrefix(key, "nkey.")
}

// snapshot reads every key of every bucket (the latest entry of each, a delete marker too),
// from each stream's leader, again until one whole pass succeeds.
func (o *clusterObserver) snapshot(t *testing.T) storeSnapshot {
	t.Helper()

	var snap storeSnapshot
	testkit.CheckFor(t, 20*time.Second, 50*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		snap = storeSnapshot{}
		for _, bucket := range o.buckets {
			st, err := o.js.Stream(ctx, "KV_"+bucket)
			if err != nil {
				return err
			}
			prefix := "$KV." + bucket + "."
			info, err := st.Info(ctx, jetstream.WithSubjectFilter(prefix+">"))
			if err != nil {
				return err
			}
			rows, err := readLast(ctx, st, slices.Collect(maps.Keys(info.State.Subjects)))
			if err != nil {
				return err
			}
			for subject, row := range rows {
				snap[bucket+" "+strings.TrimPrefix(subject, prefix)] = row
			}
		}
		return nil
	})
	for k, row := range snap {
		if bucket, key, _ := strings.Cut(k, " "); writeOnce(bucket, key) {
			if _, seen := o.once[k]; !seen {
				o.once[k] = row
			}
		}
	}
	return snap
}

// readLast reads the latest message of each subject of st from its leader, eight at a time;
// a delete or purge marker reads as its operation.
func readLast(ctx context.Context, st jetstream.Stream, subjects []string) (map[string]storedRow, error) {
	var (
		mu   sync.Mutex
		rows = map[string]storedRow{}
		errs []error
		wg   sync.WaitGroup
		next = make(chan string)
	)
	for range 8 {
		wg.Go(func() {
			for subject := range next {
				m, err := st.GetLastMsgForSubject(ctx, subject)
				mu.Lock()
				if err != nil {
					errs = append(errs, fmt.Errorf("read %s: %w", subject, err))
				} else {
					row := storedRow{rev: m.Sequence, data: m.Data}
					if op := m.Header.Get("KV-Operation"); op != "" {
						row.data = []byte("<" + op + " marker>")
					}
					rows[subject] = row
				}
				mu.Unlock()
			}
		})
	}
	for _, subject := range subjects {
		next <- subject
	}
	close(next)
	wg.Wait()
	return rows, errors.Join(errs...)
}

// compare checks after against before and counts what it finds. A fence is lost if its key
// is gone, its revision went back, or its content is not what was committed: a gate must hold
// the same bytes (a mint's commit rewrites them) unless a newer registration replaced it; the
// owner's instance list must still list every instance; any other row must hold the same
// bytes. A write-once row is written twice if its revision or bytes changed since first seen.
func (o *clusterObserver) compare(t *testing.T, what string, before, after storeSnapshot) (lost, dups int) {
	t.Helper()
	for k, b := range before {
		bucket, key, _ := strings.Cut(k, " ")
		a, ok := after[k]
		switch {
		case !ok:
			lost++
			t.Errorf("%s: %s %s (revision %d) is gone", what, bucket, key, b.rev)
			continue
		case a.rev < b.rev:
			lost++
			t.Errorf("%s: %s %s went back from revision %d to %d", what, bucket, key, b.rev, a.rev)
			continue
		case writeOnce(bucket, key):
			continue // against its first sighting, below
		case string(a.data) == string(b.data):
			continue
		}
		if why := superseded(bucket, key, b.data, a.data); why != "" {
			lost++
			t.Errorf("%s: %s %s changed from revision %d to %d: %s\nbefore: %s\nafter:  %s", what, bucket, key, b.rev, a.rev, why, b.data, a.data)
		}
	}
	for k, first := range o.once {
		if a, ok := after[k]; ok && (a.rev != first.rev || string(a.data) != string(first.data)) {
			dups++
			bucket, key, _ := strings.Cut(k, " ")
			t.Errorf("%s: write-once %s %s was written again: revision %d, then %d", what, bucket, key, first.rev, a.rev)
			o.once[k] = a
		}
	}
	return lost, dups
}

// check reads the stores, compares them with the last check's reading, and records what it
// found on l's latest event (l nil: the first reading, nothing to compare).
func (o *clusterObserver) check(t *testing.T, what string, l *nodeLossLoad) storeSnapshot {
	t.Helper()
	snap := o.snapshot(t)
	lost, dups := o.compare(t, what, o.last, snap)
	o.last = snap
	if l != nil {
		l.mu.Lock()
		ev := &l.events[len(l.events)-1]
		ev.lost, ev.dups, ev.checked = ev.lost+lost, ev.dups+dups, true
		l.mu.Unlock()
	}
	return snap
}

// superseded says why a row that changed was not merely superseded by a newer write of the
// load ("" if it was): a gate replaced by a newer registration, an instance list or the live
// signers grown.
func superseded(bucket, key string, before, after []byte) string {
	if bucket != subjects.AuthBucket(harness.TestSpace) {
		return "only a fence writer changes a row, and none ran"
	}
	switch {
	case strings.HasPrefix(key, "epgate."):
		b, berr := issue.ParseGate(before)
		a, aerr := issue.ParseGate(after)
		if berr != nil || aerr != nil {
			return fmt.Sprintf("does not parse: %v %v", berr, aerr)
		}
		if a.ProcessEpoch > b.ProcessEpoch && a.RegistrationRevision > b.RegistrationRevision {
			return "" // a re-registration (a prepare the registrar asked again) landed after
		}
		return "the same registration with other content: a committed write was lost or undone"
	case strings.HasPrefix(key, "signers."):
		var b, a struct {
			Live     map[string]int64 `json:"live"`
			IssuedAt int64            `json:"issuedAt"`
		}
		if err := errors.Join(json.Unmarshal(before, &b), json.Unmarshal(after, &a)); err != nil {
			return err.Error()
		}
		for iid := range b.Live {
			if _, ok := a.Live[iid]; !ok {
				return "instance " + iid + " left the live signers, and no end ran"
			}
		}
		if a.IssuedAt < b.IssuedAt {
			return "the signers' issue time went back"
		}
		return "" // first registrations added their instances' keys
	case strings.HasPrefix(key, "budget."):
		return "" // a tenant budget: every spend rewrites it
	case strings.HasPrefix(key, "instances."):
		var b, a struct {
			IDs []string `json:"instanceIds"`
		}
		if err := errors.Join(json.Unmarshal(before, &b), json.Unmarshal(after, &a)); err != nil {
			return err.Error()
		}
		for _, id := range b.IDs {
			if !slices.Contains(a.IDs, id) {
				return "instance " + id + " left the list"
			}
		}
		return ""
	}
	return "only a fence writer changes a row, and none ran"
}

// verify checks the stores once the load has ended, as check does, and that every nkey a
// client received a credential for carries a claim naming its instance.
func (o *clusterObserver) verify(t *testing.T, l *nodeLossLoad) {
	t.Helper()
	snap := o.check(t, "after the load", l)
	for nkey, k := range l.received {
		row, ok := snap[subjects.AuthBucket(harness.TestSpace)+" "+subjects.NKeyClaimKey(nkey)]
		var claim struct {
			InstanceID string `json:"instanceId"`
		}
		if !ok || json.Unmarshal(row.data, &claim) != nil || claim.InstanceID != k.iid {
			t.Errorf("the %s nkey %s a client received: claim %q, want one naming instance %s", k.duty, nkey, row.data, k.iid)
		}
	}
}
