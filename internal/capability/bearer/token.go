package bearer

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/subjects"
)

// Views a bearer may carry: what the connection the callout makes for it may do (docs/PROTOCOL.md, "What each credential may do").
const (
	// ViewCaller is the default: a caller's permissions.
	ViewCaller = "caller"
	// ViewOps adds discovery (`$SRV`); it needs `admin` and is served on loopback only.
	ViewOps = "ops"
)

// Claims are what a bearer says: whose it is, for which view, until when.
type Claims struct {
	Owner string
	Actor string
	// Scope is the principal's ledger scope when the bearer was issued.
	Scope []string
	View  string
	// Agent marks a bearer exchanged for an agent's secret.
	Agent bool
	// IssuedAt and Expires bound it. Given to Issue, a non-zero Expires is a ceiling on the
	// bearer's exp (the IdP token's).
	IssuedAt time.Time
	Expires  time.Time
}

// wire is a bearer's JWT claims.
type wire struct {
	Iss string `json:"iss"`
	Aud string `json:"aud"`
	Sub string `json:"sub"`
	Iat int64  `json:"iat"`
	Nbf int64  `json:"nbf"`
	Exp int64  `json:"exp"`
	Ver int    `json:"ver"`
	// JTI makes every bearer unique, two issued in one second for one principal too.
	JTI   string   `json:"jti"`
	Scope []string `json:"scope"`
	Act   act      `json:"act"`
}

type act struct {
	Owner string `json:"owner"`
	Actor string `json:"actor"`
	View  string `json:"view"`
	Agent bool   `json:"agent,omitempty"`
}

// Issue signs a bearer for c in space with the active key, valid for ttl (1 s to MaxTTL) and
// not past c.Expires when that is set. It returns the bearer and its exp.
func (k *Keys) Issue(ctx context.Context, space string, c Claims, ttl time.Duration) (string, time.Time, error) {
	if ttl < time.Second || ttl > MaxTTL {
		return "", time.Time{}, fmt.Errorf("a bearer lives 1s to %s, not %s", MaxTTL, ttl)
	}
	if err := check(c); err != nil {
		return "", time.Time{}, err
	}
	s, err := k.read(ctx)
	if err != nil {
		return "", time.Time{}, err
	}
	priv := s.private[s.Active]
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.EdDSA, Key: priv}, (&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", s.Active))
	if err != nil {
		return "", time.Time{}, err
	}
	// A JWT's times are whole seconds. iat is now's second, and exp the first second at or
	// after now+ttl, so a bearer lives at least ttl (truncated, `ttlSec: 1` left with
	// milliseconds, or nothing by the time it arrived); but at most MaxTTL past its iat, and
	// never past the ceiling.
	now := k.now()
	iat := time.Unix(now.Unix(), 0)
	exp := time.Unix(now.Add(ttl).Unix(), 0)
	if exp.Before(now.Add(ttl)) {
		exp = exp.Add(time.Second)
	}
	if exp.After(iat.Add(MaxTTL)) {
		exp = iat.Add(MaxTTL)
	}
	if ceiling := time.Unix(c.Expires.Unix(), 0); !c.Expires.IsZero() && exp.After(ceiling) {
		exp = ceiling
	}
	if !exp.After(now) {
		return "", time.Time{}, fmt.Errorf("a bearer must outlive its issue: its ceiling %s has passed", c.Expires.UTC().Format(time.RFC3339))
	}
	scope := c.Scope
	if scope == nil {
		scope = []string{}
	}
	token, err := jwt.Signed(signer).Claims(wire{Iss: subjects.Issuer(space), Aud: space, Sub: c.Owner, Iat: iat.Unix(), Nbf: iat.Unix(),
		Exp: exp.Unix(), Ver: 1, JTI: subjects.NewNonce(), Scope: scope, Act: act{Owner: c.Owner, Actor: c.Actor, View: c.View, Agent: c.Agent}}).Serialize()
	if err != nil {
		return "", time.Time{}, err
	}
	return token, exp, nil
}

