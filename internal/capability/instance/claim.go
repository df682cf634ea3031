package instance

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/subjects"
)

// Where a plane keeps its instance identity (`--identity-store`).
const (
	// StoreFile keeps it in the state directory (IdentityFile): a restart on the same disk is
	// the same instance.
	StoreFile = "file"
	// StoreKV claims it in the space's secrets bucket under an instance name: a restart under
	// the same name is the same instance, with or without a persistent disk.
	StoreKV = "kv"
)

// Errors of a claimed identity. Test them with errors.Is.
var (
	// ErrUnreadable: the stored identity cannot be read (a delete marker, or the store did
	// not answer).
	ErrUnreadable = errors.New("identity record unreadable")
	// ErrMalformed: the stored identity is not a version 1 identity of this space and name.
	ErrMalformed = errors.New("identity record malformed")
	// ErrDisagree: a file identity and the stored one are not the same instance, or only the
	// file exists where the store is asked for.
	ErrDisagree = errors.New("file and stored identities disagree")
)

// record is a claimed identity as stored at `identity.<name>` in the secrets bucket: the
// instance id, and the space and name it was claimed for. Never a seed. The same record, at
// `registered.<name>`, marks that a start registered the instance's gate (MarkRegistered): the
// bucket is write-once, so the mark is a key of its own. Until it is there a replica that finds
// the identity may be racing its claimer to the gate, and an absent gate is not a loss.
type record struct {
	Ver        int    `json:"ver"`
	Space      string `json:"space"`
	Name       string `json:"name"`
	InstanceID string `json:"instanceId"`
}

// identityFence is the create-only row of name's identity in kv, the secrets bucket of space.
// maxRecord bounds a stored identity claim.
const maxRecord = 1 << 10

func identityFence(kv fence.KV, space, name string) *fence.Fence[record] {
	return recordFence(kv, subjects.IdentityKey(name), space, name)
}

func recordFence(kv fence.KV, key, space, name string) *fence.Fence[record] {
	return fence.New(kv, key, func(data []byte) (record, error) {
		var r record
		if err := fault.DecodeRow(data, &r, maxRecord); err != nil {
			return record{}, err
		}
		if r.Ver != 1 || r.Space != space || r.Name != name || !subjects.ValidUID(r.InstanceID) {
			return record{}, fmt.Errorf("not a version 1 identity of space %q named %q", space, name)
		}
		return r, nil
	}, nil)
}

// Claim returns the identity stored under name in kv (the secrets bucket of space), claiming
// one with a fresh instance id (Fresh) when there is none. The claim is create-only: of replicas that
// start at once under one name, the first write wins and the others adopt its record. A
// record that cannot be read (ErrUnreadable) or does not parse (ErrMalformed) refuses, saying
// which. An identity file in dir must name the same instance (ErrDisagree); a file with no
// record beside it refuses too, pointing at `authplane identity migrate`.
func Claim(ctx context.Context, kv fence.KV, dir, space, name string) (Identity, error) {
	file, err := readIdentity(dir, space)
	hasFile := err == nil
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return Identity{}, err
	}
	f := identityFence(kv, space, name)
	o, err := observe(ctx, f, kv)
	if err != nil {
		return Identity{}, err
	}
	if o.Absent() {
		if hasFile {
			return Identity{}, fmt.Errorf("%w: %s holds instance %s but %s has no identity %q: move it there with 'authplane identity migrate'",
				ErrDisagree, filepath.Join(dir, IdentityFile), file.InstanceID, where(kv), name)
		}
		if o, err = put(ctx, f, kv, o, record{Ver: 1, Space: space, Name: name, InstanceID: subjects.NewUID()}); err != nil {
			return Identity{}, err
		}
	}
	if hasFile && file.InstanceID != o.Row.InstanceID {
		return Identity{}, disagree(dir, file, kv, name, o.Row)
	}
	// A record no start has marked registered was made by this claim, or by one racing it under
	// the same name that may be registering at this moment: its gate may not exist yet.
	mark, err := observe(ctx, recordFence(kv, subjects.RegisteredKey(name), space, name), kv)
	if err != nil {
		return Identity{}, err
	}
	registered := !mark.Absent() && mark.Row.InstanceID == o.Row.InstanceID
	return Identity{Ver: 1, Space: space, InstanceID: o.Row.InstanceID, Fresh: !registered}, nil
}

