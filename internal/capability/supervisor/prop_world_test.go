package supervisor_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/internal/capability/manager"
	"github.com/cotal-ai/authplane/internal/capability/signers"
	"github.com/cotal-ai/authplane/internal/capability/supervisor"
	"github.com/cotal-ai/authplane/internal/core/audit"
	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/internal/core/store"
	"github.com/cotal-ai/authplane/internal/platform/space"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/subjects"
)

const (
	testSpace  = "default"
	adminOwner = "p_pppppppppppppppppppppppppp"
	adminActor = "admin"
	cliActor   = "cli"
	// opTimeout is every request's deadline. The schedules run in a synctest bubble, so a
	// request that waits out its deadline (an outage, a broker that never confirms) costs no
	// wall time.
	opTimeout = 5 * time.Second
	// slotsPerOwner is how many managers each owner runs at once; a slot takes a new instance
	// when its last one is retired.
	slotsPerOwner = 3
)

// owners are the tenants of every schedule.
var owners = []string{"u_aaaaaaaaaaaaaaaaaaaaaaaaaa", "u_bbbbbbbbbbbbbbbbbbbbbbbbbb"}

var admin = manager.Caller{Owner: adminOwner, Actor: adminActor}

// errCrash is what AfterEndStep answers where a schedule crashes an end.
var errCrash = errors.New("crashed (test hook)")

// config is what a schedule draws once: the quota, the space's capacity in live instances,
// whether the plane holds the operator signing key, whether the broker answers, the standing
// lifetime.
type config struct {
	quota       int
	capacity    int
	signer      bool
	brokerDown  bool
	standingTTL time.Duration
	// newKeys is --new-keys-per-owner (the plane's default, or small enough to be reached).
	newKeys int
}

func (c config) String() string {
	return fmt.Sprintf("quota %d, room for %d live instances, operator signer %v, broker down %v, standing TTL %s, %d new keys per owner",
		c.quota, c.capacity, c.signer, c.brokerDown, c.standingTTL, c.newKeys)
}

// world is one schedule: the stores every replica shares, the replicas, the managers' own
// view of what they were answered, and everything handed out.
type world struct {
	cfg  config
	keys *space.Keys
	sign signers.Signer

	// gates is the fence bucket (gates, run fences, claims, quota rows, the signer set);
	// platform holds the assignments. Both keep every write.
	gates, platform                                *logged
	actors, admissions, statuses, issued, accepted *testkit.KV
	// records is the minted and audit stream.
	records  *testkit.Stream
	broker   *resolver
	proofKey []byte
	account  string // the data account's public key
	own      string // the data account's own signing key
	// instanceKeys derives each instance's signing key, as every replica does.
	instanceKeys *signers.Keys

	pmu    sync.Mutex
	planes []*plane

	mu sync.Mutex
	// slots are the managers' own state; instances maps every instance a schedule named to
	// its owner.
	slots     []*slot
	instances map[string]string
	// assigned is each owner's assignment as its last assign answer said.
	assigned map[string]*lifecycle
	// pending are the lifecycles whose end stopped midway, to be repeated.
	pending []*lifecycle
	// crashAt is the end step after which the next end of an instance stops.
	crashAt map[string]int
	// freezes is the gate revision each instance's end froze it at, as seen after the step.
	freezes  map[string]uint64
	handed   []*handed
	problems []string
	// trace is what each request was answered, in order: what a failure prints.
	trace []string
	// parsed is the checks' own (the schedule's goroutine only).
	parsed parsed
	// pause is how long a mint waits before its first commit, and an end after each step,
	// while a race runs: in the bubble a wait lets every other request run until it waits too,
	// so the racers interleave at those points.
	pause time.Duration
	// faulted is the class of writes a fault is armed on; excused are the instances whose
	// registration may hold a quota slot without a gate until its deadline: its outcome was
	// unknown, or the quota row's writes were failing (its slot could not be given back).
	faulted string
	excused map[string]bool
}

// plane is one replica: its own pipeline, claim memory, commit groups and signer rounds
// over the shared stores.
type plane struct {
	engine *manager.Engine
	sup    *supervisor.Supervisor
}

// slot is one manager as it sees itself: its instance, lifecycle and keys, the proofs it was
// last answered, its runs.
type slot struct {
	owner     string
	m         client.Manager
	prepProof string
	renewal   *client.Renewal
	runs      []*run
	runKeys   []string
}

type run struct {
	id, subject  string
	epoch, token uint64
}

// lifecycle is an assignment: whose, which instance and lifecycle, its revision and end.
type lifecycle struct {
	owner, iid, uid string
	rev             uint64
	expiresAt       int64
}

