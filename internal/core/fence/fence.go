// Package fence is the one fence primitive (docs/SECURITY.md, "How"): a typed row under one KV key,
// observed with a leader read and changed only by a compare-and-set at the revision observed.
// Its one retry loop is bounded by the caller's deadline and paced with jitter; it speaks its
// own errors, and the edge chooses the wire code. A bucket may group its commits (Grouped:
// concurrent commits of the same bytes share one CAS) and share its reads (Shared: concurrent
// reads of one key share a get sent after each of them began); neither weakens a fence. On a
// bucket whose reads cannot be stale (Sole: the embedded broker's), a commit is a read.
package fence

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/cotal-ai/authplane/internal/core/store"
)

// Errors of the fence. Test them with errors.Is.
var (
	// ErrMoved: the row changed since it was observed (a fence writer got there first). Decide
	// again from a new observation.
	ErrMoved = errors.New("fence moved")
	// ErrGone: the key holds a delete or purge marker, which no writer of the plane leaves. It
	// is final: nothing reads past it and nothing writes over it.
	ErrGone = errors.New("fence holds a delete marker")
	// ErrUnknownOutcome: the deadline came while a write's outcome was still unknown (a
	// timeout, a leader change) and no read settled it.
	ErrUnknownOutcome = errors.New("fence write outcome unknown")
	// ErrMalformed: the stored row does not parse.
	ErrMalformed = errors.New("fence row malformed")
	// ErrKeep is what an Update's decide returns (alone or wrapped) when the row as observed is
	// already what it wants: Update then writes nothing and returns the observation. It lets a
	// step that checks its own state first be a no-op on a retry.
	ErrKeep = errors.New("keep the row as observed")
)

// KV is the part of a bucket a fence needs: store.KV, or testkit.KV in unit tests.
type KV interface {
	Get(ctx context.Context, key string) (store.Entry, error)
	Create(ctx context.Context, key string, value []byte) (uint64, error)
	Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error)
}

// Fence is a row of type T under one key of a bucket; parse decodes and checks a stored row.
type Fence[T any] struct {
	kv    KV
	key   string
	parse func([]byte) (T, error)
	stamp func(*T)
}

// New returns the fence at key of kv. stamp, when set, gives every row written a fresh
// writer-unique value (a nonce) before it is written: then a row never returns to bytes it once
// had, which is what makes a commit's byte compare sound.
func New[T any](kv KV, key string, parse func([]byte) (T, error), stamp func(*T)) *Fence[T] {
	return &Fence[T]{kv: kv, key: key, parse: parse, stamp: stamp}
}

// Key is the fence's KV key.
func (f *Fence[T]) Key() string { return f.key }

// Observed is a fence as read: its row, the exact bytes read and their revision. Revision 0
// means the key was never written.
type Observed[T any] struct {
	Row      T
	Raw      []byte
	Revision uint64
	fence    *Fence[T]
}

// Absent reports whether the key had never been written when it was observed.
func (o *Observed[T]) Absent() bool { return o.Revision == 0 }

// Key is the observed fence's KV key.
func (o *Observed[T]) Key() string { return o.fence.key }

// Observe reads the fence from the stream leader. A read that fails transiently is retried
// until ctx ends (then ErrUnknownOutcome); a delete marker is ErrGone; a row that does not
// parse is ErrMalformed.
func (f *Fence[T]) Observe(ctx context.Context) (*Observed[T], error) {
	for attempt := 0; ; attempt++ {
		o, err := f.read(ctx)
		if !errors.Is(err, store.ErrUnknownOutcome) {
			return o, err
		}
		if perr := store.Pause(ctx, attempt); perr != nil {
			return nil, fmt.Errorf("read %s: %w: %w (gave up: %w)", f.key, ErrUnknownOutcome, err, perr)
		}
	}
}

// read is one leader read, given a share of ctx's time so a lost answer leaves time to retry.
func (f *Fence[T]) read(ctx context.Context) (*Observed[T], error) {
	ctx, cancel := store.Attempt(ctx)
	defer cancel()
	e, err := f.kv.Get(ctx, f.key)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return &Observed[T]{fence: f}, nil
	case errors.Is(err, store.ErrDeleted):
		return nil, fmt.Errorf("%s: %w", f.key, ErrGone)
	case err != nil:
		return nil, err
	}
	row, err := f.parse(e.Value)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrMalformed, f.key, err)
	}
	return &Observed[T]{Row: row, Raw: e.Value, Revision: e.Revision, fence: f}, nil
}

