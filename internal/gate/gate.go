// Package gate reads and writes endpoint gates (`epgate.<endpoint>.<iid>` in the auth bucket),
// the fence every mint commits on: a mint is valid only if a CAS rewriting the gate exactly as
// it was read lands, and every fence writer changes the row, so no mint commits after one.
package gate

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/cotal-ai/authplane/internal/body"
	"github.com/cotal-ai/authplane/internal/fault"
	"github.com/cotal-ai/authplane/internal/store"
)

// States of a gate. Retired is terminal.
const (
	Open    = "open"
	Frozen  = "frozen"
	Retired = "retired"
)

// Op kinds a frozen or retired gate carries.
const (
	OpActivation   = "activation"
	OpTakeover     = "takeover"
	OpRegistration = "registration"
	OpRetirement   = "retirement"
)

// Row is a gate's stored value (a closed schema: anything else is corruption).
type Row struct {
	State                 string        `json:"state"`
	Generation            uint64        `json:"generation"`
	ProcessEpoch          uint64        `json:"processEpoch"`
	RegistrationRevision  uint64        `json:"registrationRevision"`
	NameAuthorityRevision uint64        `json:"nameAuthorityRevision"`
	Principal             string        `json:"principal"`
	Op                    *Op           `json:"op,omitempty"`
	Registration          *Registration `json:"registration,omitempty"`
	// Nonce is new on every state-changing write, so a write whose outcome is unknown can be
	// settled by re-reading, and a row never returns to bytes it once had.
	Nonce string `json:"nonce"`
	// SupervisedUntil (seconds) is the end of the platform supervisor assignment a supervised
	// instance was prepared under: every mint for the instance is clamped to it.
	SupervisedUntil int64 `json:"supervisedUntil,omitempty"`
}

// Op is the operation that froze or retired a gate.
type Op struct {
	OpID      string `json:"opId"`
	Kind      string `json:"kind"`
	Successor string `json:"successor,omitempty"`
}

// Registration is what `prepare` recorded about a manager instance.
type Registration struct {
	LifecycleUID     string `json:"lifecycleUid"`
	IdentitiesDigest string `json:"identitiesDigest"`
	PreparedBy       string `json:"preparedBy"`
}

// Gate is a gate as observed: its row, the exact bytes read, and their revision.
type Gate struct {
	Key      string
	Row      Row
	Raw      []byte
	Revision uint64
}

// KV is the part of a bucket gates need.
type KV interface {
	Get(ctx context.Context, key string) (store.Entry, error)
	Create(ctx context.Context, key string, value []byte) (uint64, error)
	Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error)
}

// ErrMoved means the gate changed between the read a decision was made on and its commit.
var ErrMoved = errors.New("gate moved")

// Observe reads the gate at key. It returns nil (and no error) when the key was never
// written; a delete marker is failed-precondition; a row that does not parse is internal.
func Observe(ctx context.Context, kv KV, key string) (*Gate, error) {
	e, err := kv.Get(ctx, key)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, nil
	case errors.Is(err, store.ErrDeleted):
		return nil, fault.Wrap(fault.FailedPrecondition, err, "gate %s holds a delete marker; gates are never deleted", key)
	case err != nil:
		return nil, fault.Wrap(fault.Unavailable, err, "gate %s could not be read; retry shortly", key)
	}
	row, err := Parse(e.Value)
	if err != nil {
		return nil, fault.Wrap(fault.Internal, err, "gate %s is malformed", key)
	}
	return &Gate{Key: key, Row: row, Raw: e.Value, Revision: e.Revision}, nil
}

// Parse decodes and checks a stored row.
func Parse(data []byte) (Row, error) {
	var r Row
	if err := body.Decode(data, &r); err != nil {
		return Row{}, err
	}
	switch {
	case r.State != Open && r.State != Frozen && r.State != Retired:
		return Row{}, fmt.Errorf("state %q", r.State)
	case r.State == Open && r.Op != nil:
		return Row{}, errors.New("an open gate carries an op")
	case r.State != Open && r.Op == nil:
		return Row{}, fmt.Errorf("a %s gate carries no op", r.State)
	case r.Nonce == "":
		return Row{}, errors.New("no nonce")
	}
	if o, a, ok := strings.Cut(r.Principal, "."); !ok || o == "" || a == "" || strings.Contains(a, ".") {
		return Row{}, fmt.Errorf("principal %q", r.Principal)
	}
	return r, nil
}

