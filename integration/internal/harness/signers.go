package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"

	"github.com/cotal-ai/authplane/internal/capability/signers"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/internal/platform/broker"
	"github.com/cotal-ai/authplane/internal/platform/space"
	"github.com/cotal-ai/authplane/subjects"
)

// DataAccountAtBroker returns the data account's claims as the plane's broker holds them,
// read as the plane's system user reads them, and the JWT's size.
func DataAccountAtBroker(t testing.TB, p *TestPlane) (*jwt.AccountClaims, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tokens, err := broker.Account{NC: SystemConn(t, p), Public: p.Account()}.Lookup(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	claims, err := jwt.DecodeAccountClaims(tokens[0])
	if err != nil {
		t.Fatal(err)
	}
	return claims, len(tokens[0])
}

// LiveSigners reads the data account's live instances from the fence bucket: each with when
// its key was added.
func LiveSigners(t testing.TB, p *TestPlane) map[string]int64 {
	t.Helper()
	var set struct {
		Live map[string]int64 `json:"live"`
	}
	ReadRecord(t, p, subjects.AuthBucket(TestSpace), "$KV."+subjects.AuthBucket(TestSpace)+"."+subjects.SignersKey(p.Account()), &set)
	return set.Live
}

// SignerOf is instance iid's signing key, derived as the plane derives it.
func SignerOf(t testing.TB, keys *space.Keys, iid string) string {
	t.Helper()
	k, err := signers.NewKeys(keys.Space, keys.Data.Public(), keys.Data.Signer, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := k.Public(iid)
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

// Listed reports whether the data account's JWT p's broker holds lists instance iid's key.
func Listed(t testing.TB, p *TestPlane, iid string) bool {
	t.Helper()
	claims, _ := DataAccountAtBroker(t, p)
	_, ok := claims.SigningKeys[SignerOf(t, p.Keys(), iid)]
	return ok
}

// FillSigners puts n made-up live instances of owner on the data account's signer set, as
// long-lived instances would have left it (their gates open): the plane's next change signs
// them all.
func FillSigners(t testing.TB, p *TestPlane, owner string, n int) {
	t.Helper()
	now := time.Now().Unix()
	live := LiveSigners(t, p)
	if live == nil {
		live = map[string]int64{}
	}
	kv, err := p.JS(t).KeyValue(CallCtx(t), subjects.AuthBucket(TestSpace))
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		iid := fmt.Sprintf("fill%028d", i)
		live[iid] = now
		g, err := json.Marshal(issue.GateRow{State: issue.GateOpen, Generation: 1, RegistrationRevision: 1, Principal: owner + "." + subjects.ServeActor(iid), Nonce: "fill"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(CallCtx(t), subjects.GateKey(subjects.GateEndpointManager, iid), g); err != nil {
			t.Fatal(err)
		}
	}
	row, err := json.Marshal(map[string]any{"v": 1, "account": p.Account(), "live": live, "issuedAt": 0, "nonce": "fill"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(CallCtx(t), subjects.SignersKey(p.Account()), row); err != nil {
		t.Fatalf("fill the signer set (%d bytes): %v", len(row), err)
	}
}
