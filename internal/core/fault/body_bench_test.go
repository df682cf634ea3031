package fault

import (
	"encoding/json"
	"testing"

	"github.com/cotal-ai/authplane/client"
)

// renewal is a renew body as a manager sends it.
func renewal(b *testing.B) []byte {
	b.Helper()
	proof, account, epoch := "sha256:"+string(make64('a')), "ABJHLOVMPA4CI6R5KLNGOB4GSLNIY7IOUPAJC4YFNDLQVIOEXAMPLE", uint64(3)
	r := client.ServiceAuthority{Envelope: client.Envelope{
		V: 1, Kind: client.KindServiceAuthority, Space: "default", Actor: "cli",
		InstanceID: "k3x9m2p7q8r4s5t6u1v0w9y8z7", ManagerLifecycleUID: "a1b2c3d4e5f6g7h8i9j0k1l2m3", RequestID: "Zm9vYmFyYmF6cXV4cXV1eDEyMzQ",
		Identities: &client.Identities{
			Supervisor:    client.Identity{ID: "UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4"},
			Executor:      client.Identity{ID: "UCK5N7N66OBOINFXAYC2ACJQYFSOD4VYNU6APEJTAVFZB2SVHLKGEW7L"},
			Serve:         client.Identity{ID: "UAKQNWRW2QTMGTJJ4B3YVGBLLRJ3JXXRZC4HI2RVFL6IXVDKE7EQ4CUU"},
			GoalWriter:    client.Identity{ID: "UBYUSJOMAVSTUHYB7OOJUYRQ4OQHGHEVHX5L4CSEYYKW3ZPJ6HEAOYRS"},
			SessionLedger: client.Identity{ID: "UA6KOMQ67XOE3FFE756GLSVHMHSOWOJ6VJKR5C6HUKYW4WWRDB7PMMZV"},
		},
		RegistrationProof: &proof, AccountPublicKey: &account, ProcessEpoch: &epoch,
	}, Operation: client.OpRenew}
	data, err := json.Marshal(r)
	if err != nil {
		b.Fatal(err)
	}
	return data
}

func make64(c byte) []byte {
	out := make([]byte, 64)
	for i := range out {
		out[i] = c
	}
	return out
}

// BenchmarkDecode decodes a renew body as the plane does, its kind first (Peek) and then the
// closed parse:
//
//	go test -run '^$' -bench Decode ./internal/core/fault
func BenchmarkDecode(b *testing.B) {
	data := renewal(b)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Peek(data, "kind"); err != nil {
			b.Fatal(err)
		}
		var r client.ServiceAuthority
		if err := Decode(data, &r); err != nil {
			b.Fatal(err)
		}
	}
}
