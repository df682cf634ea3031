// Package issue is the one issuance pipeline (docs/SECURITY.md, "How"). Every credential the plane
// mints goes through Pipeline.Issue with a Plan: sign → validate → record `minted` → hook →
// commit each fence in order → credentials; or, if anything after signing fails, `discarded`
// and nothing. A credential is valid only if every commit of its plan landed, and every fence
// writer changes the row it writes, so no credential commits after a fence that forbids it.
// Manager authority, runs, the supervisor and the HTTP doors only build plans and shape replies.
// What a plan commits on and spends lives here too: the endpoint gate (gate.go), the claims on
// nkeys (claim.go), the tenants' budgets (buckets.go, stored.go) and the signer (mint.go).
package issue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cotal-ai/authplane/internal/core/audit"
	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/internal/core/store"
	"github.com/cotal-ai/authplane/subjects"
)

// Grant is one credential a plan asks for.
type Grant struct {
	Duty subjects.Duty
	// Key is the holder's public nkey; the plane never sees its seed. It is claimed for the
	// plan's instance before the plan commits.
	Key string
	// Field names what named the key, for a refusal (`identities.supervisor`,
	// `attempt.driverId`).
	Field string
	// Principal is the holder's `<owner>.<actor>`, the JWT's name.
	Principal string
	// TTL is the credential's lifetime, before the ceiling clamps it.
	TTL         time.Duration
	Permissions subjects.Permissions
}

// Ceiling bounds a plan: every `exp` is clamped to At, and the plan is refused once At has
// passed. The zero Ceiling bounds nothing.
type Ceiling struct {
	At time.Time
	// What names what ends at At, for the refusal: "the platform supervisor assignment …".
	What string
}

// Step is one fence a mint commits on. Steps commit in plan order, each only after the one
// before it landed.
type Step struct {
	// Fence names the fence (its key), for refusals and logs.
	Fence string
	// Commit commits the mint on the fence and returns the revision the fence landed at (0 for
	// a step that is not one fence).
	Commit func(ctx context.Context) (uint64, error)
	// Release, when set, undoes what Commit did once a later step of the plan did not land
	// (cause says why): what the mint took (a quota slot) is held only by mints that commit. It
	// must be safe to run after a crash left the commit in place: the next attempt may land.
	Release func(ctx context.Context, cause error) error
}

// Unchanged is the step that commits on fence o exactly as it was observed before signing. On
// a grouped bucket (fence.Grouped), concurrent mints that observed the same row commit with one
// CAS.
func Unchanged[T any](o *fence.Observed[T]) Step {
	return Step{Fence: o.Key(), Commit: func(ctx context.Context) (uint64, error) {
		return revision(o.Commit(ctx))
	}}
}

// Replaced is the step that commits on fence o by writing next over the row observed before
// signing (a registration that is itself the mint's commit).
func Replaced[T any](o *fence.Observed[T], next T) Step {
	return Step{Fence: o.Key(), Commit: func(ctx context.Context) (uint64, error) {
		return revision(o.Write(ctx, next))
	}}
}

func revision[T any](o *fence.Observed[T], err error) (uint64, error) {
	if err != nil {
		return 0, err
	}
	return o.Revision, nil
}

// Key is a key a plan binds to its instance beyond its grants' keys (a registration's
// identities, which later mints sign), and what named it.
type Key struct {
	NKey  string
	Field string
}

// Plan is one mint.
type Plan struct {
	// Instance is the manager instance the plan mints for: every key it signs or binds is
	// claimed by it in the commit, and every `minted` record is filed under it. A plan that
	// names none is refused before anything is signed.
	Instance Instance
	// Request identifies who asked for what, for the records.
	Request audit.Request
	Grants  []Grant
	// Binds are keys the plan claims for its instance without signing them now.
	Binds []Key
	// Spends are tenant budgets the plan spends before it signs, together with its owner's new
	// keys: all of them, or, when any is spent, none (and nothing is written).
	Spends []Spend
	// Registered says the plan saw its instance's gate registered and open before signing:
	// its signing key, once seen live, is taken to be live still (Signers).
	Registered bool
	// Trust is the generation of signing keys whose root keyed the instance's registration
	// proof: Signers refuses it once an emergency rotation has replaced that root.
	Trust   uint64
	Ceiling Ceiling
	Steps   []Step
	// Hook, when set, runs after the credentials are signed and recorded `minted` and before
	// the first commit (the supervisor stages its generations here). An error discards the
	// mint; a *fault.Error is answered as it is.
	Hook func(ctx context.Context, creds []Credential) error
}

