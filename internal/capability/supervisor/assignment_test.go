package supervisor

import (
	"bytes"
	"reflect"
	"testing"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/internal/core/fault"
)

// TestAStoredAssignmentIsTheReplyWithANonceAndNoRevision: a stored assignment is written as
// the reply's fields and a nonce, with no revision (the KV revision is the row's own), and
// reads back as written; a row without a nonce, of another kind or state, with an unknown
// field or with a stored revision is refused.
func TestAStoredAssignmentIsTheReplyWithANonceAndNoRevision(t *testing.T) {
	row := Assignment{Assignment: client.Assignment{V: 1, Kind: kindAssignment, Owner: "u_aaaaaaaaaaaaaaaaaaaaaaaaaa",
		Space: "default", AccountPublicKey: "ACCOUNT", InstanceID: "iiiiiiiiiiiiiiiiiiiiiiiiii", LifecycleUID: "llllllllllllllllllllllllll",
		State: StateAssigned, ExpiresAt: 1_800_000_000, Scope: []string{"supervise"}, AssignedBy: "u_platform.admin"}, Nonce: "n1"}
	data, err := fault.Encode(row)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(data, []byte(`"revision"`)) || !bytes.Contains(data, []byte(`"nonce":"n1"`)) || !bytes.Contains(data, []byte(`"owner":"u_aaaaaaaaaaaaaaaaaaaaaaaaaa"`)) {
		t.Fatalf("stored as %s; want the reply's fields inline, a nonce and no revision", data)
	}
	got, err := parseAssignment(data)
	if err != nil || !reflect.DeepEqual(got, row) {
		t.Fatalf("read back %+v, %v; want %+v", got, err, row)
	}
	for what, change := range map[string]func(*Assignment){
		"no nonce":          func(a *Assignment) { a.Nonce = "" },
		"another kind":      func(a *Assignment) { a.Kind = "host" },
		"another state":     func(a *Assignment) { a.State = "paused" },
		"a stored revision": func(a *Assignment) { a.Revision = 7 },
	} {
		bad := row
		change(&bad)
		data, err := fault.Encode(bad)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := parseAssignment(data); err == nil {
			t.Errorf("%s: a row of it was read", what)
		}
	}
	if _, err := parseAssignment(bytes.Replace(data, []byte(`"nonce"`), []byte(`"extra":1,"nonce"`), 1)); err == nil {
		t.Error("a row with an unknown field was read")
	}
}
