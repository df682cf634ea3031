package signers

import (
	"crypto/hkdf"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/internal/mint"
)

// label is the HKDF label an instance's signing key is derived under.
const label = "authplane instance signer v1"

// Keys derives each manager instance's own signing key of the data account: an account key
// pair whose seed is HKDF-SHA256 over the data account's signing seed (the root the proof key
// is derived from too, under another label), with the space, the account and the instance in
// the info. Nothing is stored: every replica derives the same key. Issuers of the instances
// seen lately are kept, so a key is derived once per instance, not once per signature.
type Keys struct {
	root    []byte
	account string
	prefix  string
	now     func() time.Time

	mu      sync.Mutex
	issuers map[string]*mint.Issuer
}

// maxIssuers bounds the issuers kept; past it the memory starts over.
const maxIssuers = 1 << 15

// NewKeys returns the keys of space's data account account, derived from its signing key root;
// now is the clock of the credentials they sign.
func NewKeys(space, account string, root nkeys.KeyPair, now func() time.Time) (*Keys, error) {
	if root == nil {
		return nil, errors.New("instance signing keys: no data account signing key")
	}
	seed, err := root.Seed()
	if err != nil {
		return nil, fmt.Errorf("instance signing keys: %w", err)
	}
	return &Keys{root: seed, account: account, prefix: space + "\x00" + account + "\x00", now: now, issuers: map[string]*mint.Issuer{}}, nil
}

// Issuer returns the issuer of instance iid's credentials: signed with its own key.
func (k *Keys) Issuer(iid string) (*mint.Issuer, error) {
	k.mu.Lock()
	iss, ok := k.issuers[iid]
	k.mu.Unlock()
	if ok {
		return iss, nil
	}
	seed, err := hkdf.Key(sha256.New, k.root, nil, label+"\x00"+k.prefix+iid, 32)
	if err != nil {
		return nil, fmt.Errorf("derive the signing key of instance %s: %w", iid, err)
	}
	kp, err := nkeys.FromRawSeed(nkeys.PrefixByteAccount, seed)
	if err != nil {
		return nil, fmt.Errorf("derive the signing key of instance %s: %w", iid, err)
	}
	if iss, err = mint.NewIssuer(k.account, kp, k.now); err != nil {
		return nil, fmt.Errorf("the signing key of instance %s: %w", iid, err)
	}
	k.mu.Lock()
	if len(k.issuers) >= maxIssuers {
		k.issuers = map[string]*mint.Issuer{}
	}
	k.issuers[iid] = iss
	k.mu.Unlock()
	return iss, nil
}

// Public is the public key of instance iid's signing key.
func (k *Keys) Public(iid string) (string, error) {
	iss, err := k.Issuer(iid)
	if err != nil {
		return "", err
	}
	return iss.Signer(), nil
}