// Credential is one signed credential.
type Credential struct {
	Duty subjects.Duty
	Key  string
	JWT  string
	// Exp is the JWT's expiry, in seconds.
	Exp int64
}

// String names the credential by duty, public key and expiry, so that printing one never
// prints its token.
func (c Credential) String() string { return fmt.Sprintf("%s %s exp %d", c.Duty, c.Key, c.Exp) }

// Issued is what a plan produced once every commit landed.
type Issued struct {
	At          time.Time
	Credentials []Credential
	// Revisions are the revisions the plan's steps committed at, in plan order.
	Revisions []uint64
}

// Earliest is the earliest expiry among the credentials, in seconds.
func (is *Issued) Earliest() int64 {
	var e int64
	for _, c := range is.Credentials {
		if e == 0 || c.Exp < e {
			e = c.Exp
		}
	}
	return e
}

// ErrDiscarded is in the chain of every refusal of a mint that signed and then did not commit:
// the pipeline has recorded it `discarded`, so whoever answers must not record it again.
var ErrDiscarded = errors.New("mint discarded")

// Recorder writes the pipeline's two decisions: `minted` before any commit, `discarded` when a
// signed mint does not commit.
type Recorder interface {
	// Minted files the mint's one record, naming every credential, under instance iid.
	Minted(ctx context.Context, iid string, req audit.Request, creds []audit.Credential, mintID string) error
	LogMinted(req audit.Request, creds []audit.Credential)
	Discarded(ctx context.Context, req audit.Request, creds []audit.Credential, refusal *fault.Error)
}

// Signers gives each manager instance the issuer of its own signing key, once the broker lists
// the key (docs/SECURITY.md, "How": revocation by removal), of the generation of signing keys
// that signs now (key rotation).
type Signers interface {
	// Issuer returns the issuer of instance iid's credentials; trust is the generation its
	// registration's proof was keyed by, registered says its gate was seen registered and open.
	// A refusal is a *fault.Error.
	Issuer(ctx context.Context, iid string, trust uint64, registered bool) (*Issuer, error)
	// Room refuses, writing nothing, an instance Issuer would refuse for want of room.
	Room(ctx context.Context, iid string, registered bool) error
	// Main returns the issuer of what no instance's key signs (the auth callout's users).
	Main(ctx context.Context) (*Issuer, error)
	// Withdraw takes iid's key off, best effort and without waiting, once its first
	// registration was refused after Issuer listed it: only while its gate is still absent.
	Withdraw(iid string)
	// Committed says iid's first registration committed: its key, read still listed, is taken
	// to be live.
	Committed(ctx context.Context, iid string)
}

// Pipeline mints for one account.
type Pipeline struct {
	// Issuer signs every credential when Signers is nil (a plane without the operator signing
	// key).
	Issuer *Issuer
	// Signers, when set, signs each instance's credentials with the instance's own key.
	Signers Signers
	Audit   Recorder
	// Claims are the claims on user nkeys: a key another instance claimed is refused before
	// signing, and a new one claimed in the commit.
	Claims *Claims
	// NewKeys, when set, is the budget of keys each owner claims anew. A claim is for life and
	// every new key's `minted` record stays in the shared minted stream for its retention, so
	// how many one owner creates in that time is bounded; a plan past it is refused
	// resource-exhausted before it signs anything. Keys an instance already holds cost nothing;
	// a first registration's instance signing key, which it lists, costs one.
	NewKeys *KeyBudgets
	Now     func() time.Time
	// Limits bound every credential it mints (subscriptions, payload).
	Limits Limits
	// Fenced reports that this plane was fenced by a newer registration of its own instance; a
	// mint checks it last before committing and is discarded if it says so. Nil: never.
	Fenced func() bool
	// BeforeCommit, when set, runs after the hook and before the first commit: a test seam for
	// races against the commit fence of the whole plane (Plan.Hook is a plan's own stage).
	BeforeCommit func()
}

func (p *Pipeline) fenced() bool { return p.Fenced != nil && p.Fenced() }

// expired refuses credentials the clock has reached the expiry of since they were signed (a
// step of the wall clock, a stalled process): none leaves already expired. Nil if none has.
func (p *Pipeline) expired(out *Issued) *fault.Error {
	end := out.Earliest()
	if end > p.Now().Unix() {
		return nil
	}
	return fault.New(fault.Unavailable, "the clock passed a credential's expiry (%s) while it was minted; retry shortly",
		time.Unix(end, 0).UTC().Format(time.RFC3339))
}

