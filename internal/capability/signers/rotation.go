package signers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/internal/platform/broker"
	"github.com/cotal-ai/authplane/subjects"
)

// The kinds of rotation.
const (
	// Scheduled: the new generation is listed beside the old, signs from the switch, and the
	// old one leaves once the last credential it signed has expired. Nothing live breaks.
	Scheduled = "scheduled"
	// Emergency: the old generations leave as soon as the new one signs, the bearer issuer
	// key is replaced and the old ones retired at once, and the proofs are keyed anew: every
	// credential of the old keys is refused and its connection closed.
	Emergency = "emergency"
)

// The steps of a rotation, in order. Each but StepGenerated is stored in the row once made; a
// rotation resumed (by any replica's tick, or the command run again) goes on from the last one
// stored, and each step checks its own state first, so a crash after any of them completes.
const (
	StepBegun     = "begun"     // the rotation is under way: one at a time
	StepGenerated = "generated" // the new generation's root is stored (the keys bucket)
	StepListed    = "listed"    // the JWT lists the new generation, confirmed by every server
	StepBearers   = "bearers"   // emergency: a new bearer key signs, every other is retired
	StepSwitched  = "switched"  // the new generation signs (emergency: and keys the proofs)
	StepRemoved   = "removed"   // the JWT lists the new generation alone, confirmed
	StepEvicted   = "evicted"   // no connection of a key the JWT no longer lists is left
	StepDone      = "done"      // the row holds no rotation: only this step says done
)

// steps are the stored steps of each kind, in order.
var steps = map[string][]string{
	Scheduled: {StepBegun, StepListed, StepSwitched, StepRemoved, StepEvicted},
	Emergency: {StepBegun, StepListed, StepBearers, StepSwitched, StepRemoved, StepEvicted},
}

// State is which generation of the data account's signing keys signs now, and which keys the
// registration proofs (the last emergency rotation's; 0 until one happens).
type State struct {
	Current uint64
	Trust   uint64
}

// rotRow is the stored rotation: `rotation.<account>` in the fence bucket. An absent row is
// generation 0, signing and trusted since the space began.
type rotRow struct {
	V       int    `json:"v"`
	Account string `json:"account"`
	Current uint64 `json:"current"`
	Trust   uint64 `json:"trust"`
	// Since is when Current began signing (unix seconds; 0: since the space began).
	Since int64 `json:"since"`
	// CredsUntil is the latest expiry `authplane creds` signed with Current (unix seconds).
	CredsUntil int64  `json:"credsUntil,omitempty"`
	Op         *rotOp `json:"op,omitempty"`
	Nonce      string `json:"nonce"`
}

// rotOp is the rotation under way.
type rotOp struct {
	ID   string `json:"opId"`
	Kind string `json:"kind"`
	Step string `json:"step"`
	// From is the generation that signed when it began; To the new one.
	From  uint64 `json:"from"`
	To    uint64 `json:"to"`
	Begun int64  `json:"begun"`
	// Longest is the longest life of a credential signed with a generation (seconds).
	Longest int64 `json:"longest"`
	// Switched is when To began signing; OldCredsUntil the latest expiry `authplane creds`
	// signed with the generations that leave.
	Switched      int64  `json:"switched,omitempty"`
	OldCredsUntil int64  `json:"oldCredsUntil,omitempty"`
	Bearer        string `json:"bearer,omitempty"`
}

// Bearers is the bearer issuer's key set, as an emergency rotation replaces it.
type Bearers interface {
	// Replace makes a key added at since or later the one that signs (adding a fresh one if
	// none is) and retires every other at once; it returns the signing key's kid.
	Replace(ctx context.Context, since time.Time) (string, error)
}

// Servers is the broker as a rotation checks it, server by server.
type Servers interface {
	// Held returns, by server name, the data account JWT each of the n servers applies.
	Held(ctx context.Context, n int) (map[string]string, error)
	// ListConnections lists the data account's connections on the n servers, and which
	// servers answered every page.
	ListConnections(ctx context.Context, n int) ([]broker.Connection, map[string]bool, error)
}

