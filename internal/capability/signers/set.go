// Package signers is the data account's live signing keys. Every credential minted for a
// manager instance (its duties, its runs' drivers and mediators) is signed by that instance's
// own account signing key (Keys: derived, never stored), and the data account's JWT lists the
// key of every live instance besides the account's own. An end removes its instance's key: the
// broker then closes every connection whose credential that key signed and refuses them at
// connect. Removal needs no room, so no tenant's actions can stop another's end from revoking;
// the JWT holds the live instances, bounded by its capacity, not the ended keys of the last day.
//
// The set is one fence row (`signers.<account>` in the fence bucket): the live instances, each
// with when its key was added, and the issue time of the last JWT signed from it. The JWT is
// built from the row, signed with the operator signing key, pushed to every server and read
// back from each. Changes that come together share one round: one write of the row, one
// signing, one push and one read-back for all of them.
//
// A push replaces the account JWT a server's resolver holds, whatever its issue time; servers
// syncing their resolvers keep the newer by issue time, in whole seconds, and an equal one
// replaces. So every signing reserves an issue time later than the last one in the row, by CAS
// on the row it signed: no two JWTs share a second, and the newest carries every change before
// it. The wait for the next second comes before the row is read for the reservation.
package signers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/internal/platform/broker"
	"github.com/cotal-ai/authplane/internal/platform/space"
	"github.com/cotal-ai/authplane/subjects"
)

// Broker is the data account as the broker holds it, reached through the plane's system user:
// every server of a cluster answers.
type Broker interface {
	// Servers counts the cluster's servers.
	Servers(ctx context.Context) (int, error)
	// Push sends the account JWT token to every server's resolver.
	Push(ctx context.Context, token string) error
	// Lookup returns the account JWT each of the n servers' resolvers holds.
	Lookup(ctx context.Context, n int) ([]string, error)
	// ListConnections lists the account's connections on the n servers, and which servers
	// answered every page.
	ListConnections(ctx context.Context, n int) ([]broker.Connection, map[string]bool, error)
	// Kick closes connection cid on server.
	Kick(ctx context.Context, server string, cid uint64) error
}

// Signer signs the data account's JWT listing exactly signers (every generation's own key and
// the live instances' keys derived from it; nil lists the material's own key alone) and
// revoking held (each user key's credentials issued up to its unix second) with the operator
// signing key, and returns it with its issue time.
type Signer func(signers []string, held map[string]int64) (token string, issuedAt int64, err error)

// Set is the data account's live signing keys and the broker they are applied to. Fill every
// field but Wall and Keep; a nil Sign is a plane without the operator signing key.
type Set struct {
	// Gates is the fence bucket the row lives in; Account the data account's public key.
	Gates   fence.KV
	Account string
	Keys    *Keys
	Sign    Signer
	Broker  Broker
	// Now is the clock of when keys are added; Wall the one the JWT library stamps issue times
	// with (it reads time.Now, whatever Now says): the next second is waited for on it. Nil
	// Wall means time.Now.
	Now  func() time.Time
	Wall func() time.Time
	// Capacity is the most instances the set holds with one generation listed: the account JWT
	// that lists their keys must fit in one message of the broker (see Capacity). While two
	// generations are listed (a scheduled rotation's overlap) each instance has two keys there.
	Capacity int
	// Settle is how long after its key was added an instance whose gate is still absent is
	// taken never to register: its key goes at the next sweep. It must pass a request's deadline
	// twice over, plus the clock skew between replicas.
	Settle time.Duration
	// Keep, when set, keeps each JWT before it is pushed (the embedded broker's synced copy).
	Keep func(token string) error
	// State, when set, reads which generation of signing keys signs now and which keys the
	// proofs (Rotation.State); nil is generation 0 for both.
	State func(ctx context.Context) (State, error)

	mu      sync.Mutex
	waiting []*waiter
	running bool
	// life is Serve's context: the rounds end with it. runs tracks the goroutine of the run.
	life    context.Context
	runs    sync.WaitGroup
	lastErr error // the last failure of a round: what a waiter whose deadline came says
	// live are the instances whose key this replica saw confirmed at every server, and settled
	// those it saw registered: the sweep reads their gates no more.
	live, settled map[string]bool
	// nextRelease is the unix second the earliest hold of the row this replica wrote or read
	// passes (0: none).
	nextRelease int64
	once        sync.Once
	state       *rounds
	evicts      evictions
}