// MarkRegistered writes, create-only, the mark that id (claimed under name in kv) registered its
// gate, so a later start that finds the gate absent knows it was lost (Register). A mark already
// there for id is kept; one for another instance is ErrDisagree. A crash before the mark
// leaves the record fresh: that start's successor registers again, at epoch 0 if the gate is
// gone, which is what a record claimed a moment ago would do.
func MarkRegistered(ctx context.Context, kv fence.KV, id Identity, name string) error {
	f := recordFence(kv, subjects.RegisteredKey(name), id.Space, name)
	o, err := observe(ctx, f, kv)
	if err == nil && o.Absent() {
		o, err = put(ctx, f, kv, o, record{Ver: 1, Space: id.Space, Name: name, InstanceID: id.InstanceID})
	}
	if err != nil {
		return fmt.Errorf("mark identity %q registered: %w", name, err)
	}
	if o.Row.InstanceID != id.InstanceID {
		return fmt.Errorf("%w: %s in %s marks instance %s registered, not %s", ErrDisagree, f.Key(), where(kv), o.Row.InstanceID, id.InstanceID)
	}
	return nil
}

// Migrate moves the identity file of dir into kv (the secrets bucket of space) under name,
// create-only, and then removes the file. A record already there must name the same instance
// (a repeated migration completes a partial one); another instance's is ErrDisagree, and the
// file stays.
func Migrate(ctx context.Context, kv fence.KV, dir, space, name string) (Identity, error) {
	file, err := readIdentity(dir, space)
	if errors.Is(err, os.ErrNotExist) {
		return Identity{}, fmt.Errorf("no identity to migrate: %s does not exist", filepath.Join(dir, IdentityFile))
	}
	if err != nil {
		return Identity{}, err
	}
	f := identityFence(kv, space, name)
	o, err := observe(ctx, f, kv)
	if err == nil && o.Absent() {
		o, err = put(ctx, f, kv, o, record{Ver: 1, Space: space, Name: name, InstanceID: file.InstanceID})
	}
	if err != nil {
		return Identity{}, err
	}
	if o.Row.InstanceID != file.InstanceID {
		return Identity{}, disagree(dir, file, kv, name, o.Row)
	}
	// The file is written only once its gate is: the instance registered.
	if err := MarkRegistered(ctx, kv, file, name); err != nil {
		return Identity{}, err
	}
	if err := os.Remove(filepath.Join(dir, IdentityFile)); err != nil {
		return Identity{}, fmt.Errorf("stored identity %q, but could not remove the file: %w", name, err)
	}
	return file, nil
}

// observe reads name's record, saying which of unreadable or malformed it is when it is either.
func observe(ctx context.Context, f *fence.Fence[record], kv fence.KV) (*fence.Observed[record], error) {
	o, err := f.Observe(ctx)
	switch {
	case errors.Is(err, fence.ErrMalformed):
		return nil, fmt.Errorf("%w: %s in %s: %w; it is write-once: start under another --instance-name", ErrMalformed, f.Key(), where(kv), err)
	case errors.Is(err, fence.ErrGone):
		return nil, fmt.Errorf("%w: %s in %s holds a delete marker; start under another --instance-name", ErrUnreadable, f.Key(), where(kv))
	case err != nil:
		return nil, fmt.Errorf("%w: %s in %s: %w", ErrUnreadable, f.Key(), where(kv), err)
	}
	return o, nil
}

// put writes r where o observed nothing, create-only, and returns what the key holds then:
// r, or the record of a writer that got there first.
func put(ctx context.Context, f *fence.Fence[record], kv fence.KV, o *fence.Observed[record], r record) (*fence.Observed[record], error) {
	landed, err := o.Write(ctx, r)
	if errors.Is(err, fence.ErrMoved) {
		return observe(ctx, f, kv) // another start claimed the name first: its record stands
	}
	if err != nil {
		return nil, fmt.Errorf("claim %s in %s: %w", f.Key(), where(kv), err)
	}
	return landed, nil
}

func disagree(dir string, file Identity, kv fence.KV, name string, stored record) error {
	return fmt.Errorf("%w: %s holds instance %s but identity %q in %s holds %s; keep one: remove the file, or start under another --instance-name",
		ErrDisagree, filepath.Join(dir, IdentityFile), file.InstanceID, name, where(kv), stored.InstanceID)
}

// where names the bucket kv is, when it can say.
func where(kv fence.KV) string {
	if b, ok := kv.(interface{ Bucket() string }); ok {
		return "bucket " + b.Bucket()
	}
	return "the identity store"
}
