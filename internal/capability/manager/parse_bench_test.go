package manager

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/internal/core/fault"
)

// BenchmarkParseRenewal decodes a renew body as the plane does on every renewal: its kind first
// (handlers.ManagerAuthority, fault.Peek), then the closed parse and every grammar (Parse):
//
//	go test -run '^$' -bench ParseRenewal ./internal/capability/manager
func BenchmarkParseRenewal(b *testing.B) {
	proof, account, epoch, ids := "sha256:"+strings.Repeat("0", 64), accountKey(b), uint64(3), identities(b)
	data, err := json.Marshal(client.ServiceAuthority{Envelope: client.Envelope{
		V: 1, Kind: Kind, Space: "default", Actor: "cli",
		InstanceID: strings.Repeat("a", 26), ManagerLifecycleUID: strings.Repeat("b", 26), RequestID: strings.Repeat("r", 22),
		Identities:        &ids,
		RegistrationProof: &proof, AccountPublicKey: &account, ProcessEpoch: &epoch,
	}, Operation: OpRenew})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if kind, err := fault.Peek(data, "kind"); err != nil || kind != Kind {
			b.Fatalf("Peek: %q, %v", kind, err)
		}
		if _, err := Parse(data); err != nil {
			b.Fatal(err)
		}
	}
}