// Commit rewrites the row exactly as observed, pinned to the revision observed: the commit
// fence of a mint made on this observation. A CAS lost to a rewrite of the same bytes (another
// mint's commit) is retried at the new revision; any change of content means a fence writer got
// there first: ErrMoved. Fence writers give every write fresh bytes (a nonce), so a row never
// returns to bytes it once had, and unchanged bytes prove no fence write landed in between.
// It returns the fence as committed: the bytes observed, at the commit's revision. On a
// Grouped bucket, concurrent commits of the same bytes share one CAS (see Grouped). On a
// bucket whose reads cannot be stale (Sole), the commit is a read instead (see confirm).
func (o *Observed[T]) Commit(ctx context.Context) (*Observed[T], error) {
	if o.Absent() {
		return nil, fmt.Errorf("commit %s: nothing was observed there: %w", o.Key(), ErrMoved)
	}
	if isSole(o.fence.kv) {
		return o.confirm(ctx)
	}
	g, grouped := o.fence.kv.(*Grouped)
	if !grouped {
		return o.put(ctx, o.Raw)
	}
	n, err := g.commit(ctx, o.Key(), o.Raw, o.Revision, func(ctx context.Context, rev uint64) (uint64, error) {
		at := *o
		at.Revision = rev
		c, err := at.put(ctx, o.Raw)
		if err != nil {
			return 0, err
		}
		return c.Revision, nil
	})
	if err != nil {
		return nil, err
	}
	return &Observed[T]{Row: o.Row, Raw: o.Raw, Revision: n, fence: o.fence}, nil
}

// confirm is Commit on a Sole bucket: a leader read of the row, sent once the mint is on
// record, that finds the bytes observed. It proves what the CAS would: the bytes are unchanged
// from the observation to the read, so no fence write landed between them, and any fence
// written later is ordered after it. A fence writer that then reads the instance's records
// finds the mint's, written before the read was sent. The read can be trusted only where it
// cannot be stale: one copy, which acknowledged every write made before it was sent. A
// replicated bucket's leader may not yet know it was deposed, so there the commit stays a CAS,
// which only a quorum lands. It writes nothing: a renewal whose keys are on record already
// makes no synced write at all.
func (o *Observed[T]) confirm(ctx context.Context) (*Observed[T], error) {
	now, err := o.fence.Observe(ctx)
	switch {
	case err != nil:
		return nil, fmt.Errorf("commit %s: %w", o.Key(), err)
	case now.Absent() || !bytes.Equal(now.Raw, o.Raw):
		return nil, fmt.Errorf("commit %s: %w", o.Key(), ErrMoved)
	}
	return now, nil
}

// Sole is what a KV may also be to say that its reads cannot be stale: it is the one copy of
// its bucket, on a server that is no cluster (store.KV). A commit there is a read (confirm).
type Sole interface {
	Sole() bool
}

// isSole reports whether kv says its reads cannot be stale.
func isSole(kv KV) bool {
	s, ok := kv.(Sole)
	return ok && s.Sole()
}

// Write replaces the row observed with next, pinned to the revision observed (create-only
// when the key was absent). next is stamped first (a fresh nonce) and must parse: a row the
// fence could not read back is never written. A CAS lost to a rewrite of the same bytes as
// observed is retried at the new revision; a write of unknown outcome is settled by reading
// back: it landed if the row now holds exactly the bytes written. Any other change since the
// observation is ErrMoved.
func (o *Observed[T]) Write(ctx context.Context, next T) (*Observed[T], error) {
	data, err := o.fence.encode(next)
	if err != nil {
		return nil, err
	}
	var landed *Observed[T]
	if werr := o.fence.alone(ctx, func() { landed, err = o.put(ctx, data) }); werr != nil {
		return nil, werr
	}
	return landed, err
}

// encode stamps next (a fresh nonce) and marshals it, refusing a row the fence could not read
// back.
func (f *Fence[T]) encode(next T) ([]byte, error) {
	if f.stamp != nil {
		f.stamp(&next)
	}
	data, err := json.Marshal(next)
	if err != nil {
		return nil, fmt.Errorf("write %s: %w", f.key, err)
	}
	if _, err := f.parse(data); err != nil {
		return nil, fmt.Errorf("%w: %s: refusing to write a row that does not parse: %w", ErrMalformed, f.key, err)
	}
	return data, nil
}

// alone runs write, a fence write on the fence's key, alone among the key's grouped commits
// and writes when the bucket is Grouped (see Grouped), or at once when it is not. A write still
// waiting when ctx ends is withdrawn: nothing was sent.
func (f *Fence[T]) alone(ctx context.Context, write func()) error {
	g, grouped := f.kv.(*Grouped)
	if !grouped {
		write()
		return nil
	}
	if err := g.exclusive(ctx, f.key, write); err != nil {
		return fmt.Errorf("write %s: withdrawn before it was sent: %w", f.key, err)
	}
	return nil
}

// RetryCounter is what a KV may also be to be told of every write a fence retries on it (a
// lost CAS, an unknown outcome): the plane's stores count them for its metrics.
type RetryCounter interface {
	Retried()
}

// retried tells f's bucket, if it counts, of one retried write.
func (f *Fence[T]) retried() {
	if c, ok := f.kv.(RetryCounter); ok {
		c.Retried()
	}
}