// NewNonce returns a fresh writer-unique nonce.
func NewNonce() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic("gate: crypto/rand failed: " + err.Error())
	}
	return hex.EncodeToString(b)
}

// Commit is the commit fence of a mint made on observed gate g: it rewrites the row exactly as
// read, pinned to the revision read. If the CAS loses and the row is byte-for-byte unchanged
// (another mint committed in between), it retries at the new revision with jitter until ctx
// ends; if the row changed in any way, a fence writer got there first: ErrMoved.
func Commit(ctx context.Context, kv KV, g *Gate) error {
	rev := g.Revision
	for attempt := 0; ; attempt++ {
		_, err := kv.Update(ctx, g.Key, g.Raw, rev)
		if err == nil {
			return nil
		}
		if !errors.Is(err, store.ErrCASLost) && !errors.Is(err, store.ErrUnknownOutcome) {
			return err
		}
		now, rerr := Observe(ctx, kv, g.Key)
		switch {
		case rerr != nil && !retryable(rerr):
			return rerr
		case rerr != nil:
			// Unknown; read again after the pause.
		case now == nil || !bytes.Equal(now.Raw, g.Raw):
			return fmt.Errorf("commit %s: %w", g.Key, ErrMoved)
		default:
			rev = now.Revision
		}
		if err := store.Pause(ctx, attempt); err != nil {
			return fmt.Errorf("commit %s: %w", g.Key, err)
		}
	}
}

// Transition is a fence-changing write made on observed gate g (nil: the key was absent): it
// writes row under a fresh writer-unique nonce, pinned to the revision read. A CAS lost to a
// byte-identical rewrite (a mint committing) is retried at the new revision until ctx ends; a
// write of unknown outcome is settled by reading the nonce back; any real change since the
// read is ErrMoved, and the caller must decide again from a new read.
func Transition(ctx context.Context, kv KV, key string, g *Gate, row Row) (*Gate, error) {
	row.Nonce = NewNonce()
	data, err := json.Marshal(row)
	if err != nil {
		return nil, err
	}
	rev := uint64(0)
	if g != nil {
		rev = g.Revision
	}
	for attempt := 0; ; attempt++ {
		var n uint64
		if rev == 0 {
			n, err = kv.Create(ctx, key, data)
		} else {
			n, err = kv.Update(ctx, key, data, rev)
		}
		if err == nil {
			return &Gate{Key: key, Row: row, Raw: data, Revision: n}, nil
		}
		if errors.Is(err, store.ErrDeleted) {
			return nil, fault.Wrap(fault.FailedPrecondition, err, "gate %s holds a delete marker; gates are never deleted", key)
		}
		if !errors.Is(err, store.ErrCASLost) && !errors.Is(err, store.ErrUnknownOutcome) {
			return nil, err
		}
		now, rerr := Observe(ctx, kv, key)
		switch {
		case rerr != nil && !retryable(rerr):
			return nil, rerr
		case rerr != nil:
			// Unknown; read again after the pause.
		case now != nil && now.Row.Nonce == row.Nonce:
			return now, nil // our write landed
		case g == nil && now == nil:
			// Still absent: a create of unknown outcome that did not land. Create again.
		case g == nil || now == nil || !bytes.Equal(now.Raw, g.Raw):
			return nil, fmt.Errorf("write %s: %w", key, ErrMoved)
		default:
			rev = now.Revision
		}
		if err := store.Pause(ctx, attempt); err != nil {
			return nil, fmt.Errorf("write %s: %w", key, err)
		}
	}
}

// retryable reports whether a failed read of a gate may succeed later (the store was
// unavailable), as opposed to a gate that is corrupt or holds a delete marker.
func retryable(err error) bool { return fault.CodeOf(err) == fault.Unavailable }
