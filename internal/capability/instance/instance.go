// Package instance is the plane's own identity: the exclusive lock on its state directory, the
// persisted instance id, and its registration as endpoint `auth` whose process epoch advances
// on every start, fencing any predecessor that still runs on the same identity.
package instance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/internal/core/store"
	"github.com/cotal-ai/authplane/internal/platform/space"
	"github.com/cotal-ai/authplane/subjects"
)

// Lock is an exclusive lock on a state directory, held until Release.
type Lock struct{ f *os.File }

// ErrLocked means another process holds the state directory.
var ErrLocked = errors.New("state dir in use")

// Acquire takes the lock on dir (creating dir if needed) and records this process's pid in it.
// If another process holds it, the error names that process's pid.
func Acquire(dir string) (*Lock, error) {
	if err := space.EnsureDir(dir); err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	path := filepath.Join(dir, "lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, space.Private)
	if err != nil {
		return nil, fmt.Errorf("state dir %s cannot hold its lock: %w", dir, err)
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

// Holder reports whether a process holds dir's lock, and its pid. A directory without a lock
// file is held by nobody. It takes no lock that a starting plane would meet: a shared lock
// probes the exclusive one for as long as the probe takes, and is dropped at once.
func Holder(dir string) (pid int, held bool, err error) {
	path := filepath.Join(dir, "lock")
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("state dir %s: %w", dir, err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err == nil {
		return 0, false, syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	} else if !errors.Is(err, syscall.EWOULDBLOCK) {
		return 0, false, fmt.Errorf("state dir %s: probe its lock: %w", dir, err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0, true, fmt.Errorf("state dir %s: read its lock's pid: %w", dir, err)
	}
	pid, err = strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil || pid <= 0 {
		return 0, true, fmt.Errorf("state dir %s: its lock names no pid (%.32q)", dir, raw)
	}
	return pid, true, nil
}

// Release drops the lock.
func (l *Lock) Release() error {
	// Unlock, then close: a flock belongs to the open file, which a child being forked at this
	// moment shares until its exec closes it, and closing this descriptor alone would leave the
	// lock held by that copy (a plane started again in this process was then refused).
	return errors.Join(syscall.Flock(int(l.f.Fd()), syscall.LOCK_UN), l.f.Close())
}

// Identity is the plane's persisted instance identity (`identity.json` in the state dir, 0600).
type Identity struct {
	Ver        int    `json:"ver"`
	Space      string `json:"space"`
	InstanceID string `json:"instanceId"`
	// Fresh says no start registered this identity before: it was made by this start (a file
	// not yet written, or a claim this start wrote). One that is not fresh registered its gate
	// before, so a gate absent then was lost (Register).
	Fresh bool `json:"-"`
}

// IdentityFile is the identity's file name inside the state directory.
const IdentityFile = "identity.json"

// LoadIdentity reads the identity in dir, or makes a fresh one with a new instance id when dir
// has none. It writes nothing: SaveIdentity writes a fresh identity once it has registered, so
// an identity file always names an instance whose gate the store acknowledged.
func LoadIdentity(dir, space string) (Identity, error) {
	id, err := readIdentity(dir, space)
	if errors.Is(err, os.ErrNotExist) {
		return Identity{Ver: 1, Space: space, InstanceID: subjects.NewUID(), Fresh: true}, nil
	}
	return id, err
}

// SaveIdentity writes id into dir (0600, atomically), and syncs dir so the file is there after
// an OS crash or a power cut, as the gate it stands for is.
func SaveIdentity(dir string, id Identity) error {
	data, err := json.Marshal(id)
	if err != nil {
		return err
	}
	if err := space.WriteAtomic(filepath.Join(dir, IdentityFile), append(data, '\n'), space.Private); err != nil {
		return err
	}
	return space.SyncDir(dir)
}

// readIdentity reads the identity file in dir; a directory without one is os.ErrNotExist. A
// file that is not a version 1 identity of space is an error naming it.
func readIdentity(dir, space string) (Identity, error) {
	path := filepath.Join(dir, IdentityFile)
	raw, err := os.ReadFile(path)
	if err != nil {
		return Identity{}, fmt.Errorf("read identity: %w", err)
	}
	var id Identity
	if err := fault.Decode(raw, &id); err != nil || id.Ver != 1 || !subjects.ValidUID(id.InstanceID) {
		return Identity{}, fmt.Errorf("%s is not a version 1 instance identity", path)
	}
	if id.Space != space {
		return Identity{}, fmt.Errorf("%s is the identity of a plane of space %q, not %q", path, id.Space, space)
	}
	return id, nil
}

// planePrincipal is the principal recorded on the plane's own gate.
func planePrincipal(iid string) string { return "plane.auth_" + iid }

// Register registers the plane's instance on its gate `epgate.auth.<iid>`: epoch 0 on the
// first registration, one more on every later one. It returns the registered gate. When
// registered says this identity registered before, an absent gate was lost with the bucket
// that held it: store.ErrLost, and nothing is written.
func Register(ctx context.Context, kv fence.KV, iid string, registered bool) (*issue.Gate, error) {
	g, err := issue.GateOf(kv, subjects.GateEndpointAuth, iid).Update(ctx, func(cur *issue.Gate) (issue.GateRow, error) {
		switch {
		case cur.Absent() && registered:
			return issue.GateRow{}, fmt.Errorf("%w: the plane's gate %s in %s is absent, although instance %s registered there before "+
				"(the bucket was emptied or re-created); restore it, or start over with --recreate-stores", store.ErrLost, cur.Key(), where(kv), iid)
		case cur.Absent():
			return issue.GateRow{State: issue.GateOpen, Generation: 1, RegistrationRevision: 1, Principal: planePrincipal(iid)}, nil
		case cur.Row.State != issue.GateOpen:
			return issue.GateRow{}, fmt.Errorf("the plane's gate %s is %s; this identity can no longer serve", cur.Key(), cur.Row.State)
		}
		row := cur.Row
		row.ProcessEpoch++
		row.RegistrationRevision++
		return row, nil
	})
	if err != nil {
		return nil, fmt.Errorf("register instance %s: %w", iid, err)
	}
	return g, nil
}

// ErrFenced means another process registered the same identity at a later epoch.
var ErrFenced = errors.New("fenced by a newer registration of this instance")

// Watcher streams a key's updates, starting with its current value: store.KV.
type Watcher interface {
	Watch(ctx context.Context, key string) (jetstream.KeyWatcher, error)
}

// Watch blocks until the plane's gate g moves past this registration (a newer epoch, another
// state, a delete) and then returns ErrFenced; it returns nil when ctx ends first. A watch the
// store cannot start yet (its stream still electing a leader, as after a cluster lost power) is
// retried until the store answers, and so is one a signal on rewatch starts again (the
// connection came back: the watch's consumer may be gone with the broker); each starts from the
// gate as it is then, so an epoch that moved meanwhile fences at once.
func Watch(ctx context.Context, kv Watcher, g *issue.Gate, rewatch <-chan struct{}) error {
	for attempt := 0; ; attempt++ {
		err := watch(ctx, kv, g, rewatch)
		switch {
		case errors.Is(err, errRewatch):
		case errors.Is(err, errNoWatch):
			if perr := store.Pause(ctx, attempt); perr != nil {
				return nil
			}
		default:
			return err
		}
	}
}

var (
	// errRewatch: the watch must start again.
	errRewatch = errors.New("watch again")
	// errNoWatch: the watch could not start.
	errNoWatch = errors.New("cannot watch")
)

// watch is one watch of g's key, until it fences, ctx ends, or rewatch asks for another.
func watch(ctx context.Context, kv Watcher, g *issue.Gate, rewatch <-chan struct{}) (err error) {
	key := g.Key()
	w, err := kv.Watch(ctx, key)
	if err != nil {
		return fmt.Errorf("watch %s: %w: %w", key, errNoWatch, err)
	}
	defer func() {
		if serr := w.Stop(); serr != nil && !errors.Is(serr, nats.ErrConnectionClosed) && !errors.Is(err, errRewatch) {
			err = errors.Join(err, serr)
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-rewatch:
			return errRewatch
		case e, ok := <-w.Updates():
			switch {
			case !ok:
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("watch %s ended", key)
			case e == nil: // end of the initial values
				continue
			case e.Operation() != jetstream.KeyValuePut:
				return fmt.Errorf("%w: gate %s was deleted", ErrFenced, key)
			}
			row, err := issue.ParseGate(e.Value())
			if err != nil {
				return fmt.Errorf("%w: gate %s is malformed", ErrFenced, key)
			}
			if row.ProcessEpoch != g.Row.ProcessEpoch || row.State != issue.GateOpen || row.Nonce != g.Row.Nonce {
				return fmt.Errorf("%w: gate %s is now %s at epoch %d (this process registered epoch %d)",
					ErrFenced, key, row.State, row.ProcessEpoch, g.Row.ProcessEpoch)
			}
		}
	}
}

// ServiceInfoFile is the readiness file a serving plane writes last into its state directory
// and removes when it stops.
const ServiceInfoFile = "auth-service.json"

// ServiceInfo is the content of auth-service.json: where a local client finds the plane.
type ServiceInfo struct {
	Ver      int    `json:"ver"`
	URL      string `json:"url"`
	NATSURL  string `json:"natsUrl"`
	SpaceDir string `json:"spaceDir"`
	PID      int    `json:"pid"`
	// Cap is the loopback capability, new at every start.
	Cap string `json:"cap"`
}

// WriteServiceInfo writes info into dir (0600, atomically).
func WriteServiceInfo(dir string, info ServiceInfo) error {
	data, err := json.MarshalIndent(info, "", "  ")
	if err != nil {
		return err
	}
	return space.WriteAtomic(filepath.Join(dir, ServiceInfoFile), append(data, '\n'), space.Private)
}

// ReadServiceInfo reads the service info in dir; a plane that is not running has none
// (os.ErrNotExist).
func ReadServiceInfo(dir string) (*ServiceInfo, error) {
	path := filepath.Join(dir, ServiceInfoFile)
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var info ServiceInfo
	if err := json.Unmarshal(raw, &info); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &info, nil
}

// RemoveServiceInfo removes the service info in dir, if there is one.
func RemoveServiceInfo(dir string) error {
	if err := os.Remove(filepath.Join(dir, ServiceInfoFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