// put is the one CAS loop: write data at the observed revision until it lands, the row
// changes, or ctx ends. The first time a re-read finds the row as observed at a later
// revision (another commit of the same bytes landed first), it tries again at once at that
// revision; later retries are paced.
func (o *Observed[T]) put(ctx context.Context, data []byte) (*Observed[T], error) {
	f := o.fence
	rev := o.Revision
	var last error
	retried := false
	for attempt := 0; ; attempt++ {
		n, err := f.write(ctx, data, rev)
		switch {
		case err == nil:
			return f.landed(data, n)
		case errors.Is(err, store.ErrDeleted):
			return nil, fmt.Errorf("write %s: %w", f.key, ErrGone)
		case !errors.Is(err, store.ErrCASLost) && !errors.Is(err, store.ErrUnknownOutcome):
			return nil, fmt.Errorf("write %s: %w", f.key, err)
		}
		last = err
		now, rerr := f.read(ctx)
		switch {
		case errors.Is(rerr, store.ErrUnknownOutcome):
			// Unknown; read again after the pause.
		case rerr != nil:
			return nil, fmt.Errorf("write %s: %w", f.key, rerr)
		case !now.Absent() && !bytes.Equal(data, o.Raw) && bytes.Equal(now.Raw, data):
			return now, nil // our write of unknown outcome landed
		case now.Absent() != o.Absent() || !bytes.Equal(now.Raw, o.Raw):
			return nil, fmt.Errorf("write %s: %w", f.key, ErrMoved)
		default:
			rev = now.Revision // unchanged: another mint's commit, or nothing landed
			if !retried {
				retried = true
				f.retried()
				continue
			}
		}
		f.retried()
		if perr := store.Pause(ctx, attempt); perr != nil {
			if errors.Is(last, store.ErrUnknownOutcome) {
				return nil, fmt.Errorf("write %s: %w: %w (gave up: %w)", f.key, ErrUnknownOutcome, last, perr)
			}
			return nil, fmt.Errorf("write %s: contended until the deadline (gave up: %w)", f.key, perr)
		}
	}
}

// write is one create (rev 0) or CAS, given a share of ctx's time so a lost ack leaves time
// to settle and retry.
func (f *Fence[T]) write(ctx context.Context, data []byte, rev uint64) (uint64, error) {
	ctx, cancel := store.Attempt(ctx)
	defer cancel()
	if rev == 0 {
		return f.kv.Create(ctx, f.key, data)
	}
	return f.kv.Update(ctx, f.key, data, rev)
}

// landed returns the observation of data written at revision n.
func (f *Fence[T]) landed(data []byte, n uint64) (*Observed[T], error) {
	row, err := f.parse(data)
	if err != nil {
		return nil, fmt.Errorf("%w: %s as written: %w", ErrMalformed, f.key, err)
	}
	return &Observed[T]{Row: row, Raw: data, Revision: n, fence: f}, nil
}

// Update observes the fence and writes decide's row for what it saw, again from a fresh
// observation each time the fence moves first, until a write lands or ctx ends. decide may
// refuse (its error is returned as is), or return ErrKeep to leave the row as observed (Update
// then returns that observation); it sees Absent() for a key never written. ErrGone and
// ErrMalformed are final. decide must be safe to apply twice: a write of unknown outcome that
// did land, followed by another writer's change, reads as moved and is decided again.
func (f *Fence[T]) Update(ctx context.Context, decide func(*Observed[T]) (T, error)) (*Observed[T], error) {
	for attempt := 0; ; attempt++ {
		var n *Observed[T]
		var err error
		// On a Grouped bucket the read, the decision and the write run alone on the key: writers
		// of one process then never lose their CAS to each other, nor to its commits.
		if werr := f.alone(ctx, func() { n, err = f.updateOnce(ctx, decide) }); werr != nil {
			return nil, werr
		}
		if !errors.Is(err, ErrMoved) {
			return n, err
		}
		if perr := store.Pause(ctx, attempt); perr != nil {
			return nil, fmt.Errorf("%w (gave up: %w)", err, perr)
		}
	}
}

// updateOnce is one attempt of Update: observe, decide, write at the revision observed.
func (f *Fence[T]) updateOnce(ctx context.Context, decide func(*Observed[T]) (T, error)) (*Observed[T], error) {
	o, err := f.Observe(ctx)
	if err != nil {
		return nil, err
	}
	next, err := decide(o)
	if errors.Is(err, ErrKeep) {
		return o, nil
	}
	if err != nil {
		return nil, err
	}
	data, err := f.encode(next)
	if err != nil {
		return nil, err
	}
	return o.put(ctx, data)
}

// UpdateFrom is Update that decides first on known, an observation the caller already holds
// (nil: none), and writes at its revision: when no one wrote since, that saves the read. A row
// that moved since is read again, as Update reads it.
func (f *Fence[T]) UpdateFrom(ctx context.Context, known *Observed[T], decide func(*Observed[T]) (T, error)) (*Observed[T], error) {
	if known != nil {
		next, err := decide(known)
		switch {
		case errors.Is(err, ErrKeep):
			return known, nil
		case err != nil:
			return nil, err
		}
		if n, err := known.Write(ctx, next); !errors.Is(err, ErrMoved) {
			return n, err
		}
	}
	return f.Update(ctx, decide)
}
