package gate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/internal/store"
)

// memKV is an in-memory bucket with the KV verbs' semantics, and fault injection: before each
// write, fault may return an error to report instead, and say whether the write still lands
// (an unknown outcome that did happen).
type memKV struct {
	mu    sync.Mutex
	rev   uint64
	vals  map[string]store.Entry
	fault func(key string) (err error, lands bool)
}

func newMemKV() *memKV { return &memKV{vals: map[string]store.Entry{}} }

func (m *memKV) Get(_ context.Context, key string) (store.Entry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.vals[key]
	if !ok {
		return store.Entry{}, store.ErrNotFound
	}
	return e, nil
}

func (m *memKV) Create(ctx context.Context, key string, value []byte) (uint64, error) {
	return m.Update(ctx, key, value, 0)
}

func (m *memKV) Update(_ context.Context, key string, value []byte, rev uint64) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var injected error
	lands := true
	if m.fault != nil {
		injected, lands = m.fault(key)
	}
	if cur := m.vals[key].Revision; cur != rev {
		if injected != nil {
			return 0, injected
		}
		return 0, fmt.Errorf("update %s: %w", key, store.ErrCASLost)
	}
	if lands {
		m.rev++
		m.vals[key] = store.Entry{Value: append([]byte(nil), value...), Revision: m.rev}
	}
	if injected != nil {
		return 0, injected
	}
	return m.rev, nil
}

// put writes key unconditionally, as another writer would.
func (m *memKV) put(t *testing.T, key string, row Row) {
	t.Helper()
	data, err := json.Marshal(row)
	if err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.rev++
	m.vals[key] = store.Entry{Value: data, Revision: m.rev}
}

