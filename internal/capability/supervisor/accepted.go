package supervisor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"slices"

	"github.com/nats-io/jwt/v2"

	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/subjects"
)

// Accepted rows (`cotal_accepted_<space>`, reference "Accepted row"): which generation a
// lifecycle's supervisor (or executor) duty was first issued under. Each key is written once:
// the stream keeps one message per subject and discards a second, so not even a writer that
// bypasses this code can replace one.

// recorded are the duties whose generations a supervised lifecycle records.
var recorded = []subjects.Duty{subjects.DutySupervisor, subjects.DutyExecutor}

// accepted is an accepted row.
type accepted struct {
	Version int `json:"version"`
	Ref     Ref `json:"ref"`
}

// maxAcceptedRow bounds a stored accepted row.
const maxAcceptedRow = 4 << 10

func parseAccepted(data []byte) (accepted, error) {
	var a accepted
	if err := fault.DecodeRow(data, &a, maxAcceptedRow); err != nil {
		return accepted{}, err
	}
	if a.Version != 1 || a.Ref.Generation == "" {
		return accepted{}, errors.New("not a version 1 accepted row")
	}
	return a, nil
}

// AcceptedToken is the original's connectionAcceptedToken for a supervised lifecycle's duty:
// the first 32 hex characters of SHA-256 over "cotal.accepted.v1\0" and
// "platform-supervisor:<owner>:<iid>:<lifecycleUid>:<duty>".
func AcceptedToken(owner, iid, uid string, d subjects.Duty) string {
	sum := sha256.Sum256([]byte("cotal.accepted.v1\x00platform-supervisor:" + owner + ":" + iid + ":" + uid + ":" + string(d)))
	return hex.EncodeToString(sum[:])[:32]
}

// lifecycle is one supervised manager lifecycle: whose, which instance, which uid.
type lifecycle struct {
	owner, iid, uid string
}

// lifecycleOf is the lifecycle assignment a covers.
func lifecycleOf(a Assignment) lifecycle { return lifecycle{a.Owner, a.InstanceID, a.LifecycleUID} }

// acceptedOf is the fence of the lifecycle's accepted row for duty d.
func (s *Supervisor) acceptedOf(l lifecycle, d subjects.Duty) *fence.Fence[accepted] {
	return fence.New(s.Accepted, subjects.AcceptedKey(AcceptedToken(l.owner, l.iid, l.uid, d)), parseAccepted, nil)
}

// generation reads the lifecycle's recorded generation of duty d: nil when none was recorded.
// A row naming anything but this space, owner, duty actor and lifecycle is permission-denied.
func (s *Supervisor) generation(ctx context.Context, l lifecycle, d subjects.Duty) (*fence.Observed[accepted], error) {
	o, err := s.acceptedOf(l, d).Observe(ctx)
	if err != nil {
		return nil, fault.Store(err, "reading the %s generation of instance %s", d, l.iid)
	}
	if o.Absent() {
		return nil, nil
	}
	if r := o.Row.Ref; r.Space != s.Space || r.Owner != l.owner || r.Actor != subjects.DutyActor(d, l.iid, "") || r.UID != l.uid {
		return nil, fault.New(fault.PermissionDenied, "the accepted row of the %s generation of instance %s names another lifecycle", d, l.iid)
	}
	return o, nil
}

// resolveGenerations is the ended-assignment fence's second half: every recorded supervisor
// and executor generation of the lifecycle must resolve, or the lifecycle has ended.
func (s *Supervisor) resolveGenerations(ctx context.Context, l lifecycle) error {
	for _, d := range recorded {
		o, err := s.generation(ctx, l, d)
		if err != nil || o == nil {
			if err != nil {
				return err
			}
			continue
		}
		if _, err := s.resolve(ctx, o.Row.Ref); err != nil {
			if fault.CodeOf(err) == fault.PermissionDenied {
				return endedRefusal(l.owner, err)
			}
			return err
		}
	}
	return nil
}