// handed is one reply that handed credentials out, and what it said they committed at.
type handed struct {
	what            string
	owner, iid, uid string
	epoch           uint64
	ids             client.Identities
	gateRev         uint64
	// until is the assignment end a platform supervisor asked under (0: none).
	until       int64
	runID       string
	hold        client.RunHold
	runFenceRev uint64
	creds       []cred
}

// cred is one credential handed out, as its JWT says: its key, and the key that signed it.
type cred struct {
	duty, key, signer string
	exp, iat          int64
}

// newWorld builds a schedule's stores and replicas. It runs in the schedule's bubble.
func newWorld(keys *space.Keys, cfg config) (*world, error) {
	w := &world{cfg: cfg, keys: keys,
		gates: newLogged(), platform: newLogged(),
		actors: testkit.NewKV(), admissions: testkit.NewKV(), statuses: testkit.NewKV(), issued: testkit.NewKV(), accepted: testkit.NewKV(),
		records:   testkit.NewStream(),
		broker:    &resolver{account: keys.Data.Public(), down: cfg.brokerDown},
		instances: map[string]string{}, assigned: map[string]*lifecycle{}, crashAt: map[string]int{}, freezes: map[string]uint64{},
		excused: map[string]bool{},
	}
	signing := *keys
	if !cfg.signer {
		signing.OperatorSigner = nil
	}
	if cfg.signer {
		w.sign = func(keys []string, held map[string]int64) (string, int64, error) {
			return signing.DataAccountJWT(space.DataPolicy{Signers: keys, Revoked: held})
		}
	}
	w.account = keys.Data.Public()
	var err error
	if w.own, err = keys.Data.Signer.PublicKey(); err != nil {
		return nil, err
	}
	if w.instanceKeys, err = signers.NewKeys(testSpace, w.account, keys.Data.Signer, time.Now); err != nil {
		return nil, err
	}
	if w.proofKey, err = manager.ProofKey(keys.Data.Signer); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	for _, o := range owners {
		if _, err := manager.SetScope(ctx, w.actors, o, cliActor, []string{manager.Supervise}, time.Now()); err != nil {
			return nil, err
		}
		for range slotsPerOwner {
			m, _, err := client.NewManager()
			if err != nil {
				return nil, err
			}
			w.slots = append(w.slots, &slot{owner: o, m: m})
			w.instances[m.InstanceID] = o
		}
	}
	if _, err := manager.SetScope(ctx, w.actors, adminOwner, adminActor, []string{manager.PlatformAdmin}, time.Now()); err != nil {
		return nil, err
	}
	for range 2 {
		p, err := w.newPlane()
		if err != nil {
			return nil, err
		}
		w.planes = append(w.planes, p)
	}
	if cfg.signer && !cfg.brokerDown {
		// A start signs and pushes the data account, as the plane's does.
		if err := w.planes[0].sup.Signers.Repush(ctx, true); err != nil {
			return nil, fmt.Errorf("the start's push of the data account: %w", err)
		}
	}
	return w, nil
}

// newPlane builds a replica as service.buildDoors wires one, its budgets at the plane's
// default flags (but --new-keys-per-owner).
func (w *world) newPlane() (*plane, error) {
	newKeys := w.cfg.newKeys
	if newKeys == 0 {
		newKeys = 10_000
	}
	claims := &issue.Claims{KV: w.gates}
	iss, err := issue.NewIssuer(w.account, w.keys.Data.Signer, time.Now)
	if err != nil {
		return nil, err
	}
	recorder := audit.New(testSpace, w.records, slog.New(slog.DiscardHandler), time.Now)
	engine := &manager.Engine{
		Space: testSpace, Account: w.account,
		Gates: fence.Group(w.gates), Ledger: w.actors, Admissions: w.admissions, Statuses: w.statuses, Witness: witnessAll{},
		Pipeline: &issue.Pipeline{Issuer: iss, Audit: recorder, Claims: claims, Now: time.Now, BeforeCommit: w.wait,
			NewKeys: &issue.KeyBudgets{PerOwner: &issue.StoredBudget{KV: w.gates, Budget: issue.NewKeysOwner,
				PerSecond: float64(newKeys) / store.MintedMaxAge.Seconds(), Burst: newKeys, Now: time.Now},
				Window: store.MintedMaxAge, Limit: newKeys}},
		ProofKey:    w.proofKey,
		StandingTTL: w.cfg.standingTTL, MaxInstancesPerOwner: w.cfg.quota,
		Reregistrations: &manager.Reregistrations{
			PerOwner:       &issue.StoredBudget{KV: w.gates, Budget: issue.ReregistrationsOwner, PerSecond: 600.0 / 3600, Burst: 60, Now: time.Now},
			InstanceHourly: 60, OwnerHourly: 600, Now: time.Now,
		},
	}
	keys, err := signers.NewKeys(testSpace, w.account, w.keys.Data.Signer, time.Now)
	if err != nil {
		return nil, err
	}
	set := &signers.Set{Gates: w.gates, Account: w.account, Keys: keys, Sign: w.sign, Broker: w.broker, Now: time.Now,
		Capacity: w.cfg.capacity, Settle: 2 * (opTimeout + time.Minute)}
	if set.Sign != nil {
		engine.Pipeline.Signers = set
	}
	sup := &supervisor.Supervisor{
		Space: testSpace, Account: w.account,
		Platform: w.platform, Gates: w.gates, Ledger: w.actors, Issued: w.issued, Accepted: w.accepted,
		Engine: engine, Minted: recorder, Claims: claims,
		Signers: set, Audit: recorder, MaxTTL: 24 * time.Hour, Now: time.Now,
		AfterEndStep: w.afterEndStep,
	}
	engine.Assignments = sup
	return &plane{engine: engine, sup: sup}, nil
}