func openRow() Row {
	return Row{State: Open, Generation: 1, RegistrationRevision: 1, Principal: "u_x.manager_serve_x", Nonce: NewNonce()}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestCommitLandsOnAnUnchangedGate(t *testing.T) {
	kv := newMemKV()
	kv.put(t, "g", openRow())
	g, err := Observe(ctx(t), kv, "g")
	if err != nil {
		t.Fatal(err)
	}
	if err := Commit(ctx(t), kv, g); err != nil {
		t.Fatalf("got %v, want the commit to land", err)
	}
	now, err := Observe(ctx(t), kv, "g")
	if err != nil {
		t.Fatal(err)
	}
	if now.Revision == g.Revision || string(now.Raw) != string(g.Raw) {
		t.Fatalf("got revision %d bytes %s, want a new revision with the bytes as read", now.Revision, now.Raw)
	}
}

func TestCommitRetriesWhenAnotherMintRewroteTheSameBytes(t *testing.T) {
	kv := newMemKV()
	kv.put(t, "g", openRow())
	g, err := Observe(ctx(t), kv, "g")
	if err != nil {
		t.Fatal(err)
	}
	// Another mint commits first: same bytes, new revision.
	if err := Commit(ctx(t), kv, g); err != nil {
		t.Fatal(err)
	}
	if err := Commit(ctx(t), kv, g); err != nil {
		t.Fatalf("got %v, want a retry at the new revision to land", err)
	}
}

func TestCommitIsRefusedOnceAFenceWriterChangedTheGate(t *testing.T) {
	kv := newMemKV()
	kv.put(t, "g", openRow())
	g, err := Observe(ctx(t), kv, "g")
	if err != nil {
		t.Fatal(err)
	}
	frozen := g.Row
	frozen.State, frozen.Op = Frozen, &Op{OpID: "op", Kind: OpRetirement}
	if _, err := Transition(ctx(t), kv, "g", g, frozen); err != nil {
		t.Fatal(err)
	}
	if err := Commit(ctx(t), kv, g); !errors.Is(err, ErrMoved) {
		t.Fatalf("got %v, want ErrMoved", err)
	}
}

func TestCommitSettlesAnUnknownOutcomeByRereading(t *testing.T) {
	for _, lands := range []bool{true, false} {
		t.Run(fmt.Sprintf("write landed %v", lands), func(t *testing.T) {
			kv := newMemKV()
			kv.put(t, "g", openRow())
			g, err := Observe(ctx(t), kv, "g")
			if err != nil {
				t.Fatal(err)
			}
			faults := 1
			kv.fault = func(string) (error, bool) {
				if faults == 0 {
					return nil, true
				}
				faults--
				return fmt.Errorf("timeout: %w", store.ErrUnknownOutcome), lands
			}
			if err := Commit(ctx(t), kv, g); err != nil {
				t.Fatalf("got %v, want the commit settled and landed", err)
			}
		})
	}
}

func TestTransitionRecognisesItsOwnWriteAfterAnUnknownOutcome(t *testing.T) {
	kv := newMemKV()
	kv.put(t, "g", openRow())
	g, err := Observe(ctx(t), kv, "g")
	if err != nil {
		t.Fatal(err)
	}
	faults := 1
	kv.fault = func(string) (error, bool) {
		if faults == 0 {
			return nil, true
		}
		faults--
		return fmt.Errorf("leader changed: %w", store.ErrUnknownOutcome), true // it did land
	}
	next := g.Row
	next.ProcessEpoch++
	ng, err := Transition(ctx(t), kv, "g", g, next)
	if err != nil {
		t.Fatalf("got %v, want the transition recognised as landed", err)
	}
	if ng.Row.ProcessEpoch != 1 {
		t.Fatalf("got epoch %d, want 1", ng.Row.ProcessEpoch)
	}
	now, err := Observe(ctx(t), kv, "g")
	if err != nil {
		t.Fatal(err)
	}
	if now.Revision != ng.Revision || now.Row.Nonce != ng.Row.Nonce {
		t.Fatalf("got revision %d nonce %s, want exactly one write (%d, %s)", now.Revision, now.Row.Nonce, ng.Revision, ng.Row.Nonce)
	}
}

func TestTransitionFromAbsentLosesToAConcurrentCreate(t *testing.T) {
	kv := newMemKV()
	kv.put(t, "g", openRow()) // created by someone else after we observed nothing
	if _, err := Transition(ctx(t), kv, "g", nil, openRow()); !errors.Is(err, ErrMoved) {
		t.Fatalf("got %v, want ErrMoved", err)
	}
}

func TestTransitionGetsFreshNonces(t *testing.T) {
	kv := newMemKV()
	a, err := Transition(ctx(t), kv, "g", nil, openRow())
	if err != nil {
		t.Fatal(err)
	}
	b, err := Transition(ctx(t), kv, "g", a, a.Row)
	if err != nil {
		t.Fatal(err)
	}
	if a.Row.Nonce == b.Row.Nonce || string(a.Raw) == string(b.Raw) {
		t.Fatal("two fence writes of the same row produced the same bytes; a stale commit could land between them")
	}
}

func TestParseRefusesRowsThatBreakTheSchema(t *testing.T) {
	ok := openRow()
	cases := map[string]func(r *Row){
		"unknown state":          func(r *Row) { r.State = "paused" },
		"open with an op":        func(r *Row) { r.Op = &Op{OpID: "x", Kind: OpRetirement} },
		"frozen without an op":   func(r *Row) { r.State = Frozen },
		"retired without an op":  func(r *Row) { r.State = Retired },
		"no nonce":               func(r *Row) { r.Nonce = "" },
		"principal of one token": func(r *Row) { r.Principal = "nobody" },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			r := ok
			mutate(&r)
			data, err := json.Marshal(r)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := Parse(data); err == nil {
				t.Fatalf("got a parsed row, want a refusal for %s", name)
			}
		})
	}
	if _, err := Parse([]byte(`{"state":"open","generation":1,"processEpoch":0,"registrationRevision":1,"nameAuthorityRevision":0,"principal":"a.b","nonce":"n","extra":1}`)); err == nil {
		t.Fatal("got a parsed row with an unknown field, want a refusal")
	}
}
