// Package instance is the plane's own identity: the exclusive lock on its state directory, the
// persisted instance id, and its registration as endpoint `auth` whose process epoch advances
// on every start, fencing any predecessor that still runs on the same identity.
package instance

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotal-ai/authplane/internal/body"
	"github.com/cotal-ai/authplane/internal/files"
	"github.com/cotal-ai/authplane/internal/gate"
	"github.com/cotal-ai/authplane/internal/store"
	"github.com/cotal-ai/authplane/subjects"
)

// Lock is an exclusive lock on a state directory, held until Release.
type Lock struct{ f *os.File }

// ErrLocked means another process holds the state directory.
var ErrLocked = errors.New("state dir in use")

// Acquire takes the lock on dir (creating dir if needed) and records this process's pid in it.
// If another process holds it, the error names that process's pid.
func Acquire(dir string) (*Lock, error) {
	if err := files.EnsureDir(dir); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, files.Private)
	if err != nil {
		return nil, fmt.Errorf("open lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder := "unknown"
		if pid, rerr := os.ReadFile(path); rerr == nil && len(pid) > 0 {
			holder = strings.TrimSpace(string(pid))
		}
		return nil, errors.Join(fmt.Errorf("%w: state dir %s in use by pid %s", ErrLocked, dir, holder), f.Close())
	}
	if err := f.Truncate(0); err != nil {
		return nil, errors.Join(err, f.Close())
	}
	if _, err := f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0); err != nil {
		return nil, errors.Join(err, f.Close())
	}
	return &Lock{f: f}, nil
}

// Release drops the lock.
func (l *Lock) Release() error { return l.f.Close() }

// Identity is the plane's persisted instance identity (`identity.json` in the state dir, 0600).
type Identity struct {
	Ver        int    `json:"ver"`
	Space      string `json:"space"`
	InstanceID string `json:"instanceId"`
}

// IdentityFile is the identity's file name inside the state directory.
const IdentityFile = "identity.json"

// LoadOrCreateIdentity reads the identity in dir, or creates one with a fresh instance id.
func LoadOrCreateIdentity(dir, space string) (Identity, error) {
	path := filepath.Join(dir, IdentityFile)
	raw, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		id := Identity{Ver: 1, Space: space, InstanceID: NewUID()}
		data, err := json.Marshal(id)
		if err != nil {
			return Identity{}, err
		}
		return id, files.WriteAtomic(path, append(data, '\n'), files.Private)
	}
	if err != nil {
		return Identity{}, fmt.Errorf("read identity: %w", err)
	}
	var id Identity
	if err := body.Decode(raw, &id); err != nil || id.Ver != 1 || !subjects.ValidUID(id.InstanceID) {
		return Identity{}, fmt.Errorf("%s is not a version 1 instance identity", path)
	}
	if id.Space != space {
		return Identity{}, fmt.Errorf("%s is the identity of a plane of space %q, not %q", path, id.Space, space)
	}
	return id, nil
}

// NewUID returns a fresh instance id or lifecycle uid: 26 base36 characters from 20 random
// bytes (at least 128 bits of entropy).
func NewUID() string {
	b := make([]byte, 20)
	if _, err := rand.Read(b); err != nil {
		panic("instance: crypto/rand failed: " + err.Error())
	}
	s := new(big.Int).SetBytes(b).Text(36)
	return strings.Repeat("0", max(0, 26-len(s))) + s[max(0, len(s)-32):]
}

// Principal is the principal recorded on the plane's own gate.
func Principal(iid string) string { return "plane.auth_" + iid }

// Register registers the plane's instance on its gate `epgate.auth.<iid>`: epoch 0 on the
// first registration, one more on every later one. It returns the registered gate.
func Register(ctx context.Context, kv gate.KV, iid string) (*gate.Gate, error) {
	key := subjects.GateKey(subjects.GateEndpointAuth, iid)
	for attempt := 0; ; attempt++ {
		g, err := gate.Observe(ctx, kv, key)
		if err != nil {
			return nil, err
		}
		var row gate.Row
		switch {
		case g == nil:
			row = gate.Row{State: gate.Open, Generation: 1, RegistrationRevision: 1, Principal: Principal(iid)}
		case g.Row.State != gate.Open:
			return nil, fmt.Errorf("the plane's gate %s is %s; this identity can no longer serve", key, g.Row.State)
		default:
			row = g.Row
			row.ProcessEpoch++
			row.RegistrationRevision++
		}
		ng, err := gate.Transition(ctx, kv, key, g, row)
		if err == nil {
			return ng, nil
		}
		if !errors.Is(err, gate.ErrMoved) {
			return nil, err
		}
		if err := store.Pause(ctx, attempt); err != nil {
			return nil, fmt.Errorf("register %s: %w", key, err)
		}
	}
}

// ErrFenced means another process registered the same identity at a later epoch.
var ErrFenced = errors.New("fenced by a newer registration of this instance")

// Watch blocks until the plane's gate g moves past this registration (a newer epoch, another
// state, a delete) and then returns ErrFenced; it returns nil when ctx ends first.
func Watch(ctx context.Context, kv *store.KV, g *gate.Gate) (err error) {
	w, err := kv.Watch(ctx, g.Key)
	if err != nil {
		return fmt.Errorf("watch %s: %w", g.Key, err)
	}
	defer func() {
		if serr := w.Stop(); serr != nil && !errors.Is(serr, nats.ErrConnectionClosed) {
			err = errors.Join(err, serr)
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			switch {
			case !ok:
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("watch %s ended", g.Key)
			case e == nil: // end of the initial values
				continue
			case e.Operation() != jetstream.KeyValuePut:
				return fmt.Errorf("%w: gate %s was deleted", ErrFenced, g.Key)
			}
			row, err := gate.Parse(e.Value())
			if err != nil {
				return fmt.Errorf("%w: gate %s is malformed", ErrFenced, g.Key)
			}
			if row.ProcessEpoch != g.Row.ProcessEpoch || row.State != gate.Open || row.Nonce != g.Row.Nonce {
				return fmt.Errorf("%w: gate %s is now %s at epoch %d (this process registered epoch %d)",
					ErrFenced, g.Key, row.State, row.ProcessEpoch, g.Row.ProcessEpoch)
			}
		}
	}
}
