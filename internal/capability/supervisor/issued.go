package supervisor

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/subjects"
)

// Issued evidence (`cotal_issued_<space>`, reference "Issued evidence"): one evidence row per
// generation, created once and never rewritten, and its attempt row, which only moves forward
// (prepared → active or aborted, active → revoked) by CAS. A generation authorizes only while
// its attempt is active, its evidence unexpired, and a second read agrees.

// Attempt states. Aborted and revoked are terminal.
const (
	Prepared = "prepared"
	Active   = "active"
	Aborted  = "aborted"
	Revoked  = "revoked"
)

// Ref names one generation of a duty's credentials.
type Ref struct {
	Space      string `json:"space"`
	Owner      string `json:"owner"`
	Actor      string `json:"actor"`
	UID        string `json:"uid"`
	Generation string `json:"generation"`
}

// key is the evidence row's key.
func (r Ref) key() string { return subjects.EvidenceKey(r.Owner, r.Actor, r.UID, r.Generation) }

// Rules are one direction's permissions, in the original's shape: an allow (all, none or
// patterns) and a deny list.
type Rules struct {
	Allow Allow    `json:"allow"`
	Deny  []string `json:"deny"`
}

// Allow is a Rules' allow: mode "all", "none", or "patterns" with its patterns.
type Allow struct {
	Mode     string   `json:"mode"`
	Patterns []string `json:"patterns,omitempty"`
}

// Permissions are what a generation's credentials may publish and subscribe.
type Permissions struct {
	Publish   Rules `json:"publish"`
	Subscribe Rules `json:"subscribe"`
}

// Ceiling is what a generation may ever authorize: one key, its permissions, and the end of
// the assignment it was issued under (seconds). A later issuance confirms the same ceiling;
// renewals never widen it.
type Ceiling struct {
	Key         string      `json:"key"`
	Permissions Permissions `json:"permissions"`
	ExpiresAt   int64       `json:"expiresAt"`
}

// Evidence is an evidence row: the generation and its ceiling. A supervisor generation has no
// sources (its authority is the assignment), so it always carries expiresAt.
type Evidence struct {
	Version int      `json:"version"`
	Ref     Ref      `json:"ref"`
	Sources []string `json:"sources"`
	Ceiling
}

// attempt is an attempt row: the state of a generation, and the digest of its evidence.
type attempt struct {
	Version int    `json:"version"`
	State   string `json:"state"`
	Digest  string `json:"digest"`
	Nonce   string `json:"nonce"`
}

// Bounds of the stored evidence and attempt rows (an evidence row carries a duty's
// permissions: a few patterns).
const (
	maxEvidenceRow = 16 << 10
	maxAttemptRow  = 1 << 10
)

func parseEvidence(data []byte) (Evidence, error) {
	var e Evidence
	if err := fault.DecodeRow(data, &e, maxEvidenceRow); err != nil {
		return Evidence{}, err
	}
	if e.Version != 1 || e.Ref.Generation == "" || e.Key == "" || e.ExpiresAt <= 0 || len(e.Sources) != 0 {
		return Evidence{}, errors.New("not a version 1 supervisor generation")
	}
	return e, nil
}

func parseAttempt(data []byte) (attempt, error) {
	var a attempt
	if err := fault.DecodeRow(data, &a, maxAttemptRow); err != nil {
		return attempt{}, err
	}
	if a.Version != 1 || !slices.Contains([]string{Prepared, Active, Aborted, Revoked}, a.State) || a.Nonce == "" {
		return attempt{}, errors.New("not a version 1 attempt")
	}
	return a, nil
}

// evidenceOf and attemptOf are the fences of ref's rows in the issued bucket.
func (s *Supervisor) evidenceOf(ref Ref) *fence.Fence[Evidence] {
	return fence.New(s.Issued, ref.key(), parseEvidence, nil)
}

func (s *Supervisor) attemptOf(ref Ref) *fence.Fence[attempt] {
	return fence.New(s.Issued, subjects.AttemptKey(ref.key()), parseAttempt, func(a *attempt) { a.Nonce = subjects.NewNonce() })
}

