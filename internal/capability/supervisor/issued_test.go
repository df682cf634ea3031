package supervisor

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/internal/core/store"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/subjects"
)

const (
	testOwner = "u_aaaaaaaaaaaaaaaaaaaaaaaaaa"
	testIID   = "iiiiiiiiiiiiiiiiiiiiiiiiii"
	testUID   = "llllllllllllllllllllllllll"
	testKey   = "UAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
)

// env is a supervisor on in-memory buckets, with a clock a test can move.
type env struct {
	s        *Supervisor
	issued   *testkit.KV
	accepted *testkit.KV
	mu       sync.Mutex
	now      time.Time
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{issued: testkit.NewKV(), accepted: testkit.NewKV(), now: time.Unix(1_800_000_000, 0)}
	e.s = &Supervisor{Space: "default", Issued: e.issued, Accepted: e.accepted, Now: e.clock}
	return e
}

func (e *env) clock() time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.now
}

func (e *env) advance(d time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.now = e.now.Add(d)
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	t.Cleanup(cancel)
	return c
}

// ceiling is a generation's ceiling ending an hour after the env's start.
func (e *env) ceiling() Ceiling {
	return Ceiling{Key: testKey, ExpiresAt: e.clock().Add(time.Hour).Unix(), Permissions: Permissions{
		Publish:   Rules{Allow: Allow{Mode: "patterns", Patterns: []string{"cotal.default.auth.*.o.a"}}, Deny: []string{}},
		Subscribe: Rules{Allow: Allow{Mode: "patterns", Patterns: []string{"_INBOX.o.a.>"}}, Deny: []string{}},
	}}
}

func ref(gen string) Ref {
	return Ref{Space: "default", Owner: testOwner, Actor: subjects.SupervisorActor(testIID), UID: testUID, Generation: gen}
}

// released stages and releases generation gen.
func (e *env) released(t *testing.T, gen string) Ref {
	t.Helper()
	r := ref(gen)
	staged, err := e.s.stageEvidence(ctx(t), Evidence{Ref: r, Ceiling: e.ceiling()})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.s.Release(ctx(t), r, staged); err != nil {
		t.Fatal(err)
	}
	return r
}

func wantDenied(t *testing.T, what string, err error, text string) {
	t.Helper()
	if fault.CodeOf(err) != fault.PermissionDenied || !strings.Contains(err.Error(), text) {
		t.Fatalf("%s: got %v, want permission-denied saying %q", what, err, text)
	}
}

func TestAStagedGenerationResolvesOnlyOnceReleased(t *testing.T) {
	e := newEnv(t)
	r := ref("g1")
	staged, err := e.s.stageEvidence(ctx(t), Evidence{Ref: r, Ceiling: e.ceiling()})
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.s.resolve(ctx(t), r)
	wantDenied(t, "staged", err, "it is prepared")
	if err := e.s.Release(ctx(t), r, staged); err != nil {
		t.Fatal(err)
	}
	ev, err := e.s.resolve(ctx(t), r)
	if err != nil || ev.Ref != r || ev.Key != testKey {
		t.Fatalf("released: got %+v, %v; want the evidence", ev, err)
	}
	if _, err := e.s.stageEvidence(ctx(t), Evidence{Ref: r, Ceiling: e.ceiling()}); fault.CodeOf(err) != fault.Conflict {
		t.Fatalf("staging the generation again: got %v, want conflict", err)
	}
}

func TestResolveRefusesAGenerationThatIsNotActive(t *testing.T) {
	e := newEnv(t)
	_, err := e.s.resolve(ctx(t), ref("never"))
	wantDenied(t, "never staged", err, "no evidence")

	r := e.released(t, "g1")
	if err := e.s.Retire(ctx(t), r); err != nil {
		t.Fatal(err)
	}
	_, err = e.s.resolve(ctx(t), r)
	wantDenied(t, "retired", err, "it is revoked")
}

func TestResolveRefusesAnExpiredGeneration(t *testing.T) {
	e := newEnv(t)
	r := e.released(t, "g1")
	e.advance(time.Hour)
	_, err := e.s.resolve(ctx(t), r)
	wantDenied(t, "at its end", err, "it expired")
}

// movingKV rewrites key with the bytes it holds right after the first read of it: the row
// moves between a resolve's two reads.
type movingKV struct {
	*testkit.KV
	key   string
	moved bool
}

func (m *movingKV) Get(ctx context.Context, key string) (store.Entry, error) {
	e, err := m.KV.Get(ctx, key)
	if key == m.key && !m.moved && err == nil {
		m.moved = true
		m.Put(key, e.Value)
	}
	return e, err
}

func TestResolveRefusesAGenerationThatMovesBetweenItsTwoReads(t *testing.T) {
	e := newEnv(t)
	r := e.released(t, "g1")
	e.s.Issued = &movingKV{KV: e.issued, key: subjects.AttemptKey(r.key())}
	_, err := e.s.resolve(ctx(t), r)
	wantDenied(t, "moved", err, "it moved while it was read")
	if _, err := e.s.resolve(ctx(t), r); err != nil {
		t.Fatalf("read again, unmoved: got %v, want it resolved", err)
	}
}