// check refuses claims a bearer must never carry.
func check(c Claims) error {
	switch {
	case !subjects.ValidUserOwner(c.Owner):
		return errors.New("a bearer's owner is a u_ owner")
	case !subjects.ValidActor(c.Actor):
		return errors.New("a bearer's actor is off its grammar")
	case c.View != ViewCaller && c.View != ViewOps:
		return fmt.Errorf("view %q is not a view", c.View)
	}
	return nil
}

// ErrRefused is in the chain of every error of Validate that judges the bearer itself (not the
// store it reads the key set from).
var ErrRefused = errors.New("bearer refused")

// refused is a judgement of the bearer: its message, and ErrRefused in its chain.
type refused struct{ error }

func (r refused) Is(target error) bool { return target == ErrRefused }

// Validate checks a bearer for space, as the auth callout does: no key headers, EdDSA, a key
// of the published set by kid (read now), the exact issuer and audience, iat, nbf and exp
// present and consistent (within Skew; a life of at most MaxTTL), version 1, its subject its owner. An
// error that judges the bearer has ErrRefused in its chain; any other is the store's.
func (k *Keys) Validate(ctx context.Context, space, token string) (Claims, error) {
	kid, err := CheckHeader(token)
	if err != nil {
		return Claims{}, refused{err}
	}
	pub, err := k.publicKey(ctx, kid)
	if errors.Is(err, errUnpublished) {
		return Claims{}, refused{err}
	}
	if err != nil {
		return Claims{}, err
	}
	c, err := k.judge(pub, space, token)
	if err != nil {
		return Claims{}, refused{err}
	}
	return c, nil
}

// errUnpublished refuses a bearer whose kid the key set does not publish.
var errUnpublished = errors.New("the bearer's kid is not a published key")

// publicKey returns the public key of kid as the key set publishes it now (a leader read).
func (k *Keys) publicKey(ctx context.Context, kid string) (ed25519.PublicKey, error) {
	s, err := k.read(ctx)
	if err != nil {
		return nil, err
	}
	priv, ok := s.private[kid]
	if !ok {
		return nil, errUnpublished
	}
	return priv.Public().(ed25519.PublicKey), nil
}

// judge checks a bearer against the public key its kid names.
func (k *Keys) judge(pub ed25519.PublicKey, space, token string) (Claims, error) {
	jws, err := jose.ParseSignedCompact(token, []jose.SignatureAlgorithm{jose.EdDSA})
	if err != nil {
		return Claims{}, errors.New("the bearer is not a compact JWS")
	}
	payload, err := jws.Verify(pub)
	if err != nil {
		return Claims{}, errors.New("the bearer's signature does not verify")
	}
	var w wire
	if err := fault.Decode(payload, &w); err != nil {
		return Claims{}, errors.New("the bearer's claims are not a bearer's")
	}
	now := k.now()
	iat, nbf, exp := time.Unix(w.Iat, 0), time.Unix(w.Nbf, 0), time.Unix(w.Exp, 0)
	c := Claims{Owner: w.Act.Owner, Actor: w.Act.Actor, Scope: w.Scope, View: w.Act.View, Agent: w.Act.Agent, IssuedAt: iat, Expires: exp}
	switch {
	case w.Iss != subjects.Issuer(space) || w.Aud != space:
		return Claims{}, errors.New("the bearer is not this space's")
	case w.Ver != 1:
		return Claims{}, errors.New("the bearer is not version 1")
	case w.Iat == 0 || w.Nbf == 0 || w.Exp == 0:
		return Claims{}, errors.New("the bearer lacks iat, nbf or exp")
	case iat.After(now.Add(Skew)) || nbf.After(now.Add(Skew)):
		return Claims{}, errors.New("the bearer is not valid yet")
	case !exp.Add(Skew).After(now):
		return Claims{}, errors.New("the bearer has expired")
	case exp.Sub(iat) > MaxTTL || exp.After(now.Add(MaxTTL+Skew)):
		return Claims{}, errors.New("the bearer lives longer than a bearer may")
	case w.Sub != w.Act.Owner:
		return Claims{}, errors.New("the bearer's subject is not its owner")
	}
	if err := check(c); err != nil {
		return Claims{}, err
	}
	return c, nil
}
