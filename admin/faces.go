package admin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/cotal-ai/authplane/internal/bearer"
	"github.com/cotal-ai/authplane/internal/idp"
	"github.com/cotal-ai/authplane/internal/ids"
	"github.com/cotal-ai/authplane/internal/ledger"
	"github.com/cotal-ai/authplane/internal/space"
	"github.com/cotal-ai/authplane/subjects"
)

// What the HTTP face's principals need from an operator: the owner an IdP subject derives,
// an agent's one-time secret, and the rotation of the bearer keys.

// Owner is the `u_` owner the space derives for the IdP subject sub of issuer (what a human's
// ledger row is granted under, `authplane owner`).
func Owner(m *space.Keys, issuer, sub string) (string, error) {
	if issuer == "" || sub == "" {
		return "", fmt.Errorf("an owner derives from an IdP issuer and subject, both non-empty")
	}
	if !utf8.ValidString(sub) {
		return "", fmt.Errorf("the subject is not valid UTF-8 (the plane refuses such a subject from any IdP)")
	}
	return idp.DeriveOwner(m.OwnerSecret, issuer, sub), nil
}

// SetAgent makes owner.actor a managed agent with a fresh one-time secret, which it returns:
// the agent presents it to `POST /exchange` (the ledger keeps only its SHA-256). A previous
// secret stops working.
func SetAgent(ctx context.Context, m *space.Keys, natsURL, owner, actor string) (secret string, row ledger.Row, err error) {
	kv, done, err := openBucket(ctx, m, natsURL, "agent", subjects.ActorsBucket(m.Space))
	if err != nil {
		return "", ledger.Row{}, err
	}
	defer done()
	secret = ids.Secret(32)
	sum := sha256.Sum256([]byte(secret))
	row, err = ledger.SetAgentSecret(ctx, kv, owner, actor, hex.EncodeToString(sum[:]), time.Now())
	return secret, row, err
}

// RevokeAgent clears owner.actor's agent secret: its next exchange and its next connection are
// refused.
func RevokeAgent(ctx context.Context, m *space.Keys, natsURL, owner, actor string) (ledger.Row, error) {
	kv, done, err := openBucket(ctx, m, natsURL, "agent", subjects.ActorsBucket(m.Space))
	if err != nil {
		return ledger.Row{}, err
	}
	defer done()
	return ledger.SetAgentSecret(ctx, kv, owner, actor, "", time.Now())
}

// BearerKeys opens the space's bearer key set (`authplane keys`); done closes its connection.
func BearerKeys(ctx context.Context, m *space.Keys, natsURL string) (keys *bearer.Keys, done func(), err error) {
	kv, done, err := openBucket(ctx, m, natsURL, "keys", subjects.KeysBucket(m.Space))
	if err != nil {
		return nil, nil, err
	}
	return bearer.New(kv, time.Now), done, nil
}
