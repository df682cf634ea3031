package issue

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/subjects"
)

func openRow() GateRow {
	return GateRow{State: GateOpen, Generation: 1, RegistrationRevision: 1, Principal: "u_x.manager_serve_x", Nonce: subjects.NewNonce()}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestEveryGateWriteGetsAFreshNonceSoAStaleCommitCannotLand(t *testing.T) {
	g := GateOf(testkit.NewKV(), subjects.GateEndpointManager, "i")
	absent, err := g.Observe(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	a, err := absent.Write(ctx(t), openRow())
	if err != nil {
		t.Fatal(err)
	}
	b, err := a.Write(ctx(t), a.Row)
	if err != nil {
		t.Fatal(err)
	}
	if a.Row.Nonce == b.Row.Nonce || string(a.Raw) == string(b.Raw) {
		t.Fatal("two fence writes of the same row produced the same bytes; a stale commit could land between them")
	}
	if _, err := a.Commit(ctx(t)); !errors.Is(err, fence.ErrMoved) {
		t.Fatalf("a commit observed before the second write: got %v, want fence.ErrMoved", err)
	}
	if b.Key() != subjects.GateKey(subjects.GateEndpointManager, "i") {
		t.Fatalf("got key %s", b.Key())
	}
}

func TestParseRefusesRowsThatBreakTheSchema(t *testing.T) {
	ok := openRow()
	cases := map[string]func(r *GateRow){
		"unknown state":          func(r *GateRow) { r.State = "paused" },
		"open with an op":        func(r *GateRow) { r.Op = &GateOp{OpID: "x", Kind: OpRetirement} },
		"frozen without an op":   func(r *GateRow) { r.State = GateFrozen },
		"retired without an op":  func(r *GateRow) { r.State = GateRetired },
		"no nonce":               func(r *GateRow) { r.Nonce = "" },
		"principal of one token": func(r *GateRow) { r.Principal = "nobody" },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			r := ok
			mutate(&r)
			data, err := json.Marshal(r)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := ParseGate(data); err == nil {
				t.Fatalf("got a parsed row, want a refusal for %s", name)
			}
		})
	}
	if _, err := ParseGate([]byte(`{"state":"open","generation":1,"processEpoch":0,"registrationRevision":1,"nameAuthorityRevision":0,"principal":"a.b","nonce":"n","extra":1}`)); err == nil {
		t.Fatal("got a parsed row with an unknown field, want a refusal")
	}
	data, err := json.Marshal(ok)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := ParseGate(data); err != nil || got != ok {
		t.Fatalf("a good row: got %+v, %v", got, err)
	}
}
