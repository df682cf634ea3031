package gate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/internal/fault"
	"github.com/cotal-ai/authplane/internal/store/storetest"
)

func newMemKV() *storetest.KV { return storetest.New() }

// put writes row at key unconditionally, as another writer would.
func put(t *testing.T, kv *storetest.KV, key string, row Row) {
	t.Helper()
	data, err := json.Marshal(row)
	if err != nil {
		t.Fatal(err)
	}
	kv.Put(key, data)
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
	put(t, kv, "g", openRow())
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
	put(t, kv, "g", openRow())
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
	put(t, kv, "g", openRow())
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
			put(t, kv, "g", openRow())
			g, err := Observe(ctx(t), kv, "g")
			if err != nil {
				t.Fatal(err)
			}
			kv.Fault = storetest.FailOnce(lands)
			if err := Commit(ctx(t), kv, g); err != nil {
				t.Fatalf("got %v, want the commit settled and landed", err)
			}
		})
	}
}

func TestTransitionRecognisesItsOwnWriteAfterAnUnknownOutcome(t *testing.T) {
	kv := newMemKV()
	put(t, kv, "g", openRow())
	g, err := Observe(ctx(t), kv, "g")
	if err != nil {
		t.Fatal(err)
	}
	kv.Fault = storetest.FailOnce(true)
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
	put(t, kv, "g", openRow()) // created by someone else after we observed nothing
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

func TestTransitionRetriesAFirstCreateWhoseUnknownOutcomeDidNotLand(t *testing.T) {
	kv := newMemKV()
	kv.Fault = storetest.FailOnce(false)
	g, err := Transition(ctx(t), kv, "g", nil, openRow())
	if err != nil {
		t.Fatalf("got %v, want the create retried and landed", err)
	}
	if g.Row.ProcessEpoch != 0 || kv.Revision() != 1 {
		t.Fatalf("got epoch %d after %d writes, want one write at epoch 0", g.Row.ProcessEpoch, kv.Revision())
	}
}

func TestFenceWritesStopAtADeleteMarker(t *testing.T) {
	kv := newMemKV()
	put(t, kv, "g", openRow())
	g, err := Observe(ctx(t), kv, "g")
	if err != nil {
		t.Fatal(err)
	}
	kv.Delete("g")
	if _, err := Observe(ctx(t), kv, "g"); fault.CodeOf(err) != fault.FailedPrecondition {
		t.Fatalf("observe: got %v, want failed-precondition", err)
	}
	start := time.Now()
	if err := Commit(ctx(t), kv, g); fault.CodeOf(err) != fault.FailedPrecondition {
		t.Fatalf("commit: got %v, want failed-precondition", err)
	}
	if _, err := Transition(ctx(t), kv, "g", nil, openRow()); fault.CodeOf(err) != fault.FailedPrecondition {
		t.Fatalf("create over the marker: got %v, want failed-precondition", err)
	}
	if time.Since(start) > time.Second {
		t.Fatalf("took %s; a delete marker is final, not something to retry", time.Since(start))
	}
}
