package issue

// Signing NATS user JWTs: build the claims, sign with the account's signing key
// (derived once, not per signature), then decode and validate the token before it leaves.

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/internal/core/fault"
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

// Signer returns the public key of the key the issuer signs with.
func (i *Issuer) Signer() string { return i.signerPub }

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
	// jwt/v2 does not validate what it encodes, and the re-check below compares the token with
	// what was asked, not what was asked with the subject grammar: an empty subject, a `.` at an
	// end, `..`, or a space in a publish subject would be signed and only refused by the broker.
	var vr jwt.ValidationResults
	uc.Validate(&vr)
	if errs := vr.Errors(); len(errs) > 0 {
		return "", fmt.Errorf("mint %s: the claims do not validate: %w", u.Name, errors.Join(errs...))
	}
	token, err := uc.Encode(i.signer)
	if err != nil {
		return "", fmt.Errorf("mint %s: %w", u.Name, err)
	}
	if err := i.verify(token, u); err != nil {
		return "", fmt.Errorf("mint %s: the signed token does not validate: %w", u.Name, err)
	}
	return token, nil
}

// verify decodes token once and checks it says exactly what was asked: a JWT header for the
// nkey algorithm, a signature of the right size, and a payload that is a closed body of exactly
// the keys a user claim of this library writes for what was asked (a response permission, a deny
// list, a bearer flag, a source or time limit, tags, or any key unknown here is refused), issued
// by the signing key for the account, for the key, name and expiry asked, with exactly the
// permissions and limits asked.
//
// It does not verify the signature itself: that is this issuer's own, made a moment ago with
// its cached key, and verifying it cost three times the signing. Authority is in the claims:
// Sign validated them before signing, and verify compares every one that grants or bounds
// anything with what was asked; a wrong signature could only make the broker refuse the credential.
func (i *Issuer) verify(token string, u User) error {
	head, rest, _ := strings.Cut(token, ".")
	payload, sig, ok := strings.Cut(rest, ".")
	if !ok || strings.Contains(sig, ".") {
		return errors.New("not a JWT of three segments")
	}
	if head != jwtHeader {
		return errors.New("not the JWT header of the nkey algorithm")
	}
	if s, err := base64.RawURLEncoding.DecodeString(sig); err != nil || len(s) != ed25519.SignatureSize {
		return errors.New("the signature segment is not an Ed25519 signature")
	}
	raw, err := base64.RawURLEncoding.DecodeString(payload)
	if err != nil {
		return fmt.Errorf("payload: %w", err)
	}
	var got claims
	if err := fault.Decode(raw, &got); err != nil {
		return fmt.Errorf("payload: %w", err)
	}
	want := jwt.NewUserClaims(u.Key)
	u.Limits.apply(want)
	account := ""
	if i.signerPub != i.account {
		account = i.account
	}
	switch n := got.Nats; {
	case n.Type != jwt.UserClaim || n.Version != jwtVersion:
		return fmt.Errorf("claim type %q version %d, want a user claim of version %d", n.Type, n.Version, jwtVersion)
	case got.Issuer != i.signerPub:
		return errors.New("issuer is not the signing key")
	case n.IssuerAccount != account:
		return errors.New("issuer account differs")
	case got.Subject != u.Key || got.Name != u.Name || got.Expires != u.Expires.Unix() || got.ID == "" || got.IssuedAt == 0:
		return errors.New("subject, name, expiry, id or issue time differ from the request")
	case !slices.Equal(n.Pub.Allow, u.Permissions.Pub) || !slices.Equal(n.Sub.Allow, u.Permissions.Sub):
		return errors.New("publish or subscribe allow list differs from the permissions asked for")
	case n.Subs != want.Subs || n.Data != want.Data || n.Payload != want.NatsLimits.Payload:
		return errors.New("limits differ from the ones asked for")
	}
	return nil
}

// claims is a user JWT's payload as jwt/v2 writes it for what this issuer asks: every key it
// may hold, and no other. Absent limits are "unlimited" (-1), which jwt/v2 always writes.
type claims struct {
	ID       string     `json:"jti"`
	IssuedAt int64      `json:"iat"`
	Issuer   string     `json:"iss"`
	Name     string     `json:"name"`
	Subject  string     `json:"sub"`
	Expires  int64      `json:"exp"`
	Nats     userClaims `json:"nats"`
}

type userClaims struct {
	Pub           allowList `json:"pub"`
	Sub           allowList `json:"sub"`
	Subs          int64     `json:"subs"`
	Data          int64     `json:"data"`
	Payload       int64     `json:"payload"`
	IssuerAccount string    `json:"issuer_account"`
	Type          string    `json:"type"`
	Version       int       `json:"version"`
}

type allowList struct {
	Allow []string `json:"allow"`
}

// jwtHeader is the header every user JWT of jwt/v2 carries, encoded; jwtVersion the claim
// version it writes.
var jwtHeader = mustHeader()

const jwtVersion = 2

func mustHeader() string {
	h, err := json.Marshal(jwt.Header{Type: jwt.TokenTypeJwt, Algorithm: jwt.AlgorithmNkey})
	if err != nil {
		panic("mint: the JWT header does not marshal: " + err.Error())
	}
	return base64.RawURLEncoding.EncodeToString(h)
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

// ConnectVia is Connect with the issuer picked anew at every (re)connect: a connection whose
// signing key was rotated away comes back signed by the one that signs now.
func ConnectVia(pick func() (*Issuer, error), name string, g subjects.Permissions, ttl time.Duration) (nats.Option, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, fmt.Errorf("user key for %s: %w", name, err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, err
	}
	return nats.UserJWT(
		func() (string, error) {
			i, err := pick()
			if err != nil {
				return "", err
			}
			return i.Sign(User{Name: name, Key: pub, Permissions: g, Expires: i.now().Add(ttl)})
		},
		func(nonce []byte) ([]byte, error) { return kp.Sign(nonce) },
	), nil
}

// Derived returns kp with its public key and Ed25519 private key derived once, for a key that
// signs often outside an Issuer (the auth callout's answers): nkeys derives both from the seed
// again on every call.
func Derived(kp nkeys.KeyPair) (nkeys.KeyPair, error) { return cache(kp) }

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
