// Package storetest is an in-memory bucket with the semantics of store.KV, for unit tests of
// the code built on it (gates, the ledger, the manager engine), with faults a test can inject:
// the timeouts and leader changes whose outcome a writer must settle by re-reading.
package storetest

import (
	"context"
	"fmt"
	"sync"

	"github.com/cotal-ai/authplane/internal/store"
)

// KV is an in-memory bucket. Revisions are global and increasing, as a stream's sequence is.
type KV struct {
	mu      sync.Mutex
	rev     uint64
	entries map[string]entry

	// Fault, when set, runs before every write (Create, Update) under the bucket's lock. A
	// non-nil err is returned to the writer instead of the write's own result; lands says
	// whether the write happens anyway (an unknown outcome that did land).
	Fault func(key string) (err error, lands bool)
}

type entry struct {
	store.Entry
	deleted bool
}

// FailOnce returns a Fault that answers the next write with a store.ErrUnknownOutcome (lands
// says whether that write happens anyway) and lets every later write through.
func FailOnce(lands bool) func(string) (error, bool) {
	var mu sync.Mutex
	failed := false
	return func(key string) (error, bool) {
		mu.Lock()
		defer mu.Unlock()
		if failed {
			return nil, true
		}
		failed = true
		return fmt.Errorf("write %s timed out: %w", key, store.ErrUnknownOutcome), lands
	}
}

// New returns an empty bucket.
func New() *KV { return &KV{entries: map[string]entry{}} }

// Get returns key's latest entry, store.ErrNotFound or store.ErrDeleted.
func (m *KV) Get(_ context.Context, key string) (store.Entry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.entries[key]
	switch {
	case !ok:
		return store.Entry{}, fmt.Errorf("%s: %w", key, store.ErrNotFound)
	case e.deleted:
		return store.Entry{Revision: e.Revision}, fmt.Errorf("%s: %w", key, store.ErrDeleted)
	}
	return store.Entry{Value: append([]byte(nil), e.Value...), Revision: e.Revision}, nil
}

// Create writes key if it was never written; a delete marker is store.ErrDeleted.
func (m *KV) Create(ctx context.Context, key string, value []byte) (uint64, error) {
	return m.write(key, value, 0, true)
}

// Update writes key if its latest revision is rev.
func (m *KV) Update(_ context.Context, key string, value []byte, rev uint64) (uint64, error) {
	return m.write(key, value, rev, false)
}

func (m *KV) write(key string, value []byte, rev uint64, create bool) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var injected error
	lands := true
	if m.Fault != nil {
		injected, lands = m.Fault(key)
	}
	cur, exists := m.entries[key]
	switch {
	case create && exists && cur.deleted && injected == nil:
		return 0, fmt.Errorf("%s: %w", key, store.ErrDeleted)
	case cur.Revision != rev:
		if injected != nil {
			return 0, injected
		}
		return 0, fmt.Errorf("%s at revision %d, not %d: %w", key, cur.Revision, rev, store.ErrCASLost)
	}
	if lands {
		m.rev++
		m.entries[key] = entry{Entry: store.Entry{Value: append([]byte(nil), value...), Revision: m.rev}}
	}
	if injected != nil {
		return 0, injected
	}
	return m.rev, nil
}

// Put writes key unconditionally, as another writer would.
func (m *KV) Put(key string, value []byte) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.rev++
	m.entries[key] = entry{Entry: store.Entry{Value: append([]byte(nil), value...), Revision: m.rev}}
	return m.rev
}

// Delete leaves a delete marker on key, as a KV delete does.
func (m *KV) Delete(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.rev++
	m.entries[key] = entry{Entry: store.Entry{Revision: m.rev}, deleted: true}
}

// Revision is the bucket's latest revision.
func (m *KV) Revision() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rev
}
