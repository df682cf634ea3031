// Package ledger reads and writes the actor ledger: one row per principal naming its scopes.
// Scope is read fresh from the row on every request, never taken from a body.
package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cotal-ai/authplane/internal/body"
	"github.com/cotal-ai/authplane/internal/store"
	"github.com/cotal-ai/authplane/subjects"
)

// Scopes. None implies another.
const (
	Supervise     = "supervise"
	Admin         = "admin"
	PlatformAdmin = "platform-admin"
)

// ValidScope reports whether s is a known scope.
func ValidScope(s string) bool { return s == Supervise || s == Admin || s == PlatformAdmin }

// Row is `actor.<owner>.<actor>` in the actors bucket.
type Row struct {
	V            int      `json:"v"`
	Owner        string   `json:"owner"`
	Actor        string   `json:"actor"`
	Scope        []string `json:"scope"`
	LifecycleUID string   `json:"lifecycleUid,omitempty"`
	GrantedAt    int64    `json:"grantedAt"` // milliseconds
}

// Has reports whether the row grants scope.
func (r Row) Has(scope string) bool { return slices.Contains(r.Scope, scope) }

// ErrMalformed means a stored row does not parse; treat the principal as having no scope.
var ErrMalformed = errors.New("ledger row malformed")

// Reader is the part of a bucket the ledger reads.
type Reader interface {
	Get(ctx context.Context, key string) (store.Entry, error)
}

// Read returns the principal's row; found is false when it has none (a delete marker counts as
// none).
func Read(ctx context.Context, kv Reader, owner, actor string) (row Row, found bool, err error) {
	e, err := kv.Get(ctx, subjects.ActorKey(owner, actor))
	if errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrDeleted) {
		return Row{}, false, nil
	}
	if err != nil {
		return Row{}, false, err
	}
	if err := body.Decode(e.Value, &row); err != nil || row.V != 1 || row.Owner != owner || row.Actor != actor {
		return Row{}, false, fmt.Errorf("%w: %s", ErrMalformed, subjects.ActorKey(owner, actor))
	}
	return row, true, nil
}

// Writer is the part of a bucket Grant writes.
type Writer interface {
	Reader
	Create(ctx context.Context, key string, value []byte) (uint64, error)
	Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error)
}

// Grant writes the principal's row with exactly scope, by CAS, keeping its lifecycleUid.
func Grant(ctx context.Context, kv Writer, owner, actor string, scope []string, now time.Time) (Row, error) {
	if !subjects.ValidOwner(owner) {
		return Row{}, fmt.Errorf("owner %q: want u_ or p_ followed by 26 base32-lower characters", owner)
	}
	if !subjects.ValidActor(actor) {
		return Row{}, fmt.Errorf("actor %q: want [A-Za-z0-9_]{1,64}", actor)
	}
	scope = slices.Clone(scope)
	slices.Sort(scope)
	scope = slices.Compact(scope)
	for _, s := range scope {
		if !ValidScope(s) {
			return Row{}, fmt.Errorf("scope %q: want supervise, admin or platform-admin", s)
		}
	}
	key := subjects.ActorKey(owner, actor)
	for attempt := 0; ; attempt++ {
		row := Row{V: 1, Owner: owner, Actor: actor, Scope: scope, GrantedAt: now.UnixMilli()}
		e, err := kv.Get(ctx, key)
		var rev uint64
		switch {
		case err == nil:
			var old Row
			if json.Unmarshal(e.Value, &old) == nil {
				row.LifecycleUID = old.LifecycleUID
			}
			rev = e.Revision
		case errors.Is(err, store.ErrNotFound):
		case errors.Is(err, store.ErrDeleted):
			rev = e.Revision
		default:
			return Row{}, err
		}
		data, err := json.Marshal(row)
		if err != nil {
			return Row{}, err
		}
		if rev == 0 {
			_, err = kv.Create(ctx, key, data)
		} else {
			_, err = kv.Update(ctx, key, data, rev)
		}
		if err == nil {
			return row, nil
		}
		if !errors.Is(err, store.ErrCASLost) && !errors.Is(err, store.ErrUnknownOutcome) {
			return Row{}, err
		}
		if err := store.Pause(ctx, attempt); err != nil {
			return Row{}, fmt.Errorf("grant %s: %w", key, err)
		}
	}
}