// plane returns replica i.
func (w *world) plane(i int) *plane {
	w.pmu.Lock()
	defer w.pmu.Unlock()
	return w.planes[i%len(w.planes)]
}

// restart replaces replica i with a fresh one: what a crashed replica forgets (claims it knew,
// commit groups, signer rounds) is gone, the stores stay.
func (w *world) restart(i int) {
	p, err := w.newPlane()
	if err != nil {
		w.problem("restarting replica %d: %v", i, err)
		return
	}
	w.pmu.Lock()
	defer w.pmu.Unlock()
	w.planes[i%len(w.planes)] = p
}

// afterEndStep is every replica's AfterEndStep: it notes the gate revision an end froze at,
// and stops an end where the schedule crashes it.
func (w *world) afterEndStep(iid string, step int) error {
	w.wait()
	if step == supervisor.StepFrozen {
		e, err := w.gates.KV.Get(context.Background(), subjects.GateKey(subjects.GateEndpointManager, iid))
		if err == nil {
			if row, err := issue.ParseGate(e.Value); err == nil && row.State == issue.GateFrozen {
				w.mu.Lock()
				if _, ok := w.freezes[iid]; !ok {
					w.freezes[iid] = e.Revision
				}
				w.mu.Unlock()
			}
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.crashAt[iid] == step {
		delete(w.crashAt, iid)
		return errCrash
	}
	return nil
}

// wait waits the pause, if a race set one.
func (w *world) wait() {
	w.mu.Lock()
	d := w.pause
	w.mu.Unlock()
	if d > 0 {
		time.Sleep(d)
	}
}

// problem notes an invariant or expectation broken while operations ran (on any goroutine).
func (w *world) problem(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.problems = append(w.problems, fmt.Sprintf(format, args...))
}

// fatal fails the schedule with every problem noted, if any.
func (w *world) fatal(t failer) {
	w.mu.Lock()
	problems := w.problems
	w.problems = nil
	w.mu.Unlock()
	if len(problems) > 0 {
		t.Fatalf("%s\n(%s)\n%s", strings.Join(problems, "\n"), w.cfg, w.traced())
	}
}

// note adds a line to the trace.
func (w *world) note(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.trace = append(w.trace, fmt.Sprintf(format, args...))
}

// traced is the trace, for a failure.
func (w *world) traced() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return "what the requests were answered:\n  " + strings.Join(w.trace, "\n  ")
}

// failer fails a test.
type failer interface {
	Fatalf(format string, args ...any)
}

// envelope is a request's envelope about m from actor, carrying r past prepare.
func envelope(kind, actor string, m client.Manager, r *client.Renewal) client.Envelope {
	identities := m.Identities
	env := client.Envelope{V: 1, Kind: kind, Space: testSpace, Actor: actor, InstanceID: m.InstanceID,
		ManagerLifecycleUID: m.LifecycleUID, RequestID: subjects.NewRequestID(), Identities: &identities}
	if r != nil {
		proof, account, epoch := r.Proof, r.Account, r.Epoch
		env.RegistrationProof, env.AccountPublicKey, env.ProcessEpoch = &proof, &account, &epoch
	}
	return env
}

func mustJSON(v any) []byte {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return data
}

func opContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), opTimeout)
}