// digest is the attempt's digest of evidence as stored.
func digest(raw []byte) string {
	sum := sha256.Sum256(raw)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// stageEvidence creates ev's evidence and its attempt `prepared`, each create-only; a
// generation that exists is a conflict. It returns the staged attempt, for Release.
func (s *Supervisor) stageEvidence(ctx context.Context, ev Evidence) (*fence.Observed[attempt], error) {
	ev.Version, ev.Sources = 1, []string{}
	o, err := s.evidenceOf(ev.Ref).Observe(ctx)
	if err != nil {
		return nil, err
	}
	if !o.Absent() {
		return nil, fault.New(fault.Conflict, "generation %s of %s exists already", ev.Ref.Generation, ev.Ref.Actor)
	}
	written, err := o.Write(ctx, ev)
	if errors.Is(err, fence.ErrMoved) {
		return nil, fault.Wrap(fault.Conflict, err, "generation %s of %s was staged concurrently", ev.Ref.Generation, ev.Ref.Actor)
	}
	if err != nil {
		return nil, err
	}
	a, err := s.attemptOf(ev.Ref).Observe(ctx)
	if err != nil {
		return nil, err
	}
	if !a.Absent() {
		return nil, fault.New(fault.Conflict, "generation %s of %s has an attempt already", ev.Ref.Generation, ev.Ref.Actor)
	}
	return a.Write(ctx, attempt{Version: 1, State: Prepared, Digest: digest(written.Raw)})
}

// Release moves a staged attempt to active, pinned to the revision staged; on any error it
// retires the generation (what is staged and not released never authorizes anything).
func (s *Supervisor) Release(ctx context.Context, ref Ref, staged *fence.Observed[attempt]) error {
	next := staged.Row
	next.State = Active
	if _, err := staged.Write(ctx, next); err != nil {
		return errors.Join(err, s.Retire(ctx, ref))
	}
	return nil
}

// resolve returns ref's evidence if the generation authorizes now: its evidence exists, its
// attempt is active and names that evidence, it has not expired, and a second read of the
// attempt finds it unmoved. Anything else is permission-denied; a store failure is unavailable.
func (s *Supervisor) resolve(ctx context.Context, ref Ref) (*Evidence, error) {
	denied := func(why string, args ...any) (*Evidence, error) {
		return nil, fault.New(fault.PermissionDenied, "generation %s of %s does not resolve: %s", ref.Generation, ref.Actor, fmt.Sprintf(why, args...))
	}
	ev, err := s.evidenceOf(ref).Observe(ctx)
	if err != nil {
		return nil, fault.Store(err, "reading generation %s", ref.Generation)
	}
	if ev.Absent() || ev.Row.Ref != ref {
		return denied("no evidence")
	}
	first, err := s.attemptOf(ref).Observe(ctx)
	if err != nil {
		return nil, fault.Store(err, "reading generation %s", ref.Generation)
	}
	switch {
	case first.Absent():
		return denied("no attempt")
	case first.Row.State != Active:
		return denied("it is %s", first.Row.State)
	case first.Row.Digest != digest(ev.Raw):
		return denied("its attempt names other evidence")
	case ev.Row.ExpiresAt <= s.Now().Unix():
		return denied("it expired at %s", time.Unix(ev.Row.ExpiresAt, 0).UTC().Format(time.RFC3339))
	}
	again, err := s.attemptOf(ref).Observe(ctx)
	if err != nil {
		return nil, fault.Store(err, "reading generation %s", ref.Generation)
	}
	if again.Revision != first.Revision {
		return denied("it moved while it was read")
	}
	return &ev.Row, nil
}

// confirmCeiling refuses a resolved generation whose ceiling is not c: a later issuance may never
// widen what the first one recorded (failed-precondition "different ceiling").
func confirmCeiling(ev *Evidence, c Ceiling) error {
	got, err1 := json.Marshal(ev.Ceiling)
	want, err2 := json.Marshal(c)
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	if !bytes.Equal(got, want) {
		return fault.New(fault.FailedPrecondition, "generation %s of %s was issued with a different ceiling (key, permissions or end)", ev.Ref.Generation, ev.Ref.Actor)
	}
	return nil
}

// Retire ends ref's generation for good: prepared → aborted, active → revoked, an absent
// attempt created revoked (so it can never be released). A terminal attempt is left as it is:
// a repeat is a no-op.
func (s *Supervisor) Retire(ctx context.Context, ref Ref) error {
	_, err := s.attemptOf(ref).Update(ctx, func(cur *fence.Observed[attempt]) (attempt, error) {
		next := cur.Row
		switch {
		case cur.Absent():
			return attempt{Version: 1, State: Revoked}, nil
		case next.State == Prepared:
			next.State = Aborted
		case next.State == Active:
			next.State = Revoked
		default:
			return attempt{}, fence.ErrKeep
		}
		return next, nil
	})
	if err != nil {
		return fault.Store(err, "retiring generation %s of %s", ref.Generation, ref.Actor)
	}
	return nil
}
