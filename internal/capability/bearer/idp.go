package bearer

// The identity provider a space trusts (docs/PROTOCOL.md, "The HTTP face"): its EdDSA JWTs are
// verified with keys from its JWKS, fetched over https (or http on a loopback IP literal) and
// cached, and a subject's owner is derived byte for byte as the original does.

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/go-jose/go-jose/v4"
)

// Bounds of what the verifier accepts and does.
const (
	// MaxToken is the longest token read, in bytes.
	MaxToken = 8 << 10
	// skew is the clock skew allowed on exp, iat and nbf.
	skew = 5 * time.Second
	// RefreshEvery bounds how often an unknown kid refetches the JWKS: a flood of random kids
	// is not a flood of fetches.
	RefreshEvery = 10 * time.Second
	// maxJWKS is the largest key set read.
	maxJWKS = 1 << 20
	// fetchTimeout bounds one fetch of the key set.
	fetchTimeout = 5 * time.Second
)

// IdPConfig names the IdP a space trusts.
type IdPConfig struct {
	// URL is the IdP's base URL, for the discovery bundle.
	URL string
	// Issuer and Audience are what every token's iss and aud must be, exactly.
	Issuer   string
	Audience string
	// JWKS is where its key set is fetched.
	JWKS string
}

// CheckJWKSURL refuses a key set URL that is not https, or http on a loopback IP literal.
func CheckJWKSURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return fmt.Errorf("%q is not a URL", raw)
	}
	switch u.Scheme {
	case "https":
		return nil
	case "http":
		if ip := net.ParseIP(u.Hostname()); ip != nil && ip.IsLoopback() {
			return nil
		}
	}
	return fmt.Errorf("JWKS origin must be https (or http on a loopback IP literal for dev), got %s", u.Scheme+"://"+u.Host)
}

// Verifier checks IdP tokens against the IdP's current key set.
type Verifier struct {
	cfg  IdPConfig
	http *http.Client
	now  func() time.Time

	mu        sync.Mutex
	keys      map[string]ed25519.PublicKey
	fetchedAt time.Time     // when the last fetch began
	fetching  chan struct{} // closed when the fetch in flight ends; nil when none is
	fetchErr  error         // the last fetch's failure, or nil
}

// NewVerifier returns a verifier for cfg; now is the clock.
func NewVerifier(cfg IdPConfig, now func() time.Time) (*Verifier, error) {
	if err := CheckJWKSURL(cfg.JWKS); err != nil {
		return nil, err
	}
	if cfg.Issuer == "" || cfg.Audience == "" {
		return nil, errors.New("an IdP needs an issuer and an audience")
	}
	return &Verifier{cfg: cfg, http: &http.Client{Timeout: fetchTimeout}, now: now}, nil
}

// Config is what the verifier was made for.
func (v *Verifier) Config() IdPConfig { return v.cfg }

// Subject is a verified token's subject and expiry.
type Subject struct {
	Sub string
	Exp time.Time
}

// Verify checks token: at most MaxToken bytes; EdDSA, with no jku, jwk, x5u or x5c header; a key
// of the IdP's set by kid; the exact issuer and audience; exp, iat and sub present, exp in the
// future and iat not, within skew; a sub with no lone surrogate (JavaScript and Go would derive
// different owners from it). Every failure says why, without echoing the token.
func (v *Verifier) Verify(ctx context.Context, token string) (Subject, error) {
	kid, err := CheckHeader(token)
	if err != nil {
		return Subject{}, err
	}
	key, err := v.key(ctx, kid)
	if err != nil {
		return Subject{}, err
	}
	jws, err := jose.ParseSignedCompact(token, []jose.SignatureAlgorithm{jose.EdDSA})
	if err != nil {
		return Subject{}, errors.New("the token is not a compact JWS")
	}
	payload, err := jws.Verify(key)
	if err != nil {
		return Subject{}, errors.New("the token's signature does not verify")
	}
	return v.claims(payload)
}

