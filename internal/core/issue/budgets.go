package issue

import (
	"context"
	"slices"
	"time"

	"github.com/cotal-ai/authplane/internal/core/fault"
)

// Spend is one want of a stored tenant budget, and the refusal when its budget cannot give it.
type Spend struct {
	Want
	Refusal *fault.Error
}

// KeyBudgets bound how many keys an owner claims anew, and how many it has the broker choose
// (the auth callout's users, one for each connection): each is one more `minted` record in the
// stream every tenant shares. Both are kept in the store (StoredBudget): they hold per space,
// across restarts and replicas, at the cost of a read and a write on a mint that adds keys.
type KeyBudgets struct {
	PerOwner *StoredBudget
	// Window is what the budget is counted over (the minted records' retention), and Limit
	// the keys it allows in it, for the refusal.
	Window time.Duration
	Limit  int
	// PerOwnerConnections bounds the keys the broker chooses for an owner's connections:
	// ConnectionsLimit of them a bearer's life (ConnectionsWindow), enough for each connection
	// the owner may hold to connect again with each new bearer, and no more.
	PerOwnerConnections *StoredBudget
	ConnectionsWindow   time.Duration
	ConnectionsLimit    int
}

// spend takes plan's Spends and fresh new keys of its owner's, all or none, before anything
// is signed, and refuses with the refusal of the first budget that could not give its share.
func (p *Pipeline) spend(ctx context.Context, plan Plan, fresh int) error {
	spends := plan.Spends
	if keys := p.NewKeys.spend(plan.Instance, fresh); keys.From != nil {
		spends = append(slices.Clip(spends), keys)
	}
	if len(spends) == 0 {
		return nil
	}
	wants := make([]Want, len(spends))
	for i, s := range spends {
		wants[i] = s.Want
	}
	short, err := TakeAll(ctx, wants...)
	switch {
	case err != nil:
		return fault.Store(err, "reading the %s budget", wants[short].From.Budget)
	case short >= 0:
		return spends[short].Refusal
	}
	return nil
}

// spend is the want of n new keys from the budget of in's owner, and its refusal; a want of
// nothing (From nil) when none is bounded.
func (b *KeyBudgets) spend(in Instance, n int) Spend {
	if b == nil || n == 0 || in.Owner() == "" {
		return Spend{}
	}
	if in.IsServerChosen() {
		return Spend{Want: Want{From: b.PerOwnerConnections, Name: in.Owner(), N: n},
			Refusal: fault.Wrap(fault.ResourceExhausted, &Exceeded{Budget: ConnectionKeysOwner},
				"owner %s connected as often as it may for now (--max-connections-per-owner: %d in %s, a bearer's life): retry shortly", in.Owner(), b.ConnectionsLimit, b.ConnectionsWindow)}
	}
	return Spend{Want: Want{From: b.PerOwner, Name: in.Owner(), N: n},
		Refusal: fault.Wrap(fault.ResourceExhausted, &Exceeded{Budget: NewKeysOwner},
			"owner %s claimed its share of new keys for now (--new-keys-per-owner: %d in %s): renew with the keys its instances hold, or retry later", in.Owner(), b.Limit, b.Window)}
}