// Rotation replaces the data account's signing keys (docs/OPERATIONS.md, "Rotate the signing
// keys"): one rotation at a time per space, a lifecycle in the row `rotation.<account>` whose
// every step is stored and re-enterable. Fill Set, Now, Longest and Slack; Bearers and Servers
// for an emergency.
type Rotation struct {
	Set *Set
	// Now is the clock of the schedule and of when the old keys may leave.
	Now func() time.Time
	// Longest is the longest life of a credential signed with one generation (the standing
	// TTL, the plane's own users', a bearer's); Slack what a mint that read the old generation
	// may still take to sign, plus the clock skew between replicas.
	Longest, Slack time.Duration
	Bearers        Bearers
	Servers        Servers
	// StopAfter, a test seam, stops the lifecycle as a crash would once step is made.
	StopAfter func(step string) bool

	once sync.Once
	row  *fence.Fence[rotRow]
}

// ErrStopped: StopAfter stopped the rotation after a step.
var ErrStopped = errors.New("the rotation stopped after a step (a test seam)")

func (r *Rotation) fence() *fence.Fence[rotRow] {
	r.once.Do(func() {
		account := r.Set.Account
		// Every mint reads the row: reads that come together share one get, sent after each
		// of them began (fence.Shared), so a mint never signs with a generation older than
		// what the row held when it began.
		r.row = fence.New(fence.Share(r.Set.Gates), subjects.RotationKey(account), func(data []byte) (rotRow, error) {
			var row rotRow
			if err := fault.DecodeRow(data, &row, 4<<10); err != nil {
				return rotRow{}, err
			}
			if row.V != 1 || row.Account != account || (row.Op != nil && (steps[row.Op.Kind] == nil || !slices.Contains(steps[row.Op.Kind], row.Op.Step))) {
				return rotRow{}, errors.New("not a version 1 rotation of this account")
			}
			return row, nil
		}, func(row *rotRow) { row.Nonce = subjects.NewNonce() })
	})
	return r.row
}

// observe reads the row (absent: generation 0 since the space began).
func (r *Rotation) observe(ctx context.Context) (*fence.Observed[rotRow], error) {
	o, err := r.fence().Observe(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the signing key rotation: %w", err)
	}
	if o.Absent() {
		o.Row = rotRow{V: 1, Account: r.Set.Account}
	}
	return o, nil
}

// State reads which generation signs now and which keys the proofs.
func (r *Rotation) State(ctx context.Context) (State, error) {
	o, err := r.observe(ctx)
	if err != nil {
		return State{}, err
	}
	return State{Current: o.Row.Current, Trust: o.Row.Trust}, nil
}

// Trust returns the generation whose root keys the registration proofs now, and that root.
func (r *Rotation) Trust(ctx context.Context) (uint64, nkeys.KeyPair, error) {
	st, err := r.State(ctx)
	if err == nil {
		err = r.Set.Keys.Load(ctx, st.Trust)
	}
	if err != nil {
		return 0, nil, fault.Store(err, "reading which key the registration proofs")
	}
	root, err := r.Set.Keys.Root(st.Trust)
	return st.Trust, root, err
}

// ForCreds returns the issuer `authplane creds` signs a credential expiring at exp with: the
// current generation's own key. The expiry is stored first (the latest one per generation), so
// a scheduled rotation keeps the generation listed until the credential has expired.
func (r *Rotation) ForCreds(ctx context.Context, exp time.Time) (*issue.Issuer, error) {
	o, err := r.fence().Update(ctx, func(cur *fence.Observed[rotRow]) (rotRow, error) {
		row := r.orZero(cur)
		if row.CredsUntil >= exp.Unix() {
			return rotRow{}, fence.ErrKeep
		}
		row.CredsUntil = exp.Unix()
		return row, nil
	})
	if err != nil {
		return nil, fmt.Errorf("record the credential's expiry against the signing keys: %w", err)
	}
	gen := r.orZero(o).Current
	if err := r.Set.Keys.Load(ctx, gen); err != nil {
		return nil, err
	}
	return r.Set.Keys.Main(gen)
}

