package admin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/internal/capability/bearer"
	"github.com/cotal-ai/authplane/internal/capability/signers"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/internal/core/store"
	"github.com/cotal-ai/authplane/internal/platform/broker"
	"github.com/cotal-ai/authplane/internal/platform/space"
	"github.com/cotal-ai/authplane/subjects"
)

// RotationLongest is how long a scheduled rotation begun by the command keeps the old signing
// keys listed after the switch, beyond the slack: the longest life any plane may give a
// credential one generation signs (--standing-ttl and --plane-user-ttl go up to a day). A
// plane that resumes the rotation waits for its own longest life if that is longer.
const RotationLongest = 24 * time.Hour

// RotationSlack is what a mint that read the old generation may still take to sign (the
// default --request-timeout), plus the clock skew between replicas.
const RotationSlack = 5*time.Second + time.Minute

// RotateOptions say what `authplane keys rotate-signing` does.
type RotateOptions struct {
	// Kind is signers.Scheduled or signers.Emergency; with Resume it is ignored.
	Kind string
	// Resume completes the rotation under way instead of beginning one.
	Resume bool
	// StopAfter, a test seam, stops the rotation as a crash would after a step.
	StopAfter func(step string) bool
}

// Signing is the data account's signing keys as `authplane keys` reaches them: the rotation,
// and the connections it holds; Close closes them.
type Signing struct {
	Rotation *signers.Rotation
	closers  []func()
}

// Close closes the connections.
func (s *Signing) Close() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
}

// OpenSigning reaches the data account's signing keys of the plane at natsURL as the plane
// does: its buckets as a short-lived plane-account user, the broker as a short-lived
// system-account user. Without the operator signing key in m the rotation refuses to begin.
func OpenSigning(ctx context.Context, m *space.Keys, natsURL string) (_ *Signing, err error) {
	s := &Signing{}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	auth, done, err := openBucket(ctx, m, natsURL, "rotate", subjects.AuthBucket(m.Space))
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, done)
	keysKV, done, err := openBucket(ctx, m, natsURL, "rotate", subjects.KeysBucket(m.Space))
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, done)
	sys, err := issue.NewIssuer(m.System.Public(), m.System.Signer, time.Now)
	if err != nil {
		return nil, err
	}
	sysAuth, err := sys.Connect("authplane.rotate", subjects.SystemPermissions(m.Data.Public(), m.Plane.Public()), 5*time.Minute)
	if err != nil {
		return nil, err
	}
	// As the plane's: a push made while the connection is down fails rather than waits.
	nc, err := nats.Connect(natsURL, sysAuth, nats.Name("authplane rotate"), nats.ReconnectBufSize(-1))
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", broker.RedactURL(natsURL), err)
	}
	s.closers = append(s.closers, nc.Close)
	acct := broker.Account{NC: nc, Public: m.Data.Public()}
	keys, err := signers.NewKeys(m.Space, m.Data.Public(), m.Data.Signer, time.Now)
	if err != nil {
		return nil, err
	}
	set := &signers.Set{Gates: auth, Account: m.Data.Public(), Keys: keys.Stored(keysKV), Broker: acct, Now: time.Now,
		Settle: 2 * RotationSlack}
	if m.OperatorSigner != nil {
		// The account's limits are the plane's flags: the command keeps what the broker holds.
		limit, err := connectionLimit(ctx, acct)
		if err != nil {
			return nil, err
		}
		set.Sign = func(keys []string, held map[string]int64) (string, int64, error) {
			return m.DataAccountJWT(space.DataPolicy{MaxConnections: limit, Signers: keys, Revoked: held})
		}
		if set.Capacity, err = signers.Capacity(set.Sign, nc.MaxPayload()); err != nil {
			return nil, err
		}
	}
	s.Rotation = &signers.Rotation{Set: set, Now: time.Now, Longest: RotationLongest, Slack: RotationSlack,
		Bearers: bearer.New(keysKV, time.Now), Servers: acct}
	set.State = s.Rotation.State
	return s, nil
}

// connectionLimit is the connection limit of the data account JWT a server holds (0: none).
func connectionLimit(ctx context.Context, acct broker.Account) (int64, error) {
	ctx, cancel := store.Attempt(ctx)
	defer cancel()
	tokens, err := acct.Lookup(ctx, 1)
	if err != nil {
		return 0, fmt.Errorf("read the data account's limits: %w", err)
	}
	claims, err := jwt.DecodeAccountClaims(tokens[0])
	if err != nil {
		return 0, fmt.Errorf("read the data account's limits: %w", err)
	}
	return max(claims.Limits.Conn, 0), nil
}

// RotateSigning begins a rotation of the data account's signing keys of kind o.Kind, or with
// o.Resume completes the one under way, as far as it goes now (docs/OPERATIONS.md, "Rotate
// the signing keys"); the plane's tick resumes what it leaves.
func RotateSigning(ctx context.Context, m *space.Keys, natsURL string, o RotateOptions) (*signers.Report, error) {
	s, err := OpenSigning(ctx, m, natsURL)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	s.Rotation.StopAfter = o.StopAfter
	if o.Resume {
		return s.Rotation.Resume(ctx)
	}
	return s.Rotation.Begin(ctx, o.Kind)
}

// SigningStatus says which generation of the data account's signing keys signs, which keys the
// proofs, and the rotation under way if any (its report, without making a step).
func SigningStatus(ctx context.Context, m *space.Keys, natsURL string) (signers.State, *signers.Report, error) {
	s, err := OpenSigning(ctx, m, natsURL)
	if err != nil {
		return signers.State{}, nil, err
	}
	defer s.Close()
	st, err := s.Rotation.State(ctx)
	if err != nil {
		return signers.State{}, nil, err
	}
	rep, err := s.Rotation.Status(ctx)
	return st, rep, err
}

// CredsIssuer is what `authplane creds` signs a credential expiring at exp with: the data
// account's signing key of the generation that signs now, the expiry recorded against it so a
// scheduled rotation keeps it listed until then.
func CredsIssuer(ctx context.Context, m *space.Keys, natsURL string, exp time.Time) (*issue.Issuer, error) {
	auth, done, err := openBucket(ctx, m, natsURL, "creds", subjects.AuthBucket(m.Space))
	if err != nil {
		return nil, err
	}
	defer done()
	keysKV, done2, err := openBucket(ctx, m, natsURL, "creds", subjects.KeysBucket(m.Space))
	if err != nil {
		return nil, err
	}
	defer done2()
	keys, err := signers.NewKeys(m.Space, m.Data.Public(), m.Data.Signer, time.Now)
	if err != nil {
		return nil, err
	}
	r := &signers.Rotation{Set: &signers.Set{Gates: auth, Account: m.Data.Public(), Keys: keys.Stored(keysKV)}, Now: time.Now}
	iss, err := r.ForCreds(ctx, exp)
	if errors.Is(err, signers.ErrNoGeneration) {
		return nil, fmt.Errorf("the signing keys that sign now are not in the keys bucket: %w", err)
	}
	return iss, err
}
