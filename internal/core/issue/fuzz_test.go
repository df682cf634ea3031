package issue

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/cotal-ai/authplane/internal/core/fault"
)

// FuzzParseGate checks the gate row's decoder (the parse GateOf gives the fence) on any stored bytes: a
// row that does not parse is an error and the zero row; a row that parses keeps the schema
// (a known state, an op exactly when not open, a nonce, a principal of two tokens), and
// written back as the fence writes it (marshalled) it parses again to the same bytes.
func FuzzParseGate(f *testing.F) {
	ok := GateRow{State: GateOpen, Generation: 1, RegistrationRevision: 1, Principal: "u_x.manager_serve_x", Nonce: "n"}
	frozen := ok
	frozen.State, frozen.Op = GateFrozen, &GateOp{OpID: "x", Kind: OpRetirement}
	registered := ok
	registered.Registration, registered.SupervisedUntil = &Registration{LifecycleUID: "l", IdentitiesDigest: "d", PreparedBy: "u_x.cli"}, 1
	// TestParseRefusesRowsThatBreakTheSchema's rows.
	for _, mutate := range []func(r *GateRow){
		func(r *GateRow) {},
		func(r *GateRow) { *r = frozen },
		func(r *GateRow) { *r = registered },
		func(r *GateRow) { r.State = "paused" },
		func(r *GateRow) { r.Op = &GateOp{OpID: "x", Kind: OpRetirement} },
		func(r *GateRow) { r.State = GateFrozen },
		func(r *GateRow) { r.State = GateRetired },
		func(r *GateRow) { r.Nonce = "" },
		func(r *GateRow) { r.Principal = "nobody" },
	} {
		r := ok
		mutate(&r)
		data, err := json.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(`{"state":"open","generation":1,"processEpoch":0,"registrationRevision":1,"nameAuthorityRevision":0,"principal":"a.b","nonce":"n","extra":1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := ParseGate(data)
		if err != nil {
			if !reflect.DeepEqual(r, GateRow{}) {
				t.Fatalf("a row that does not parse came back as %+v with %v", r, err)
			}
			return
		}
		o, a, two := strings.Cut(r.Principal, ".")
		switch {
		case r.State != GateOpen && r.State != GateFrozen && r.State != GateRetired,
			(r.State == GateOpen) != (r.Op == nil),
			r.Nonce == "",
			!two || o == "" || a == "" || strings.Contains(a, "."):
			t.Fatalf("accepted %+v from %q", r, fault.Clip(string(data), 200))
		}
		written, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		back, err := ParseGate(written)
		if err != nil {
			t.Fatalf("the row %q, written back as %s, does not parse: %v", fault.Clip(string(data), 200), written, err)
		}
		if again, err := json.Marshal(back); err != nil || !bytes.Equal(again, written) || !reflect.DeepEqual(back, r) {
			t.Fatalf("round trip: got %s, %v; want %s", again, err, written)
		}
	})
}
