package fault_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/subjects"
)

// BenchmarkRows decodes the rows every renewal reads: its gate (parsed alone, and observed
// through its fence on an in-memory bucket) and a key's claim. Run it with and without -race:
// a -race test's deadlines pay for these reads.
//
//	go test -run '^$' -bench Rows ./internal/core/fault
//	go test -race -run '^$' -bench Rows ./internal/core/fault
func BenchmarkRows(b *testing.B) {
	row := issue.GateRow{State: issue.GateOpen, Generation: 3, RegistrationRevision: 7, Principal: "u_x.manager_serve_x",
		Nonce: "0123456789abcdef0123456789abcdef",
		Registration: &issue.Registration{LifecycleUID: "a1b2c3d4e5f6g7h8i9j0k1l2m3", PreparedBy: "cli",
			IdentitiesDigest: "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"},
		Reregistrations: &issue.Bucket{Tokens: 3, At: 1764800000000}}
	gateData, err := json.Marshal(row)
	if err != nil {
		b.Fatal(err)
	}
	// claim is a claim row's shape (package issue keeps its own unexported).
	type claim struct {
		V          int    `json:"v"`
		NKey       string `json:"nkey"`
		InstanceID string `json:"instanceId"`
	}
	claimData, err := json.Marshal(claim{V: 1, NKey: "UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4", InstanceID: "k3x9m2p7q8r4s5t6u1v0w9y8z7"})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("gate-row", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := issue.ParseGate(gateData); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("gate-observe", func(b *testing.B) {
		ctx := context.Background()
		f := issue.GateOf(testkit.NewKV(), subjects.GateEndpointManager, "k3x9m2p7q8r4s5t6u1v0w9y8z7")
		absent, err := f.Observe(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := absent.Write(ctx, row); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := f.Observe(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("claim-row", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var c claim
			if err := fault.DecodeRow(claimData, &c, 512); err != nil {
				b.Fatal(err)
			}
		}
	})
}