// claims checks a verified payload's claims.
func (v *Verifier) claims(payload []byte) (Subject, error) {
	if !utf8.Valid(payload) {
		return Subject{}, errors.New("the token's claims are not valid UTF-8")
	}
	var c struct {
		Iss string          `json:"iss"`
		Aud json.RawMessage `json:"aud"`
		Sub json.RawMessage `json:"sub"`
		Exp json.RawMessage `json:"exp"`
		Iat json.RawMessage `json:"iat"`
		Nbf json.RawMessage `json:"nbf"`
	}
	if err := json.Unmarshal(payload, &c); err != nil {
		return Subject{}, errors.New("the token's claims are not a JSON object")
	}
	now := v.now()
	switch {
	case c.Iss != v.cfg.Issuer:
		return Subject{}, errors.New("the token is not from the configured issuer")
	case !audienceIs(c.Aud, v.cfg.Audience):
		return Subject{}, errors.New("the token is not for the configured audience")
	case absent(c.Exp):
		return Subject{}, errors.New("the token has no exp")
	case absent(c.Iat):
		return Subject{}, errors.New("the token has no iat")
	}
	exp, err := seconds(c.Exp)
	if err != nil {
		return Subject{}, fmt.Errorf("exp: %w", err)
	}
	iat, err := seconds(c.Iat)
	if err != nil {
		return Subject{}, fmt.Errorf("iat: %w", err)
	}
	switch {
	case !exp.Add(skew).After(now):
		return Subject{}, errors.New("the token has expired")
	case iat.After(now.Add(skew)):
		return Subject{}, errors.New("the token was issued in the future")
	}
	if !absent(c.Nbf) {
		nbf, err := seconds(c.Nbf)
		if err != nil || nbf.After(now.Add(skew)) {
			return Subject{}, errors.New("the token is not valid yet")
		}
	}
	sub, err := subject(c.Sub)
	if err != nil {
		return Subject{}, err
	}
	return Subject{Sub: sub, Exp: exp}, nil
}

// CheckHeader checks what a compact JWS says of itself before any key is looked up: at most
// MaxToken bytes, EdDSA, and no header that would bring its own key (jku, jwk, x5u, x5c) or
// demand unknown processing (crit). It returns the kid ("" when there is none).
func CheckHeader(token string) (kid string, err error) {
	if len(token) > MaxToken {
		return "", fmt.Errorf("the token is over %d bytes", MaxToken)
	}
	header, err := rawHeader(token)
	if err != nil {
		return "", err
	}
	for _, forbidden := range []string{"jku", "jwk", "x5u", "x5c", "crit"} {
		if _, ok := header[forbidden]; ok {
			return "", fmt.Errorf("the token's header carries %s", forbidden)
		}
	}
	if alg, _ := header["alg"].(string); alg != string(jose.EdDSA) {
		return "", errors.New("the token is not signed with EdDSA")
	}
	kid, _ = header["kid"].(string)
	return kid, nil
}

// rawHeader decodes a compact token's protected header as it is, every parameter kept.
func rawHeader(token string) (map[string]any, error) {
	head, _, ok := strings.Cut(token, ".")
	if !ok {
		return nil, errors.New("the token is not a compact JWS")
	}
	raw, err := base64.RawURLEncoding.DecodeString(head)
	if err != nil {
		return nil, errors.New("the token's header is not base64url")
	}
	var h map[string]any
	if err := json.Unmarshal(raw, &h); err != nil || h == nil {
		return nil, errors.New("the token's header is not a JSON object")
	}
	return h, nil
}

// audienceIs reports whether aud is want, as a string or a one-element array.
func audienceIs(aud json.RawMessage, want string) bool {
	var one string
	if json.Unmarshal(aud, &one) == nil {
		return one == want
	}
	var list []string
	return json.Unmarshal(aud, &list) == nil && len(list) == 1 && list[0] == want
}

// absent reports a claim that is missing or null.
func absent(raw json.RawMessage) bool { return len(raw) == 0 || string(raw) == "null" }

// seconds reads a NumericDate: a JSON number, never a string that spells one (RFC 7519 §2).
func seconds(raw json.RawMessage) (time.Time, error) {
	var f float64
	if raw[0] != '-' && (raw[0] < '0' || raw[0] > '9') || json.Unmarshal(raw, &f) != nil || f < 0 || f > 1<<40 {
		return time.Time{}, errors.New("not a number of seconds")
	}
	return time.Unix(int64(f), 0), nil
}

// subject reads sub from its raw JSON: a non-empty string with no lone surrogate escape.
func subject(raw json.RawMessage) (string, error) {
	var sub string
	if len(raw) == 0 || json.Unmarshal(raw, &sub) != nil || sub == "" {
		return "", errors.New("the token has no sub")
	}
	if loneSurrogate(string(raw)) {
		return "", errors.New("the token's sub holds a lone surrogate")
	}
	return sub, nil
}