// Issue runs plan. It returns the signed credentials only if every fence step committed, the
// plane was not fenced meanwhile, and the clock has not reached any of their expiries (it is
// read again before the commits and after them); otherwise a refusal, with the mint recorded
// `discarded` once it had been recorded `minted`. Every write stays within ctx's deadline: the
// work ends a little before it, so the discard record still has time. A plan with no fence step
// is refused: a credential that commits on nothing could outlive any fence.
func (p *Pipeline) Issue(ctx context.Context, plan Plan) (*Issued, error) {
	switch {
	case len(plan.Steps) == 0 || len(plan.Grants) == 0:
		return nil, fault.New(fault.Internal, "a mint needs at least one grant and one fence to commit on")
	case plan.Instance.IsZero():
		return nil, fault.New(fault.Internal, "a mint needs the instance its keys are claimed by")
	}
	now := p.Now()
	ceiling := plan.Ceiling.At
	if !ceiling.IsZero() && !ceiling.After(now) {
		return nil, fault.New(fault.PermissionDenied, "%s ended at %s; it issues nothing",
			plan.Ceiling.What, ceiling.UTC().Format(time.RFC3339))
	}
	work, cancel := audit.Reserve(ctx)
	defer cancel()
	keys := plan.keys()
	unclaimed, err := p.checkClaims(work, plan.Instance, keys)
	if err != nil {
		return nil, err
	}
	fresh := len(unclaimed)
	if plan.Instance.IsServerChosen() {
		fresh = len(keys) // no instance claims a key the broker chose: each is new
	}
	signed := p.Signers != nil && !plan.Instance.IsServerChosen()
	// A first registration lists its instance's key before it signs: one more key of its
	// owner's new ones, whether or not it commits.
	first := signed && !plan.Registered
	if first {
		fresh++
	}
	if signed {
		// A full space refuses before the budgets are spent: a refusal writes nothing.
		if err := p.Signers.Room(work, plan.Instance.ID(), plan.Registered); err != nil {
			return nil, err
		}
	}
	if err := p.spend(work, plan, fresh); err != nil {
		return nil, err
	}
	issuer := p.Issuer
	switch {
	case p.Signers == nil:
	case plan.Instance.IsServerChosen():
		issuer, err = p.Signers.Main(work)
	default:
		issuer, err = p.Signers.Issuer(work, plan.Instance.ID(), plan.Trust, plan.Registered)
	}
	if err != nil {
		return nil, err
	}

	out := &Issued{At: now, Credentials: make([]Credential, 0, len(plan.Grants))}
	// A first registration that does not commit takes its key off again, unless the outcome
	// of a commit is unknown or the deadline passed (a write sent may still land): then the
	// sweep takes it off once the registration can no longer commit.
	unsure := false
	if first {
		defer func() {
			if len(out.Revisions) < len(plan.Steps) && !unsure && work.Err() == nil {
				p.Signers.Withdraw(plan.Instance.ID())
			}
		}()
	}
	recorded := make([]audit.Credential, 0, len(plan.Grants))
	for _, g := range plan.Grants {
		exp := now.Add(g.TTL)
		if !ceiling.IsZero() && ceiling.Before(exp) {
			exp = ceiling
		}
		exp = time.Unix(exp.Unix(), 0)
		if exp.Unix() <= now.Unix() {
			if ceiling.IsZero() {
				return nil, fault.New(fault.Internal, "the %s credential's lifetime %s ends within the second", g.Duty, g.TTL)
			}
			return nil, fault.New(fault.PermissionDenied, "%s ends at %s, within the second; it issues nothing",
				plan.Ceiling.What, ceiling.UTC().Format(time.RFC3339))
		}
		token, err := issuer.Sign(User{Name: g.Principal, Key: g.Key, Permissions: g.Permissions, Expires: exp, Limits: p.Limits})
		if err != nil {
			return nil, fault.Wrap(fault.Internal, err, "signing the %s credential failed", g.Duty)
		}
		out.Credentials = append(out.Credentials, Credential{Duty: g.Duty, Key: g.Key, JWT: token, Exp: exp.Unix()})
		recorded = append(recorded, audit.Credential{Duty: string(g.Duty), NKey: g.Key, Exp: exp.Unix()})
	}

	discard := func(refusal *fault.Error) (*Issued, error) {
		p.Audit.Discarded(ctx, plan.Request, recorded, refusal)
		out := *refusal
		out.Cause = errors.Join(ErrDiscarded, refusal.Cause)
		return nil, &out
	}
	// Every nkey is on record before its commit, so an end can revoke all of them. If the
	// records cannot be written, nothing commits.
	if err := p.Audit.Minted(work, plan.Instance.ID(), plan.Request, recorded, subjects.NewSecret(12)); err != nil {
		return discard(fault.Store(err, "recording the mint"))
	}
	if plan.Hook != nil {
		if err := plan.Hook(work, out.Credentials); err != nil {
			return discard(fault.Store(err, "staging the mint"))
		}
	}
	if p.BeforeCommit != nil {
		p.BeforeCommit()
	}
	if p.fenced() {
		return discard(fault.New(fault.Unavailable, "this authority plane was fenced by a newer instance before the mint committed; retry shortly"))
	}
	if refusal := p.expired(out); refusal != nil {
		return discard(refusal)
	}
	// The new keys are claimed first: a key another instance claimed meanwhile refuses the
	// commit before any fence moves.
	if len(unclaimed) > 0 {
		if err := p.Claims.Take(work, plan.Instance, unclaimed); err != nil {
			return discard(p.claimRefusal(err, keys, "claiming its keys"))
		}
	}
	for i, s := range plan.Steps {
		rev, err := s.Commit(work)
		if err != nil {
			unsure = errors.Is(err, fence.ErrUnknownOutcome) || errors.Is(err, store.ErrUnknownOutcome)
			refusal := fault.Store(err, "committing the mint on %s", s.Fence)
			if rerr := release(work, plan.Steps[:i], err); rerr != nil {
				r := *refusal
				r.Cause = errors.Join(refusal.Cause, rerr)
				refusal = &r
			}
			return discard(refusal)
		}
		out.Revisions = append(out.Revisions, rev)
	}
	if p.fenced() {
		// Committed, and so valid, but a fenced plane answers nothing more (docs/OPERATIONS.md, "What it runs": the plane's own instance): it is
		// withheld, and the manager gets fresh credentials from the plane that fenced this one.
		return discard(fault.New(fault.Unavailable, "this authority plane was fenced by a newer instance as the mint committed; retry shortly"))
	}
	if refusal := p.expired(out); refusal != nil {
		return discard(refusal) // committed, but it would leave already expired
	}
	if first {
		p.Signers.Committed(work, plan.Instance.ID())
	}
	p.Audit.LogMinted(plan.Request, recorded)
	return out, nil
}

