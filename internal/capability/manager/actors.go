package manager

// The actor ledger: one row per principal naming its scopes.
// Scope is read fresh from the row on every request, never taken from a body.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/subjects"
)

// Scopes. None implies another.
const (
	Supervise     = "supervise"
	Admin         = "admin"
	PlatformAdmin = "platform-admin"
)

// validScope reports whether s is a known scope.
func validScope(s string) bool { return s == Supervise || s == Admin || s == PlatformAdmin }

// ActorRow is `actor.<owner>.<actor>` in the actors bucket.
type ActorRow struct {
	V            int      `json:"v"`
	Owner        string   `json:"owner"`
	Actor        string   `json:"actor"`
	Scope        []string `json:"scope"`
	LifecycleUID string   `json:"lifecycleUid,omitempty"`
	GrantedAt    int64    `json:"grantedAt"` // milliseconds
	// TokenHash, on a managed agent's row, is the hex SHA-256 of the secret it was spawned
	// with: what /exchange's agent arm checks, on every exchange (the secret is reusable).
	// Clearing it revokes the agent.
	TokenHash string `json:"tokenHash,omitempty"`
}

// Has reports whether the row grants scope.
func (r ActorRow) Has(scope string) bool { return slices.Contains(r.Scope, scope) }

// ErrMalformed means a stored row does not parse; treat the principal as having no scope.
var ErrMalformed = fence.ErrMalformed

// ActorOf returns the ledger row of principal owner.actor in the actors bucket kv.
// maxActorRow bounds a stored ledger row.
const maxActorRow = 4 << 10

func ActorOf(kv fence.KV, owner, actor string) *fence.Fence[ActorRow] {
	return fence.New(kv, subjects.ActorKey(owner, actor), func(data []byte) (ActorRow, error) {
		var r ActorRow
		if err := fault.DecodeRow(data, &r, maxActorRow); err != nil {
			return ActorRow{}, err
		}
		// A row without its scope list would read as no scope but could not be written
		// back (a nil list marshals as null, which no row may hold).
		if r.V != 1 || r.Owner != owner || r.Actor != actor || r.Scope == nil {
			return ActorRow{}, errors.New("not a version 1 row of this principal with its scope")
		}
		return r, nil
	}, nil)
}

// ReadActor returns the principal's row, read now from the stream leader; found is false when it
// has none (a delete marker counts as none).
func ReadActor(ctx context.Context, kv fence.KV, owner, actor string) (row ActorRow, found bool, err error) {
	o, err := ActorOf(kv, owner, actor).Observe(ctx)
	switch {
	case errors.Is(err, fence.ErrGone):
		return ActorRow{}, false, nil
	case err != nil:
		return ActorRow{}, false, err
	}
	return o.Row, !o.Absent(), nil
}

// SetScope writes the principal's row with exactly scope, by CAS, keeping its lifecycleUid. A
// row that holds a delete marker is refused (fence.ErrGone): the plane never deletes one.
func SetScope(ctx context.Context, kv fence.KV, owner, actor string, scope []string, now time.Time) (ActorRow, error) {
	if !subjects.ValidOwner(owner) {
		return ActorRow{}, fmt.Errorf("owner %q: want u_ or p_ followed by 26 base32-lower characters", owner)
	}
	if !subjects.ValidActor(actor) {
		return ActorRow{}, fmt.Errorf("actor %q: want [A-Za-z0-9_]{1,64}", actor)
	}
	scope = append([]string{}, scope...) // never null: a row's scope is a list, maybe empty
	slices.Sort(scope)
	scope = slices.Compact(scope)
	for _, s := range scope {
		if !validScope(s) {
			return ActorRow{}, fmt.Errorf("scope %q: want supervise, admin or platform-admin", s)
		}
	}
	o, err := ActorOf(kv, owner, actor).Update(ctx, func(cur *fence.Observed[ActorRow]) (ActorRow, error) {
		return ActorRow{V: 1, Owner: owner, Actor: actor, Scope: scope, LifecycleUID: cur.Row.LifecycleUID, GrantedAt: now.UnixMilli(), TokenHash: cur.Row.TokenHash}, nil
	})
	if err != nil {
		return ActorRow{}, fmt.Errorf("set the scope of %s: %w", subjects.ActorKey(owner, actor), err)
	}
	return o.Row, nil
}

// ErrNoAgentSecret is a revoke of a principal that holds no agent secret: no row, or a row
// that was never an agent's or was revoked already. Nothing is written.
var ErrNoAgentSecret = errors.New("no agent secret")

// SetAgentSecret makes the principal a managed agent whose exchange presents a secret hashing
// to tokenHash (hex SHA-256), keeping its scope; an empty tokenHash revokes the agent, and is
// ErrNoAgentSecret, writing nothing, when it holds no secret. A principal with no row gets one
// with no scope.
func SetAgentSecret(ctx context.Context, kv fence.KV, owner, actor, tokenHash string, now time.Time) (ActorRow, error) {
	if !subjects.ValidUserOwner(owner) {
		return ActorRow{}, fmt.Errorf("owner %q: an agent's owner is u_ followed by 26 base32-lower characters", owner)
	}
	if !subjects.ValidActor(actor) {
		return ActorRow{}, fmt.Errorf("actor %q: want [A-Za-z0-9_]{1,64}", actor)
	}
	o, err := ActorOf(kv, owner, actor).Update(ctx, func(cur *fence.Observed[ActorRow]) (ActorRow, error) {
		row := cur.Row
		if tokenHash == "" && (cur.Absent() || row.TokenHash == "") {
			return ActorRow{}, ErrNoAgentSecret
		}
		if cur.Absent() {
			row = ActorRow{V: 1, Owner: owner, Actor: actor, Scope: []string{}}
		}
		row.TokenHash, row.GrantedAt = tokenHash, now.UnixMilli()
		return row, nil
	})
	if err != nil {
		return ActorRow{}, fmt.Errorf("set the agent secret of %s: %w", subjects.ActorKey(owner, actor), err)
	}
	return o.Row, nil
}
