package signers

// The generations of signing keys the set lists: which sign, and how many fit; the room a
// first prepare needs.

import (
	"context"
	"fmt"
	"slices"

	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/issue"
)

// gens are the generations r lists.
func (r row) gens() []uint64 {
	if len(r.Gens) == 0 {
		return []uint64{0}
	}
	return r.Gens
}

// room reports whether an account JWT listing gens generations of live instances (and each
// generation's own key) fits within capacity keys besides one.
func room(gens, live, capacity int) bool { return gens*(live+1) <= capacity+1 }

// Room refuses, resource-exhausted as Issuer would, an instance whose key is not on the set
// when the set is at its capacity, reading the stored set and writing nothing: a mint asks it
// before it spends its tenant budgets, so a refusal for a full space costs none of them. A
// key this replica saw live, of a registered instance, needs no read. Issuer decides again.
func (s *Set) Room(ctx context.Context, iid string, registered bool) error {
	s.mu.Lock()
	known := registered && s.live[iid]
	s.mu.Unlock()
	if known {
		return nil
	}
	cur, err := s.fence().Observe(ctx)
	if err != nil {
		return fault.Store(err, "reading the signing keys of the data account")
	}
	if _, ok := cur.Row.Live[iid]; !ok && !room(len(cur.Row.gens()), len(cur.Row.Live)+1, s.Capacity) {
		return full(len(cur.Row.Live))
	}
	return nil
}

// full is the refusal of a key past the set's capacity, n live.
func full(n int) *fault.Error {
	return fault.New(fault.ResourceExhausted, "the space holds %d live manager instances, as many as the data account's JWT can list the signing keys of (it must fit in one broker message; while a scheduled rotation overlaps two generations, each instance has two keys there); retire one, or raise the broker's max_payload", n)
}

// Main returns the issuer of the current generation's own key: it signs the users of no
// instance (the auth callout's). Refusals: unavailable (stores).
func (s *Set) Main(ctx context.Context) (*issue.Issuer, error) {
	st, err := s.rotationState(ctx)
	if err != nil {
		return nil, err
	}
	iss, err := s.Keys.Main(st.Current)
	if err != nil {
		return nil, fault.Wrap(fault.Internal, err, "the data account's signing key")
	}
	return iss, nil
}

// rotationState is the rotation's state, read now, the current generation's root known.
func (s *Set) rotationState(ctx context.Context) (State, error) {
	if s.State == nil {
		return State{}, nil
	}
	st, err := s.State(ctx)
	if err == nil {
		err = s.Keys.Load(ctx, st.Current)
	}
	if err != nil {
		return State{}, fault.Store(err, "reading which signing keys sign")
	}
	return st, nil
}

// List lists exactly generations gens (sorted) on the data account and returns once every
// server of the broker holds a JWT that does, read back, or ctx ends. With fit, a list the
// JWT could not hold beside the live instances is refused (resource-exhausted) and nothing is
// written. Without the operator signing key it is ErrNoSigner.
func (s *Set) List(ctx context.Context, gens []uint64, fit bool) error {
	if s.Sign == nil {
		return ErrNoSigner
	}
	for _, g := range gens {
		if err := s.Keys.Load(ctx, g); err != nil {
			return err
		}
	}
	w := &waiter{op: opGens, gens: gens, fit: fit}
	s.await(ctx, w)
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case w.refused != nil:
		return w.refused
	case w.confirmed:
		return nil
	case w.err != nil:
		return w.err
	}
	return fmt.Errorf("list signing key generations %v: %w", gens, s.cause())
}

// liveCount counts the live instances, read now.
func (s *Set) liveCount(ctx context.Context) (int, error) {
	cur, err := s.fence().Observe(ctx)
	if err != nil {
		return 0, err
	}
	return len(cur.Row.Live), nil
}

// sign signs the JWT listing the keys of r.
func (s *Set) sign(ctx context.Context, r row) (string, int64, error) {
	pubs, err := s.pubs(ctx, r)
	if err != nil {
		return "", 0, err
	}
	return s.Sign(pubs, revoked(r))
}

// pubs are every signing key r lists, sorted: for each generation, its own key and those of
// the live instances.
func (s *Set) pubs(ctx context.Context, r row) ([]string, error) {
	out := make([]string, 0, len(r.gens())*(len(r.Live)+1))
	for _, g := range r.gens() {
		if err := s.Keys.Load(ctx, g); err != nil {
			return nil, err
		}
		main, err := s.Keys.Main(g)
		if err != nil {
			return nil, err
		}
		out = append(out, main.Signer())
		for iid := range r.Live {
			pub, err := s.Keys.PublicOf(g, iid)
			if err != nil {
				return nil, err
			}
			out = append(out, pub)
		}
	}
	slices.Sort(out)
	return out, nil
}

// Capacity is how many instance keys an account JWT signed by sign can list within maxPayload
// bytes (the broker's largest message, which a push and a read-back both are), leaving a KiB
// for the envelope of a push or of a resolver's exchange and room for MaxHolds held keys. What
// a key costs is measured: a JWT with 64 keys against one with the account's own alone
// (`"<56-character key>",` is 59 bytes of JSON, some 79 once base64url-encoded).
func Capacity(sign Signer, maxPayload int64) (int, error) {
	held := map[string]int64{}
	for _, k := range fakeKeys(nkeys.PrefixByteUser, MaxHolds) {
		held[k] = 1 << 33 // ten digits, as every time until the year 2286
	}
	empty, _, err := sign(nil, held)
	if err != nil {
		return 0, err
	}
	full, _, err := sign(fakeKeys(nkeys.PrefixByteAccount, 64), held)
	if err != nil {
		return 0, err
	}
	room := maxPayload - int64(len(empty)) - 1024
	per := int64(len(full) - len(empty))
	if room < per {
		return 0, fmt.Errorf("an account JWT of %d bytes leaves no room for a signing key within the broker's %d-byte messages", len(empty), maxPayload)
	}
	return int(room * 63 / per), nil // the empty JWT lists one key: full lists 63 more
}

// fakeKeys are n distinct public keys of prefix, for measuring what keys cost in a JWT.
func fakeKeys(prefix nkeys.PrefixByte, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		raw := make([]byte, 32)
		raw[0], raw[1] = byte(i), 0xa5
		k, err := nkeys.Encode(prefix, raw)
		if err != nil {
			panic(err) // a fixed prefix and 32 bytes always encode
		}
		keys[i] = string(k)
	}
	return keys
}