// row is the stored set: each live instance and the unix second its key was added (or last
// confirmed by a registration still to commit), and the generations of signing keys listed
// (none: generation 0 alone). The JWT lists, for every generation, its own key and the key of
// every live instance derived from it.
type row struct {
	V        int              `json:"v"`
	Account  string           `json:"account"`
	Live     map[string]int64 `json:"live"`
	Gens     []uint64         `json:"gens,omitempty"`
	Out      map[string]hold  `json:"out,omitempty"` // the JWT users' keys held out (Hold)
	IssuedAt int64            `json:"issuedAt"`
	Nonce    string           `json:"nonce"`
}

func (s *Set) fence() *fence.Fence[row] {
	return fence.New(s.Gates, subjects.SignersKey(s.Account), func(data []byte) (row, error) {
		var r row
		dec := json.NewDecoder(bytes.NewReader(data)) // up to Capacity instances: no request's limit
		dec.DisallowUnknownFields()
		if err := dec.Decode(&r); err != nil {
			return row{}, err
		}
		if _, err := dec.Token(); err != io.EOF {
			return row{}, errors.New("data after the set")
		}
		if r.V != 1 || r.Account != s.Account || r.Live == nil || (r.Gens != nil && (len(r.Gens) == 0 || !slices.IsSorted(r.Gens) || len(slices.Compact(slices.Clone(r.Gens))) != len(r.Gens))) {
			return row{}, errors.New("not a version 1 signer set of this account")
		}
		return r, validHolds(r)
	}, func(r *row) { r.Nonce = subjects.NewNonce() })
}

// Errors in an Outcome's Cause.
var (
	// ErrNoSigner: this plane does not hold the operator signing key.
	ErrNoSigner = space.ErrNoOperatorSigner
	// ErrUnconfirmed: the broker did not confirm the change before the deadline.
	ErrUnconfirmed = errors.New("the broker did not confirm the change of the data account's signing keys before the deadline")
)

// Outcome is what removing an instance's key came to.
type Outcome struct {
	// Done says every server's resolver holds an account JWT without the key, read back.
	Done bool
	// Reason says why it is not done; Cause is ErrNoSigner (the plane cannot sign the account)
	// or ErrUnconfirmed (the key is off the set: every later push and every start applies it).
	Reason string
	Cause  error
}

// op is what a waiter asks of a round.
type op int

const (
	opAdd op = iota
	opRemove
	opPush // sign and push the set as it is
	opGens // list exactly the generations gens
	// opWithdraw removes a key only while the instance's gate is absent: a first registration
	// refused after its key was listed.
	opWithdraw
	// opHold holds a JWT user's key (iids[0]) of owner out until until (Hold).
	opHold
)

// waiter is one change waiting for the round that makes it. Its fields after deadline are the
// rounds', under Set.mu.
type waiter struct {
	op   op
	iids []string
	// registered: an add for a mint that saw the instance's gate registered and open.
	registered bool
	// resign: a push that signs the set anew, rather than push the newest JWT again; via: a
	// push of the newest JWT through one server's own connection (nil: to every server).
	resign bool
	via    Broker
	// only: a remove (the sweep's) only of keys still added at these times.
	only map[string]int64
	// gens: what an opGens lists; fit: refuse it when the JWT would not hold them.
	gens     []uint64
	fit      bool
	owner    string
	until    int64
	deadline time.Time

	written   bool         // the row holds the change
	refused   *fault.Error // an add the set refused (a gate not open, no room): final
	confirmed bool         // every server holds a JWT with the change, read back
	err       error        // the change may not be in the row
	done      chan struct{}
	closed    bool
}