// orZero is the row observed, or generation 0's when it was never written.
func (r *Rotation) orZero(o *fence.Observed[rotRow]) rotRow {
	if o.Absent() {
		return rotRow{V: 1, Account: r.Set.Account}
	}
	return o.Row
}

// Begin begins a rotation of kind and takes it as far as it goes now (Resume). Refusals, with
// nothing written: failed-precondition (no operator signing key: the plane cannot re-sign the
// data account's JWT), conflict (a rotation is under way; an emergency one supersedes a
// scheduled one instead), resource-exhausted (a scheduled rotation's overlap would not fit in
// the JWT).
func (r *Rotation) Begin(ctx context.Context, kind string) (*Report, error) {
	if steps[kind] == nil {
		return nil, fault.New(fault.BadRequest, "no rotation of kind %q: want %s or %s", kind, Scheduled, Emergency)
	}
	if r.Set.Sign == nil {
		return nil, fault.Wrap(fault.FailedPrecondition, ErrNoSigner, "%s: the plane cannot re-sign the data account's JWT, so it cannot rotate its signing keys; rotate with nsc (docs/OPERATIONS.md, \"Rotate the signing keys\")", ErrNoSigner)
	}
	if kind == Scheduled {
		live, err := r.Set.liveCount(ctx)
		if err != nil {
			return nil, fault.Store(err, "reading the live instances")
		}
		if !room(2, live, r.Set.Capacity) {
			return nil, fault.New(fault.ResourceExhausted, "a scheduled rotation lists two generations of signing keys while they overlap, and the data account's JWT cannot hold two keys for each of the %d live manager instances (it holds %d keys); retire instances, raise the broker's max_payload, or rotate --emergency", live, r.Set.Capacity+1)
		}
	}
	now := r.Now()
	var refused error
	_, err := r.fence().Update(ctx, func(cur *fence.Observed[rotRow]) (rotRow, error) {
		row := r.orZero(cur)
		to := row.Current + 1
		if op := row.Op; op != nil {
			if kind == Scheduled || op.Kind == Emergency {
				refused = fault.New(fault.Conflict, "the %s rotation %s is under way (step %s, generation %d to %d); one rotation at a time: `authplane keys rotate-signing --resume` completes it", op.Kind, op.ID, op.Step, op.From, op.To)
				return rotRow{}, refused
			}
			to = max(to, op.To+1) // an emergency supersedes a scheduled rotation
		}
		row.Op = &rotOp{ID: subjects.NewUID(), Kind: kind, Step: StepBegun, From: row.Current, To: to, Begun: now.Unix(), Longest: int64(r.Longest.Seconds())}
		return row, nil
	})
	if refused != nil {
		return nil, refused
	}
	if err != nil {
		return nil, fault.Store(err, "beginning the rotation")
	}
	if r.stop(StepBegun) {
		return nil, ErrStopped
	}
	return r.Resume(ctx)
}

// Due begins a scheduled rotation when no rotation is under way and the current generation
// has signed for every or longer; a row never written is written first, so the schedule counts
// from then. It reports the rotation begun, or nil.
func (r *Rotation) Due(ctx context.Context, every time.Duration) (*Report, error) {
	o, err := r.observe(ctx)
	if err != nil || o.Row.Op != nil {
		return nil, err
	}
	if o.Absent() {
		row := o.Row
		row.Since = r.Now().Unix()
		if _, err := o.Write(ctx, row); err != nil && !errors.Is(err, fence.ErrMoved) {
			return nil, fmt.Errorf("start the signing key schedule: %w", err)
		}
		return nil, nil
	}
	if r.Now().Before(time.Unix(o.Row.Since, 0).Add(every)) {
		return nil, nil
	}
	rep, err := r.Begin(ctx, Scheduled)
	if fault.CodeOf(err) == fault.Conflict {
		return nil, nil // another replica began it first
	}
	return rep, err
}

// stop reports whether the test seam stops the rotation after step.
func (r *Rotation) stop(step string) bool { return r.StopAfter != nil && r.StopAfter(step) }