// stage is a supervised mint's hook: for each supervisor or executor credential signed, the
// first issuance of the lifecycle stages, releases and accepts a generation whose ceiling is
// the credential's key and permissions and the assignment's end; a later one resolves the
// accepted generation and confirms the same ceiling. It runs after the `minted` record and
// before the commit, so a mint whose generation cannot be recorded commits nothing.
func (s *Supervisor) stage(l lifecycle, until int64) func(context.Context, []issue.Credential) error {
	return func(ctx context.Context, creds []issue.Credential) error {
		for _, c := range creds {
			if !slices.Contains(recorded, c.Duty) {
				continue
			}
			ceiling, err := ceilingOf(c, until)
			if err != nil {
				return err
			}
			if err := s.record(ctx, l, c.Duty, ceiling); err != nil {
				return err
			}
		}
		return nil
	}
}

// record records one duty's generation, or confirms the one recorded.
func (s *Supervisor) record(ctx context.Context, l lifecycle, d subjects.Duty, c Ceiling) error {
	o, err := s.generation(ctx, l, d)
	if err != nil {
		return err
	}
	if o != nil {
		return s.confirm(ctx, l, o.Row.Ref, c)
	}
	ref := Ref{Space: s.Space, Owner: l.owner, Actor: subjects.DutyActor(d, l.iid, ""), UID: l.uid, Generation: subjects.NewSecret(16)}
	staged, err := s.stageEvidence(ctx, Evidence{Ref: ref, Ceiling: c})
	if err != nil {
		return fault.Store(err, "staging the %s generation of instance %s", d, l.iid)
	}
	if err := s.Release(ctx, ref, staged); err != nil {
		return fault.Store(err, "releasing the %s generation of instance %s", d, l.iid)
	}
	absent, err := s.acceptedOf(l, d).Observe(ctx)
	if err != nil {
		return fault.Store(err, "reading the %s generation of instance %s", d, l.iid)
	}
	if absent.Absent() {
		_, err = absent.Write(ctx, accepted{Version: 1, Ref: ref})
		if err == nil {
			return nil
		}
		if !errors.Is(err, fence.ErrMoved) {
			return fault.Store(err, "accepting the %s generation of instance %s", d, l.iid)
		}
	}
	// A concurrent first issuance accepted its generation first: this one's is retired, and
	// the winner's must carry the same ceiling.
	if err := s.Retire(ctx, ref); err != nil {
		return err
	}
	won, err := s.generation(ctx, l, d)
	if err != nil {
		return err
	}
	if won == nil {
		return fault.New(fault.Unavailable, "the %s generation of instance %s was accepted and is not found; retry shortly", d, l.iid)
	}
	return s.confirm(ctx, l, won.Row.Ref, c)
}

// confirm resolves ref (an ended generation ends the lifecycle) and confirms ceiling c.
func (s *Supervisor) confirm(ctx context.Context, l lifecycle, ref Ref, c Ceiling) error {
	ev, err := s.resolve(ctx, ref)
	if fault.CodeOf(err) == fault.PermissionDenied {
		return endedRefusal(l.owner, err)
	}
	if err != nil {
		return err
	}
	return confirmCeiling(ev, c)
}

// ceilingOf is the ceiling of credential c issued under an assignment ending at until: its key
// and the permissions the signed JWT carries, read back from the JWT itself.
func ceilingOf(c issue.Credential, until int64) (Ceiling, error) {
	uc, err := jwt.DecodeUserClaims(c.JWT)
	if err != nil {
		return Ceiling{}, fault.Wrap(fault.Internal, err, "the %s credential does not decode", c.Duty)
	}
	if uc.Subject != c.Key {
		return Ceiling{}, fault.New(fault.Internal, "the %s credential is not for its identity's key", c.Duty)
	}
	return Ceiling{Key: c.Key, ExpiresAt: until, Permissions: Permissions{
		Publish:   rules(uc.Pub.Allow, uc.Pub.Deny),
		Subscribe: rules(uc.Sub.Allow, uc.Sub.Deny),
	}}, nil
}

// rules are a JWT permission's allow and deny lists in the evidence's shape, sorted (an empty
// allow list allows everything, to the broker).
func rules(allow, deny jwt.StringList) Rules {
	r := Rules{Allow: Allow{Mode: "all"}, Deny: sorted(deny)}
	if len(allow) > 0 {
		r.Allow = Allow{Mode: "patterns", Patterns: sorted(allow)}
	}
	return r
}

// sorted is a sorted copy of l, never nil (a stored row has no nulls).
func sorted(l jwt.StringList) []string {
	out := append([]string{}, l...)
	slices.Sort(out)
	return out
}
