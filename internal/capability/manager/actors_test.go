package manager

import (
	"encoding/json"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/subjects"
)

const owner = "u_aaaaaaaaaaaaaaaaaaaaaaaaaa"

func TestSetScopeWritesExactlyTheScopeAndReadReadsIt(t *testing.T) {
	kv := testkit.NewKV()
	if _, found, err := ReadActor(ctx(t), kv, owner, "cli"); err != nil || found {
		t.Fatalf("no row yet: got found %v, %v", found, err)
	}
	row, err := SetScope(ctx(t), kv, owner, "cli", []string{Admin, Supervise, Admin}, time.UnixMilli(1000))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(row.Scope, []string{Admin, Supervise}) || row.GrantedAt != 1000 {
		t.Fatalf("got %+v, want the scope sorted without repeats and the time", row)
	}
	got, found, err := ReadActor(ctx(t), kv, owner, "cli")
	if err != nil || !found || !got.Has(Supervise) || got.Has(PlatformAdmin) {
		t.Fatalf("got %+v %v %v, want the row written", got, found, err)
	}
	// Clearing leaves a row with no scope, not a null that reads as malformed.
	if _, err := SetScope(ctx(t), kv, owner, "cli", nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	if got, found, err := ReadActor(ctx(t), kv, owner, "cli"); err != nil || !found || len(got.Scope) != 0 {
		t.Fatalf("cleared: got %+v %v %v, want a row with no scope", got, found, err)
	}
}

func TestSetScopeKeepsTheLifecycleAndRefusesWhatItCannotWrite(t *testing.T) {
	kv := testkit.NewKV()
	data, err := json.Marshal(ActorRow{V: 1, Owner: owner, Actor: "cli", Scope: []string{}, LifecycleUID: "l", GrantedAt: 1})
	if err != nil {
		t.Fatal(err)
	}
	kv.Put(subjects.ActorKey(owner, "cli"), data)
	row, err := SetScope(ctx(t), kv, owner, "cli", []string{Supervise}, time.Now())
	if err != nil || row.LifecycleUID != "l" {
		t.Fatalf("got %+v, %v; want the lifecycle kept", row, err)
	}
	for name, c := range map[string]struct {
		owner, actor string
		scope        []string
	}{
		"an unknown scope": {owner, "cli", []string{"root"}},
		"a bad owner":      {"x_y", "cli", nil},
		"a bad actor":      {owner, "a.b", nil},
	} {
		before := kv.Revision()
		if _, err := SetScope(ctx(t), kv, c.owner, c.actor, c.scope, time.Now()); err == nil || kv.Revision() != before {
			t.Errorf("%s: got %v with %d writes, want a refusal and none", name, err, kv.Revision()-before)
		}
	}
	kv.Delete(subjects.ActorKey(owner, "cli"))
	if _, found, err := ReadActor(ctx(t), kv, owner, "cli"); err != nil || found {
		t.Fatalf("a marker: got found %v, %v; want no scope", found, err)
	}
	if _, err := SetScope(ctx(t), kv, owner, "cli", []string{Supervise}, time.Now()); !errors.Is(err, fence.ErrGone) {
		t.Fatalf("over a marker: got %v, want fence.ErrGone", err)
	}
}

func TestAMalformedRowGrantsNothing(t *testing.T) {
	kv := testkit.NewKV()
	for _, raw := range []string{`{"v":1,"owner":"` + owner + `","actor":"other","scope":["supervise"],"grantedAt":1}`, `{"v":2}`, `not json`} {
		kv.Put(subjects.ActorKey(owner, "cli"), []byte(raw))
		if _, _, err := ReadActor(ctx(t), kv, owner, "cli"); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: got %v, want ErrMalformed", raw, err)
		}
	}
}

func TestConcurrentSetScopesAllLandOneAfterAnother(t *testing.T) {
	kv := testkit.NewKV()
	scopes := [][]string{{Supervise}, {Admin}, {PlatformAdmin}, {Supervise, Admin}}
	var wg sync.WaitGroup
	for _, s := range scopes {
		wg.Go(func() {
			if _, err := SetScope(ctx(t), kv, owner, "cli", s, time.Now()); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if kv.Revision() != uint64(len(scopes)) {
		t.Fatalf("got %d writes, want %d: every write lands once", kv.Revision(), len(scopes))
	}
}

func TestSetScopeSettlesAnUnknownOutcome(t *testing.T) {
	kv := testkit.NewKV()
	kv.Fault = testkit.FailOnce(true)
	if _, err := SetScope(ctx(t), kv, owner, "cli", []string{Supervise}, time.Now()); err != nil {
		t.Fatalf("got %v, want the write settled as landed", err)
	}
	if kv.Revision() != 1 {
		t.Fatalf("got %d writes, want one", kv.Revision())
	}
}

// A revoke (an empty secret) of a principal that holds no agent secret writes nothing and says
// so: no row, a row that was never an agent's, an agent revoked already.
func TestRevokingNoAgentSecretWritesNothing(t *testing.T) {
	kv := testkit.NewKV()
	if _, err := SetScope(ctx(t), kv, owner, "scoped", []string{Supervise}, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := SetAgentSecret(ctx(t), kv, owner, "agent", "abc", time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := SetAgentSecret(ctx(t), kv, owner, "agent", "", time.Now()); err != nil {
		t.Fatalf("revoking an agent: %v", err)
	}
	for _, actor := range []string{"nobody", "scoped", "agent"} {
		before, _, _ := ReadActor(ctx(t), kv, owner, actor)
		if _, err := SetAgentSecret(ctx(t), kv, owner, actor, "", time.Now()); !errors.Is(err, ErrNoAgentSecret) {
			t.Errorf("revoking %s: got %v, want ErrNoAgentSecret", actor, err)
		}
		if after, _, _ := ReadActor(ctx(t), kv, owner, actor); after.GrantedAt != before.GrantedAt {
			t.Errorf("revoking %s wrote its row: %+v, want %+v", actor, after, before)
		}
	}
}