// Issuer returns the issuer of instance iid's credentials, of the generation of signing keys
// that signs now, once its key is on the set and every server of the broker lists it, read back.
// trust is the generation whose root keyed the proofs when the instance's registration was made:
// one an emergency rotation has replaced since is refused. registered says the mint saw the
// instance's gate registered and open: then a key this replica saw live is taken to be live still
// (only an end removes it, after freezing the gate, which the mint's commit fence catches).
// Refusals: expired (the registration predates an emergency rotation), failed-precondition (the
// gate is frozen or retired), resource-exhausted (the set is at its capacity), unavailable (the
// broker did not confirm it by the deadline; stores).
func (s *Set) Issuer(ctx context.Context, iid string, trust uint64, registered bool) (*issue.Issuer, error) {
	st, err := s.rotationState(ctx)
	if err != nil {
		return nil, err
	}
	if st.Trust != trust {
		return nil, fault.New(fault.Expired, "the signing key this registration was issued under was removed by an emergency rotation; prepare again")
	}
	iss, err := s.Keys.IssuerOf(st.Current, iid)
	if err != nil {
		return nil, fault.Wrap(fault.Internal, err, "deriving the signing key of instance %s", iid)
	}
	s.rounds() // the memory exists
	s.mu.Lock()
	known := registered && s.live[iid]
	if known {
		s.settled[iid] = true
	}
	s.mu.Unlock()
	if known {
		return iss, nil
	}
	w := &waiter{op: opAdd, iids: []string{iid}, registered: registered}
	s.await(ctx, w)
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case w.refused != nil:
		return nil, w.refused
	case w.confirmed:
		return iss, nil
	case w.err != nil:
		return nil, w.err
	}
	return nil, fault.Wrap(fault.Unavailable, s.cause(), "the broker did not confirm the signing key of instance %s before the deadline; retry shortly", iid)
}

// cause is the last failure of a round, or ErrUnconfirmed; it holds s.mu.
func (s *Set) cause() error {
	if s.lastErr != nil {
		return fmt.Errorf("%w: %w", ErrUnconfirmed, s.lastErr)
	}
	return ErrUnconfirmed
}

// Remove takes instance iid's key off the set and returns once every server of the broker
// holds an account JWT without it, read back, or ctx ends. An error means the key may still be
// on the set (a store failure, or the deadline before it was taken off); otherwise the Outcome
// says whether the broker confirmed it. The row is written even when the key is not on it: an
// add that read the row before and the gate before its freeze then fails its CAS, and reads the
// gate again.
func (s *Set) Remove(ctx context.Context, iid string) (*Outcome, error) {
	if s.Sign == nil {
		return &Outcome{Cause: ErrNoSigner, Reason: ErrNoSigner.Error() + "; the credentials expire at their clamp"}, nil
	}
	w := &waiter{op: opRemove, iids: []string{iid}}
	s.await(ctx, w)
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case w.confirmed:
		return &Outcome{Done: true}, nil
	case errors.Is(w.err, ErrNoSigner):
		return &Outcome{Cause: ErrNoSigner, Reason: ErrNoSigner.Error() + "; the credentials expire at their clamp"}, nil
	case !w.written:
		if w.err != nil {
			return nil, w.err
		}
		return nil, fault.Store(ctx.Err(), "taking the signing key of instance %s off the data account", iid)
	}
	return &Outcome{Cause: ErrUnconfirmed, Reason: s.cause().Error() + "; the key is off the set, which every later push and every start applies"}, nil
}

// Repush pushes the set to every server and returns once every one holds it, read back. With
// resign it signs the set anew (a start, whose account limits may have changed; a server
// that holds other keys); without, it pushes again the newest JWT when this replica signed it
// (a server that (re)joined holding an older one), and signs anew only when it did not. Without
// the operator signing key it returns ErrNoSigner.
func (s *Set) Repush(ctx context.Context, resign bool) error {
	if s.Sign == nil {
		return ErrNoSigner
	}
	return s.push(ctx, &waiter{op: opPush, resign: resign}, "sign and push")
}

