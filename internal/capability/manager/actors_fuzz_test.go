package manager

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/subjects"
)

// FuzzActorRow checks the ledger row's decoder (the parse ActorOf gives the fence) on any stored bytes,
// read as ReadActor reads it: a row that does not parse is ErrMalformed and the zero row, not
// found; a row that parses is a version 1 row of this principal, and written back as the fence
// writes it (marshalled) it parses again to the same bytes.
func FuzzActorRow(f *testing.F) {
	for _, row := range []ActorRow{
		{V: 1, Owner: owner, Actor: "cli", Scope: []string{Admin, Supervise}, GrantedAt: 1000},
		{V: 1, Owner: owner, Actor: "cli", Scope: []string{}, LifecycleUID: "l", GrantedAt: 1},
		{V: 1, Owner: owner, Actor: "cli", Scope: []string{}, GrantedAt: 1, TokenHash: strings.Repeat("0", 64)},
	} {
		data, err := json.Marshal(row)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	// TestAMalformedRowGrantsNothing's rows, and a null scope.
	for _, raw := range []string{`{"v":1,"owner":"` + owner + `","actor":"other","scope":["supervise"],"grantedAt":1}`, `{"v":2}`, `not json`,
		`{"v":1,"owner":"` + owner + `","actor":"cli","scope":null,"grantedAt":1}`} {
		f.Add([]byte(raw))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		kv := testkit.NewKV()
		kv.Put(subjects.ActorKey(owner, "cli"), data)
		row, found, err := ReadActor(ctx(t), kv, owner, "cli")
		if err != nil {
			if !errors.Is(err, ErrMalformed) || found || !reflect.DeepEqual(row, ActorRow{}) {
				t.Fatalf("a row that does not parse: got %+v, found %v, %v; want ErrMalformed and no row", row, found, err)
			}
			return
		}
		if !found || row.V != 1 || row.Owner != owner || row.Actor != "cli" {
			t.Fatalf("accepted %+v (found %v) from %q", row, found, fault.Clip(string(data), 200))
		}
		written, err := json.Marshal(row)
		if err != nil {
			t.Fatal(err)
		}
		kv.Put(subjects.ActorKey(owner, "cli"), written)
		back, _, err := ReadActor(ctx(t), kv, owner, "cli")
		if err != nil {
			t.Fatalf("the row %q, written back as %s, does not parse: %v", fault.Clip(string(data), 200), written, err)
		}
		if again, err := json.Marshal(back); err != nil || !bytes.Equal(again, written) {
			t.Fatalf("round trip: got %s, %v; want %s", again, err, written)
		}
	})
}
