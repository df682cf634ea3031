package issue

// The claims on user nkeys: `nkey.<pub>` in the fence bucket names the one
// manager instance a key belongs to, for life. The issuance pipeline refuses a key another
// instance claimed before it signs anything and claims each new key in the commit that mints
// it; an end revokes exactly the keys its instance claimed. Without the claim, one owner could
// name another owner's key, and ending the first instance would revoke the second's
// credentials at the broker.

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/subjects"
)

// Instance is the manager instance keys are claimed by: an instance id that passed its
// grammar, and the owner it is registered to; or ServerChosen. The zero Instance is neither: a
// plan that names it is refused.
type Instance struct {
	owner, id string
	server    bool
}

// ServerChosen is what the keys of the auth callout's users of owner belong to: the broker
// chose each for one connection (the client never names it), so no instance claims it, no end
// revokes it, and its user expires with its bearer. Each is a new key all the same, with its
// `minted` record in the stream every tenant shares: it counts against owner's connection keys
// (issue.KeyBudgets).
func ServerChosen(owner string) Instance { return Instance{owner: owner, server: true} }

// instanceOf returns owner's instance iid, or an error if either is off its grammar.
func instanceOf(owner, iid string) (Instance, error) {
	if !subjects.ValidUID(iid) || !subjects.ValidOwner(owner) {
		return Instance{}, fmt.Errorf("instance %q of owner %q is off the grammar", iid, owner)
	}
	return Instance{owner: owner, id: iid}, nil
}

// MustInstance is instanceOf for ids already checked (a request's, after its grammar).
func MustInstance(owner, iid string) Instance {
	in, err := instanceOf(owner, iid)
	if err != nil {
		panic(err)
	}
	return in
}

// ID is the instance id; "" for ServerChosen and the zero Instance.
func (i Instance) ID() string { return i.id }

// Owner is the owner the instance is registered to, or whose connections ServerChosen keys
// are minted for.
func (i Instance) Owner() string { return i.owner }

// IsServerChosen reports whether i is ServerChosen: its keys are new at every mint.
func (i Instance) IsServerChosen() bool { return i.server }

// IsZero reports whether i is neither an instance nor ServerChosen.
func (i Instance) IsZero() bool { return i.id == "" && !i.server }

// ErrElsewhere is in the chain of every refusal of a key another instance claimed.
var ErrElsewhere = errors.New("the key belongs to another instance")

// Elsewhere is the error of a key another instance claimed.
type Elsewhere struct{ NKey string }

func (e *Elsewhere) Error() string { return "nkey " + e.NKey + " belongs to another instance" }
func (e *Elsewhere) Unwrap() error { return ErrElsewhere }

// row is a claim.
type row struct {
	V          int    `json:"v"`
	NKey       string `json:"nkey"`
	InstanceID string `json:"instanceId"`
}

// maxRow bounds a stored claim.
const maxRow = 512

func of(kv fence.KV, nkey string) *fence.Fence[row] {
	return fence.New(kv, subjects.NKeyClaimKey(nkey), func(data []byte) (row, error) {
		var c row
		if err := fault.DecodeRow(data, &c, maxRow); err != nil {
			return row{}, err
		}
		if c.V != 1 || c.NKey != nkey || !subjects.ValidUID(c.InstanceID) {
			return row{}, errors.New("not a version 1 claim on this nkey")
		}
		return c, nil
	}, nil)
}

// Claims reads and writes claims. A claim never changes once written, so what it has read or
// written stays known (up to a bound): a renewal of keys already known costs no store round
// trip.
type Claims struct {
	KV fence.KV

	mu    sync.Mutex
	known map[string]string // nkey → instance id
}

// maxKnown bounds the claims kept known; past it the memory starts over.
const maxKnown = 1 << 16

func (c *Claims) learn(nkey, iid string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.known == nil || len(c.known) >= maxKnown {
		c.known = map[string]string{}
	}
	c.known[nkey] = iid
}

func (c *Claims) lookup(nkey string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	iid, ok := c.known[nkey]
	return iid, ok
}

// Holder returns the instance id that claimed nkey, "" if none has.
func (c *Claims) Holder(ctx context.Context, nkey string) (string, error) {
	if iid, ok := c.lookup(nkey); ok {
		return iid, nil
	}
	o, err := of(c.KV, nkey).Observe(ctx)
	if err != nil {
		return "", err
	}
	if o.Absent() {
		return "", nil
	}
	c.learn(nkey, o.Row.InstanceID)
	return o.Row.InstanceID, nil
}

// Check refuses keys another instance claimed (an *Elsewhere for the first of keys, in order,
// that is) and returns those no instance has claimed yet, all read at once.
func (c *Claims) Check(ctx context.Context, in Instance, keys []string) ([]string, error) {
	if in.server {
		return nil, nil
	}
	holders := make([]string, len(keys))
	errs := make([]error, len(keys))
	var wg sync.WaitGroup
	for i, k := range keys {
		if iid, ok := c.lookup(k); ok {
			holders[i] = iid
			continue
		}
		wg.Go(func() { holders[i], errs[i] = c.Holder(ctx, k) })
	}
	wg.Wait()
	var absent []string
	for i, k := range keys {
		switch {
		case errs[i] != nil:
			return nil, fmt.Errorf("read the claim on %s: %w", k, errs[i])
		case holders[i] == "":
			absent = append(absent, k)
		case holders[i] != in.id:
			return nil, &Elsewhere{NKey: k}
		}
	}
	return absent, nil
}

// Take claims keys for in, create-only, all at once: a claim in holds already stands, and one
// another instance holds is an *Elsewhere (for the first of keys, in order). Every write runs
// to its end: a claim cut short would be of unknown outcome.
func (c *Claims) Take(ctx context.Context, in Instance, keys []string) error {
	if in.id == "" {
		return errors.New("a claim needs an instance")
	}
	errs := make([]error, len(keys))
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Go(func() {
			_, err := of(c.KV, k).Update(ctx, func(cur *fence.Observed[row]) (row, error) {
				switch {
				case cur.Absent():
					return row{V: 1, NKey: k, InstanceID: in.id}, nil
				case cur.Row.InstanceID == in.id:
					return row{}, fence.ErrKeep
				}
				c.learn(k, cur.Row.InstanceID)
				return row{}, &Elsewhere{NKey: k}
			})
			if err == nil {
				c.learn(k, in.id)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