func TestConfirmRefusesADifferentCeiling(t *testing.T) {
	e := newEnv(t)
	r := e.released(t, "g1")
	ev, err := e.s.resolve(ctx(t), r)
	if err != nil {
		t.Fatal(err)
	}
	if err := confirmCeiling(ev, e.ceiling()); err != nil {
		t.Fatalf("the same ceiling: got %v", err)
	}
	for name, edit := range map[string]func(*Ceiling){
		"another key": func(c *Ceiling) { c.Key = "UBBB" + c.Key[4:] },
		"a later end": func(c *Ceiling) { c.ExpiresAt++ },
		"a wider publish": func(c *Ceiling) {
			c.Permissions.Publish.Allow.Patterns = append(c.Permissions.Publish.Allow.Patterns, ">")
		},
		"publish to anything": func(c *Ceiling) { c.Permissions.Publish.Allow = Allow{Mode: "all"} },
	} {
		c := e.ceiling()
		edit(&c)
		if err := confirmCeiling(ev, c); fault.CodeOf(err) != fault.FailedPrecondition || !strings.Contains(err.Error(), "different ceiling") {
			t.Errorf("%s: got %v, want failed-precondition: different ceiling", name, err)
		}
	}
}

func TestRetireIsIdempotentAndFinal(t *testing.T) {
	e := newEnv(t)
	attemptState := func(r Ref) string {
		t.Helper()
		got, err := e.issued.Get(ctx(t), subjects.AttemptKey(r.key()))
		if err != nil {
			t.Fatal(err)
		}
		var a attempt
		if err := json.Unmarshal(got.Value, &a); err != nil {
			t.Fatal(err)
		}
		return a.State
	}
	active := e.released(t, "active")
	staged := ref("staged")
	if _, err := e.s.stageEvidence(ctx(t), Evidence{Ref: staged, Ceiling: e.ceiling()}); err != nil {
		t.Fatal(err)
	}
	absent := ref("absent")
	for _, tt := range []struct {
		r    Ref
		want string
	}{{active, Revoked}, {staged, Aborted}, {absent, Revoked}} {
		if err := e.s.Retire(ctx(t), tt.r); err != nil {
			t.Fatalf("retire %s: %v", tt.r.Generation, err)
		}
		before := e.issued.Revision()
		if err := e.s.Retire(ctx(t), tt.r); err != nil {
			t.Fatalf("retire %s again: %v", tt.r.Generation, err)
		}
		if e.issued.Revision() != before {
			t.Errorf("retire %s again wrote; want a repeat to be a no-op", tt.r.Generation)
		}
		if got := attemptState(tt.r); got != tt.want {
			t.Errorf("%s after retire: got %s, want %s", tt.r.Generation, got, tt.want)
		}
	}
	// A retired generation is never released: not a staged one, not one never staged.
	if _, err := e.s.stageEvidence(ctx(t), Evidence{Ref: absent, Ceiling: e.ceiling()}); fault.CodeOf(err) != fault.Conflict {
		t.Fatalf("staging a generation retired before it was staged: got %v, want conflict", err)
	}
}

// racingKV accepts a competitor's generation under key just before this writer's create.
type racingKV struct {
	*testkit.KV
	key    string
	winner []byte
}

func (r *racingKV) Create(ctx context.Context, key string, value []byte) (uint64, error) {
	if key == r.key && r.winner != nil {
		r.Put(key, r.winner)
		r.winner = nil
	}
	return r.KV.Create(ctx, key, value)
}

func TestTheLoserOfAConcurrentFirstIssuanceRetiresItsOwnGenerationAndConfirmsTheWinners(t *testing.T) {
	e := newEnv(t)
	won := e.released(t, "winner")
	row, err := json.Marshal(accepted{Version: 1, Ref: won})
	if err != nil {
		t.Fatal(err)
	}
	l := lifecycle{testOwner, testIID, testUID}
	key := subjects.AcceptedKey(AcceptedToken(testOwner, testIID, testUID, subjects.DutySupervisor))
	e.s.Accepted = &racingKV{KV: e.accepted, key: key, winner: row}
	issued := &creating{KV: e.issued}
	e.s.Issued = issued

	if err := e.s.record(ctx(t), l, subjects.DutySupervisor, e.ceiling()); err != nil {
		t.Fatalf("the loser: got %v, want it to confirm the winner's generation", err)
	}
	o, err := e.s.generation(ctx(t), l, subjects.DutySupervisor)
	if err != nil || o.Row.Ref != won {
		t.Fatalf("accepted: got %+v, %v; want the winner's", o, err)
	}
	// The loser's own generation was staged and released, then retired.
	if len(issued.created) != 1 {
		t.Fatalf("the loser staged %v, want one generation", issued.created)
	}
	parts := strings.Split(issued.created[0], ".")
	_, err = e.s.resolve(ctx(t), ref(parts[len(parts)-1]))
	wantDenied(t, "the loser's own generation", err, "it is revoked")
	// And the accepted row is written once: a second record only confirms.
	before := e.accepted.Revision()
	if err := e.s.record(ctx(t), l, subjects.DutySupervisor, e.ceiling()); err != nil || e.accepted.Revision() != before {
		t.Fatalf("a later issuance: got %v and accepted revision %d → %d, want a confirm that writes nothing", err, before, e.accepted.Revision())
	}
}

// creating records the evidence keys created through it.
type creating struct {
	*testkit.KV
	mu      sync.Mutex
	created []string
}

func (c *creating) Create(ctx context.Context, key string, value []byte) (uint64, error) {
	if strings.HasPrefix(key, "v1.") {
		c.mu.Lock()
		c.created = append(c.created, key)
		c.mu.Unlock()
	}
	return c.KV.Create(ctx, key, value)
}

var _, _, _ fence.KV = (*movingKV)(nil), (*racingKV)(nil), (*creating)(nil)