// authority sends a manager-service-authority body from caller, or, with lc set, the same
// body under lc's assignment as the platform supervisor.
func (w *world) authority(p *plane, caller manager.Caller, body client.ServiceAuthority, lc *lifecycle) (*client.Material, error) {
	ctx, cancel := opContext()
	defer cancel()
	if lc != nil {
		data := mustJSON(client.SupervisorAuthority{V: 1, Kind: client.KindSupervisorAuthority, Owner: lc.owner, AssignmentRevision: lc.rev, Request: body})
		m, _, err := p.sup.Authority(ctx, admin, audit.Request{Endpoint: subjects.EndpointSupervisorAuthority, Caller: admin.String()}, data)
		return m, err
	}
	reply, _, err := p.engine.ServiceAuthority(ctx, caller, audit.Request{Endpoint: subjects.EndpointManagerAuthority, Caller: caller.String()}, mustJSON(body))
	if err != nil {
		return nil, err
	}
	return reply.(*client.Material), nil
}

// handOut notes the credentials of a reply: what each JWT says (its key, expiry, issue time).
func (w *world) handOut(h *handed, creds map[string]client.Credential) {
	for duty, c := range creds {
		uc, err := jwt.DecodeUserClaims(c.JWT)
		if err != nil {
			w.problem("%s of %s: the %s credential does not decode: %v", h.what, h.iid, duty, err)
			continue
		}
		if uc.Expires != c.Exp {
			w.problem("%s of %s: the %s credential expires at %d, its reply says %d", h.what, h.iid, duty, uc.Expires, c.Exp)
		}
		h.creds = append(h.creds, cred{duty: duty, key: uc.Subject, exp: uc.Expires, iat: uc.IssuedAt, signer: uc.Issuer})
	}
	w.mu.Lock()
	w.handed = append(w.handed, h)
	w.mu.Unlock()
}

func (w *world) handOutMaterial(what, owner string, identities client.Identities, m *client.Material, until int64) {
	w.handOut(&handed{what: what, owner: owner, iid: m.InstanceID, uid: m.ManagerLifecycleUID, epoch: m.ProcessEpoch,
		ids: identities, gateRev: m.GateRevision, until: until}, m.Credentials)
}

// holder reads the claim on nkey from the fence bucket: the instance id, "" if none.
func (w *world) holder(nkey string) string {
	e, err := w.gates.KV.Get(context.Background(), subjects.NKeyClaimKey(nkey))
	if err != nil {
		return ""
	}
	var c struct {
		InstanceID string `json:"instanceId"`
	}
	if json.Unmarshal(e.Value, &c) != nil {
		return "?"
	}
	return c.InstanceID
}

// mintedCount counts the minted records filed under instance iid that name nkey.
func (w *world) mintedCount(iid, nkey string) int {
	n := 0
	filter := subjects.MintedInstanceFilter(testSpace, iid)
	for _, m := range w.records.Msgs() {
		var rec audit.Minted
		if testkit.Matches(filter, m.Subject) && json.Unmarshal(m.Data, &rec) == nil && slices.ContainsFunc(rec.Credentials, func(c audit.Credential) bool { return c.NKey == nkey }) {
			n++
		}
	}
	return n
}

// foreign is a key another instance claimed before a request named it: the request must be
// refused, mint nothing for the key and leave its claim as it was.
type foreign struct {
	key, field, holder string
	before             int
}

// expectForeign notes key, named by field of a request for instance iid, if another instance
// claimed it already.
func (w *world) expectForeign(iid, key, field string) *foreign {
	h := w.holder(key)
	if h == "" || h == iid {
		return nil
	}
	return &foreign{key: key, field: field, holder: h, before: w.mintedCount(iid, key)}
}

// checkForeign checks a request that named f's key for iid and was answered err.
func (w *world) checkForeign(what, iid string, f *foreign, err error) {
	if f == nil {
		return
	}
	count("a key another instance claimed was named")
	if err == nil {
		w.problem("%s of %s named %s (%s), claimed by %s, and was answered", what, iid, f.key, f.field, f.holder)
	} else if fault.CodeOf(err) == fault.AlreadyExists {
		count("a key another instance claimed was refused already-exists")
		if !strings.Contains(err.Error(), f.field) && !strings.Contains(err.Error(), "belongs to another manager instance") {
			w.problem("%s of %s: the refusal %q does not say which key", what, iid, err)
		}
	}
	if n := w.mintedCount(iid, f.key); n != f.before {
		w.problem("%s of %s named %s, claimed by %s: %d minted records of it under %s, %d before", what, iid, f.key, f.holder, n, iid, f.before)
	}
	if h := w.holder(f.key); h != f.holder {
		w.problem("%s of %s named %s: its claim moved from %s to %s", what, iid, f.key, f.holder, h)
	}
}

// count counts an event for the coverage the test reports.
func count(what string) {
	coverage.mu.Lock()
	defer coverage.mu.Unlock()
	coverage.n[what]++
}

var coverage = struct {
	mu sync.Mutex
	n  map[string]int
}{n: map[string]int{}}

// failer is what a check needs of its test: a *rapid.T, or a *testing.T in a fixed schedule.
var _ failer = (*testing.T)(nil)
