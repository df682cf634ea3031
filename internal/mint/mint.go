// Package mint signs NATS user JWTs: build the claims, sign with the account's signing key
// (derived once, not per signature), then decode and validate the token before it leaves.
package mint

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/subjects"
)

// Issuer signs user JWTs for one account.
type Issuer struct {
	account   string // the account the users belong to (its public key)
	signer    *cachedKey
	signerPub string
	now       func() time.Time
}

// NewIssuer returns an issuer for users of account, signed with signer (the account's identity
// key or one of its signing keys). now is the clock.
func NewIssuer(account string, signer nkeys.KeyPair, now func() time.Time) (*Issuer, error) {
	ck, err := cache(signer)
	if err != nil {
		return nil, err
	}
	if !subjects.ValidAccountNKey(account) {
		return nil, fmt.Errorf("issuer account %q is not an account key", account)
	}
	return &Issuer{account: account, signer: ck, signerPub: ck.pub, now: now}, nil
}

// Account returns the public key of the account the issuer's users belong to.
func (i *Issuer) Account() string { return i.account }

// User describes one credential to sign.
type User struct {
	// Name is the principal, `<owner>.<actor>`; never read back from tags.
	Name string
	// Key is the user's public nkey (the caller's; the plane never sees its seed).
	Key string
	// Permissions are what the user may do; everything else is denied.
	Permissions subjects.Permissions
	// Expires is the JWT's expiry; it must be in the future.
	Expires time.Time
	// Limits bound what the user may hold open; zero fields are unbounded.
	Limits Limits
}

// Limits are a user's own bounds, which the broker enforces.
type Limits struct {
	// Subs bounds its subscriptions; Payload the size of a message it publishes (bytes).
	Subs    int64
	Payload int64
}

// DefaultLimits bound every user the plane mints or `authplane creds` writes, unless flags say
// otherwise.
var DefaultLimits = Limits{Subs: 1000, Payload: 1 << 20}

// Validate refuses bounds off their ranges, naming the flags that set them.
func (l Limits) Validate() error {
	var p []error
	if l.Subs < 1 || l.Subs > 1_000_000 {
		p = append(p, fmt.Errorf("--max-subscriptions %d: want 1 to 1000000", l.Subs))
	}
	if l.Payload < 1<<10 || l.Payload > 64<<20 {
		p = append(p, fmt.Errorf("--max-payload %d: want 1 KiB to 64 MiB", l.Payload))
	}
	return errors.Join(p...)
}

// apply sets l on claims: a zero field stays unbounded (-1).
func (l Limits) apply(uc *jwt.UserClaims) {
	if l.Subs > 0 {
		uc.Limits.Subs = l.Subs
	}
	if l.Payload > 0 {
		uc.Limits.Payload = l.Payload
	}
}

// Sign builds, signs and re-validates a user JWT.
func (i *Issuer) Sign(u User) (string, error) {
	if !subjects.ValidUserNKey(u.Key) {
		return "", fmt.Errorf("mint %s: %q is not a user nkey", u.Name, u.Key)
	}
	if len(u.Permissions.Pub) == 0 || len(u.Permissions.Sub) == 0 {
		// An empty allow list means "allow everything" to the broker.
		return "", fmt.Errorf("mint %s: a grant needs publish and subscribe allow lists", u.Name)
	}
	now := i.now()
	if !u.Expires.After(now) {
		return "", fmt.Errorf("mint %s: expiry %s is not in the future", u.Name, u.Expires.UTC().Format(time.RFC3339))
	}
	uc := jwt.NewUserClaims(u.Key)
	uc.Name = u.Name
	uc.IssuedAt = now.Unix()
	uc.Expires = u.Expires.Unix()
	if i.signerPub != i.account {
		uc.IssuerAccount = i.account
	}
	uc.Permissions.Pub.Allow = append(jwt.StringList(nil), u.Permissions.Pub...)
	uc.Permissions.Sub.Allow = append(jwt.StringList(nil), u.Permissions.Sub...)
	u.Limits.apply(uc)
	token, err := uc.Encode(i.signer)
	if err != nil {
		return "", fmt.Errorf("mint %s: %w", u.Name, err)
	}
	if err := i.verify(token, u); err != nil {
		return "", fmt.Errorf("mint %s: the signed token does not validate: %w", u.Name, err)
	}
	return token, nil
}

// verify decodes token (which checks its signature) and checks it says what was asked.
func (i *Issuer) verify(token string, u User) error {
	got, err := jwt.DecodeUserClaims(token)
	if err != nil {
		return err
	}
	var vr jwt.ValidationResults
	got.Validate(&vr)
	switch {
	case vr.IsBlocking(true):
		return errors.Join(vr.Errors()...)
	case got.Issuer != i.signerPub:
		return errors.New("issuer is not the signing key")
	case got.Subject != u.Key || got.Name != u.Name || got.Expires != u.Expires.Unix():
		return errors.New("subject, name or expiry differ from the request")
	case i.signerPub != i.account && got.IssuerAccount != i.account:
		return errors.New("issuer account differs")
	case got.Resp != nil || got.BearerToken:
		return errors.New("unexpected response permission or bearer flag")
	case !slices.Equal(got.Pub.Allow, u.Permissions.Pub) || !slices.Equal(got.Sub.Allow, u.Permissions.Sub):
		return errors.New("publish or subscribe allow list differs from the permissions asked for")
	case len(got.Pub.Deny) != 0 || len(got.Sub.Deny) != 0:
		return errors.New("unexpected deny list")
	}
	want := jwt.NewUserClaims(u.Key)
	u.Limits.apply(want)
	if got.Limits.Subs != want.Limits.Subs || got.Limits.Payload != want.Limits.Payload {
		return errors.New("limits differ from the ones asked for")
	}
	return nil
}

// Connect returns a nats.Option that authenticates as a fresh, process-local user of this
// issuer's account: every (re)connect presents a newly signed JWT that lives for ttl. Pair it
// with a periodic ForceReconnect before ttl runs out.
func (i *Issuer) Connect(name string, g subjects.Permissions, ttl time.Duration) (nats.Option, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, fmt.Errorf("user key for %s: %w", name, err)
	}
	return i.ConnectAs(kp, name, g, ttl)
}

// ConnectAs is Connect for the user whose key is kp (the callout user, whose key the callout
// account lists).
func (i *Issuer) ConnectAs(kp nkeys.KeyPair, name string, g subjects.Permissions, ttl time.Duration) (nats.Option, error) {
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, err
	}
	return nats.UserJWT(
		func() (string, error) {
			return i.Sign(User{Name: name, Key: pub, Permissions: g, Expires: i.now().Add(ttl)})
		},
		func(nonce []byte) ([]byte, error) { return kp.Sign(nonce) },
	), nil
}

// cachedKey is an nkeys.KeyPair whose public key and ed25519 private key are derived once:
// nkeys re-derives both from the seed on every call, which more than doubles signing cost.
type cachedKey struct {
	nkeys.KeyPair
	pub  string
	priv ed25519.PrivateKey
}

func cache(kp nkeys.KeyPair) (*cachedKey, error) {
	if kp == nil {
		return nil, errors.New("no signing key")
	}
	seed, err := kp.Seed()
	if err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	_, raw, err := nkeys.DecodeSeed(seed)
	if err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	return &cachedKey{KeyPair: kp, pub: pub, priv: ed25519.NewKeyFromSeed(raw)}, nil
}

func (k *cachedKey) PublicKey() (string, error) { return k.pub, nil }

func (k *cachedKey) Sign(input []byte) ([]byte, error) { return ed25519.Sign(k.priv, input), nil }