// keys are every key plan signs or binds, each once, with what named it.
func (plan *Plan) keys() []Key {
	var out []Key
	seen := map[string]bool{}
	add := func(k Key) {
		if !seen[k.NKey] {
			seen[k.NKey] = true
			out = append(out, k)
		}
	}
	for _, g := range plan.Grants {
		add(Key{NKey: g.Key, Field: g.Field})
	}
	for _, k := range plan.Binds {
		add(k)
	}
	return out
}

// checkClaims refuses, before anything is signed, a key another instance claimed
// (already-exists, naming the field that named it), and returns the keys no instance claimed
// yet: the commit claims them.
func (p *Pipeline) checkClaims(ctx context.Context, in Instance, keys []Key) ([]string, error) {
	nkeys := make([]string, len(keys))
	for i, k := range keys {
		nkeys[i] = k.NKey
	}
	unclaimed, err := p.Claims.Check(ctx, in, nkeys)
	if err != nil {
		return nil, p.claimRefusal(err, keys, "reading the claims on its keys")
	}
	return unclaimed, nil
}

// claimRefusal is the refusal of a claim read or write that failed during what: a key another
// instance claimed is already-exists, naming the field that named it.
func (p *Pipeline) claimRefusal(err error, keys []Key, what string) *fault.Error {
	var e *Elsewhere
	if !errors.As(err, &e) {
		return fault.Store(err, "%s", what)
	}
	field := "a key"
	for _, k := range keys {
		if k.NKey == e.NKey {
			field = k.Field
		}
	}
	return fault.Wrap(fault.AlreadyExists, err, "%s: nkey %s belongs to another manager instance; an nkey serves one instance for life, so generate a fresh one", field, e.NKey)
}

// release runs the Release of every step of landed (those that committed), last first, for a
// plan whose next step did not land for cause, and returns what failed.
func release(ctx context.Context, landed []Step, cause error) error {
	var errs []error
	for i := len(landed) - 1; i >= 0; i-- {
		if r := landed[i].Release; r != nil {
			errs = append(errs, r(ctx, cause))
		}
	}
	return errors.Join(errs...)
}