// PushVia pushes the newest JWT this replica signed to the server via reaches, over its own
// connection (a server that (re)joined, before its routes carry anything), and returns once that
// server took it; when another replica signed since, a round signs anew and pushes to every
// server. It is serialized with the rounds, so it never pushes a JWT older than one this replica
// pushed before it.
func (s *Set) PushVia(ctx context.Context, via Broker) error {
	if s.Sign == nil {
		return ErrNoSigner
	}
	return s.push(ctx, &waiter{op: opPush, via: via}, "push")
}

// push waits for w, a push of Repush or PushVia, and says how it ended; what names it in the
// error of a push no server confirmed.
func (s *Set) push(ctx context.Context, w *waiter, what string) error {
	s.await(ctx, w)
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case w.confirmed:
		return nil
	case w.err != nil:
		return w.err
	}
	return fmt.Errorf("%s the data account's signing keys: %w", what, s.cause())
}

// await queues w for the rounds, starting their run if none is under way, and returns once a
// round closed w or ctx ended (then w is closed); w's fields are read under s.mu.
func (s *Set) await(ctx context.Context, w *waiter) {
	w.deadline, _ = ctx.Deadline()
	if w.deadline.IsZero() {
		w.deadline = time.Now().Add(time.Minute)
	}
	s.queue(w)
	select {
	case <-w.done:
	case <-ctx.Done():
	}
	s.mu.Lock()
	s.close(w)
	s.mu.Unlock()
}

// queue queues w, whose deadline is set, for the rounds, starting their run if none is under
// way; after Serve's context ended it closes w at once.
func (s *Set) queue(w *waiter) {
	w.done = make(chan struct{})
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.life != nil && s.life.Err() != nil {
		s.close(w)
		return
	}
	s.waiting = append(s.waiting, w)
	if !s.running {
		s.running = true
		s.runs.Go(s.run)
	}
}

// close ends w's wait; it holds s.mu.
func (s *Set) close(w *waiter) {
	if !w.closed {
		w.closed = true
		close(w.done)
	}
}

// run serves rounds until no one waits. One runs at a time per Set, for every change of the
// process: a round serves everyone waiting when it signs.
func (s *Set) run() {
	r := s.rounds()
	for {
		ws, deadline := s.open()
		if len(ws) == 0 {
			return
		}
		ctx, cancel := context.WithDeadline(s.parent(), deadline)
		r.serve(ctx)
		cancel()
	}
}

// rounds is the state the rounds keep from one run to the next (the issue time signed last,
// above all: a run that forgot it would try to sign again in the same second).
func (s *Set) rounds() *rounds {
	s.once.Do(func() {
		s.state = &rounds{s: s, reach: &reach{Broker: s.Broker}}
		s.mu.Lock()
		s.live, s.settled = map[string]bool{}, map[string]bool{}
		s.mu.Unlock()
	})
	return s.state
}

// open returns the waiters still waiting and the latest of their deadlines, closing those
// whose deadline passed; with none left, the run ends (under the same lock as a change that
// would start one).
func (s *Set) open() ([]*waiter, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	open := s.waiting[:0]
	now := time.Now()
	ended := s.life != nil && s.life.Err() != nil
	var deadline time.Time
	for _, w := range s.waiting {
		if !w.closed && (ended || now.After(w.deadline)) {
			s.close(w)
		}
		if !w.closed {
			open = append(open, w)
			if w.deadline.After(deadline) {
				deadline = w.deadline
			}
		}
	}
	clear(s.waiting[len(open):])
	s.waiting = open
	if len(open) == 0 {
		s.running = false
	}
	return slices.Clone(open), deadline
}

// wall is the clock the JWT library stamps issue times with.
func (s *Set) wall() time.Time {
	if s.Wall == nil {
		return time.Now()
	}
	return s.Wall()
}