// loneSurrogate reports whether the JSON string literal s escapes a UTF-16 surrogate that is
// not half of a pair (\uD800-\uDBFF followed at once by \uDC00-\uDFFF).
func loneSurrogate(s string) bool {
	high := false // a high surrogate waits for its low half
	for i := 0; i < len(s); i++ {
		var r uint64 = 0x110000 // anything but a \u escape
		if s[i] == '\\' && i+1 < len(s) {
			if s[i+1] == 'u' && i+6 <= len(s) {
				var err error
				if r, err = strconv.ParseUint(s[i+2:i+6], 16, 32); err != nil {
					return true
				}
				i += 5
			} else {
				i++ // a one-character escape
			}
		}
		isHigh, isLow := r >= 0xD800 && r <= 0xDBFF, r >= 0xDC00 && r <= 0xDFFF
		if high != isLow {
			return true // a high half with no low one after it, or a low half alone
		}
		high = isHigh
	}
	return high
}

// ErrKeySetUnavailable is the IdP's key set not being fetched: the plane's outage, not the
// caller's fault. Its text names no address; the cause is for the plane's log (errors.Unwrap).
var ErrKeySetUnavailable = errors.New("the identity provider's key set could not be fetched")

// unavailable wraps a fetch's cause under ErrKeySetUnavailable, whose text alone is shown.
type unavailable struct{ cause error }

func (u unavailable) Error() string   { return ErrKeySetUnavailable.Error() }
func (u unavailable) Is(t error) bool { return t == ErrKeySetUnavailable }
func (u unavailable) Unwrap() error   { return u.cause }

var errUnknownKid = errors.New("the token's kid is not in the IdP's key set")

// key returns the IdP key kid names (with no kid, the one key of the set), fetching the key
// set when it has none yet or, at most every RefreshEvery, when kid is unknown.
//
// One fetch runs at a time, outside the lock, and every caller that needs it waits for it (or
// for its own ctx). The fetch is the verifier's, not the caller's: a caller that hangs up does
// not cut it short, so it cannot spend the refresh that a genuine token after it needs. Within
// RefreshEvery of a failed fetch the answer is ErrKeySetUnavailable, not an unknown kid.
func (v *Verifier) key(ctx context.Context, kid string) (ed25519.PublicKey, error) {
	v.mu.Lock()
	if k, ok := v.find(kid); ok {
		v.mu.Unlock()
		return k, nil
	}
	done := v.fetching
	if done == nil {
		if !v.fetchedAt.IsZero() && v.now().Sub(v.fetchedAt) < RefreshEvery {
			err := v.missing()
			v.mu.Unlock()
			return nil, err
		}
		v.fetchedAt = v.now()
		done = make(chan struct{})
		v.fetching = done
		go v.refresh(done)
	}
	v.mu.Unlock()
	select {
	case <-done:
	case <-ctx.Done():
		return nil, unavailable{ctx.Err()}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if k, ok := v.find(kid); ok {
		return k, nil
	}
	return nil, v.missing()
}

// missing is why a kid the cache lacks is refused: the last fetch failed, or the set lacks it.
// The caller holds the lock.
func (v *Verifier) missing() error {
	if v.fetchErr != nil {
		return unavailable{v.fetchErr}
	}
	return errUnknownKid
}

// refresh fetches the key set and closes done; a failed fetch keeps the keys held before.
func (v *Verifier) refresh(done chan struct{}) {
	ctx, cancel := context.WithTimeout(context.Background(), fetchTimeout)
	keys, err := v.fetch(ctx)
	cancel()
	v.mu.Lock()
	if err == nil {
		v.keys = keys
	}
	v.fetchErr = err
	v.fetching = nil
	v.mu.Unlock()
	close(done)
}

// find looks kid up in the cached set; the caller holds the lock.
func (v *Verifier) find(kid string) (ed25519.PublicKey, bool) {
	if kid == "" {
		if len(v.keys) != 1 {
			return nil, false
		}
		for _, k := range v.keys {
			return k, true
		}
	}
	k, ok := v.keys[kid]
	return k, ok
}

// fetch reads the IdP's key set: its Ed25519 signing keys by kid.
func (v *Verifier) fetch(ctx context.Context) (map[string]ed25519.PublicKey, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, v.cfg.JWKS, nil)
	if err != nil {
		return nil, err
	}
	resp, err := v.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %d", resp.StatusCode)
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxJWKS+1))
	if err != nil {
		return nil, err
	}
	if len(raw) > maxJWKS {
		return nil, errors.New("the key set is over 1 MiB")
	}
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(raw, &set); err != nil {
		return nil, errors.New("the key set does not parse")
	}
	keys := map[string]ed25519.PublicKey{}
	for _, k := range set.Keys {
		pub, ok := k.Key.(ed25519.PublicKey)
		if ok && k.Valid() && (k.Algorithm == "" || k.Algorithm == string(jose.EdDSA)) && (k.Use == "" || k.Use == "sig") {
			keys[k.KeyID] = pub
		}
	}
	return keys, nil
}
