package testkit

// An in-memory bucket with the semantics of store.KV and an in-memory
// record stream with those of store.Stores.Append and Last, for unit tests of the code built on them
// (fences, the ledger, the pipeline, the manager engine), with faults a test can inject: the
// timeouts and leader changes whose outcome a writer must settle by re-reading.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotal-ai/authplane/internal/core/store"
)

// KV is an in-memory bucket. Revisions are global and increasing, as a stream's sequence is.
type KV struct {
	mu       sync.Mutex
	rev      uint64
	entries  map[string]entry
	watchers map[string][]*watcher

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

// NewKV returns an empty bucket.
func NewKV() *KV { return &KV{entries: map[string]entry{}, watchers: map[string][]*watcher{}} }

// Get returns key's latest entry, store.ErrNotFound or store.ErrDeleted.
func (m *KV) Get(ctx context.Context, key string) (store.Entry, error) {
	if err := ctx.Err(); err != nil {
		return store.Entry{}, unknown(key, err)
	}
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
	if err := ctx.Err(); err != nil {
		return 0, unknown(key, err)
	}
	return m.write(key, value, 0, true)
}

// Update writes key if its latest revision is rev.
func (m *KV) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, unknown(key, err)
	}
	return m.write(key, value, rev, false)
}

// unknown is what a call made after its context ended returns, as JetStream's client does: a
// transient error whose outcome (for a write: nothing landed) the caller cannot know.
func unknown(key string, err error) error {
	return fmt.Errorf("%s: %w: %w", key, store.ErrUnknownOutcome, err)
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
		m.set(key, value, false)
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
	return m.set(key, value, false)
}

// Delete leaves a delete marker on key, as a KV delete does.
func (m *KV) Delete(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.set(key, nil, true)
}

// set writes key's next revision and tells its watchers; the caller holds the lock.
func (m *KV) set(key string, value []byte, deleted bool) uint64 {
	m.rev++
	e := entry{Entry: store.Entry{Value: append([]byte(nil), value...), Revision: m.rev}, deleted: deleted}
	if deleted {
		e.Value = nil
	}
	m.entries[key] = e
	for _, w := range m.watchers[key] {
		w.send(key, e)
	}
	return m.rev
}

// Revision is the bucket's latest revision.
func (m *KV) Revision() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rev
}

// Watch streams key's updates, starting with its current value and then a nil entry, as a
// JetStream key watcher does. Stop ends it; so does ctx.
func (m *KV) Watch(ctx context.Context, key string) (jetstream.KeyWatcher, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	w := &watcher{updates: make(chan jetstream.KeyValueEntry, 64), done: make(chan struct{})}
	if e, ok := m.entries[key]; ok {
		w.send(key, e)
	}
	w.updates <- nil
	m.watchers[key] = append(m.watchers[key], w)
	go func() {
		select {
		case <-ctx.Done():
		case <-w.done:
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		m.watchers[key] = slices.DeleteFunc(m.watchers[key], func(x *watcher) bool { return x == w })
		close(w.updates)
	}()
	return w, nil
}

type watcher struct {
	updates  chan jetstream.KeyValueEntry
	done     chan struct{}
	stopOnce sync.Once
}

func (w *watcher) Updates() <-chan jetstream.KeyValueEntry { return w.updates }

func (w *watcher) Stop() error {
	w.stopOnce.Do(func() { close(w.done) })
	return nil
}

// send delivers e, or drops it if the watcher has fallen 64 updates behind (a test that
// watches reads its updates).
func (w *watcher) send(key string, e entry) {
	op := jetstream.KeyValuePut
	if e.deleted {
		op = jetstream.KeyValueDelete
	}
	select {
	case w.updates <- kvEntry{key: key, value: e.Value, rev: e.Revision, op: op}:
	default:
	}
}

// kvEntry is one update as a watcher sees it.
type kvEntry struct {
	key   string
	value []byte
	rev   uint64
	op    jetstream.KeyValueOp
}

func (e kvEntry) Bucket() string                  { return "memory" }
func (e kvEntry) Key() string                     { return e.key }
func (e kvEntry) Value() []byte                   { return e.value }
func (e kvEntry) Revision() uint64                { return e.rev }
func (e kvEntry) Created() time.Time              { return time.Time{} }
func (e kvEntry) Delta() uint64                   { return 0 }
func (e kvEntry) Operation() jetstream.KeyValueOp { return e.op }

// Stream is an in-memory record stream with the semantics of store.Stores.Append: a message
// id seen before is acknowledged without a second record, as JetStream's duplicate window does.
type Stream struct {
	mu   sync.Mutex
	msgs []Msg
	ids  map[string]bool

	// Fault, when set, runs before every append under the stream's lock, like KV.Fault.
	Fault func(subject string) (err error, lands bool)
	// Now, when set, is the clock that stamps each append (time.Now otherwise).
	Now func() time.Time
}

// Msg is one appended record.
type Msg struct {
	Subject string
	Data    []byte
	ID      string
	At      time.Time
}

// NewStream returns an empty stream.
func NewStream() *Stream { return &Stream{ids: map[string]bool{}} }

// Append appends data on subject unless a record with msgID was appended before.
func (s *Stream) Append(ctx context.Context, subject string, data []byte, msgID string) error {
	if err := ctx.Err(); err != nil {
		return unknown(subject, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var injected error
	lands := true
	if s.Fault != nil {
		injected, lands = s.Fault(subject)
	}
	if lands && (msgID == "" || !s.ids[msgID]) {
		s.msgs = append(s.msgs, Msg{Subject: subject, Data: append([]byte(nil), data...), ID: msgID, At: s.now()})
		if msgID != "" {
			s.ids[msgID] = true
		}
	}
	return injected
}

// Last returns the last record of every subject that matches filter (a NATS subject filter:
// `*` one token, `>` the rest), in order of their appends. The stream is one for every
// subject, so the stream name is not looked at.
func (s *Stream) Last(ctx context.Context, stream, filter string) ([]store.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	last := map[string]int{}
	for i, m := range s.msgs {
		if Matches(filter, m.Subject) {
			last[m.Subject] = i
		}
	}
	var out []store.Record
	for i, m := range s.msgs {
		if last[m.Subject] == i && Matches(filter, m.Subject) {
			out = append(out, store.Record{Subject: m.Subject, Data: m.Data})
		}
	}
	return out, nil
}

func (s *Stream) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// LastOn returns the last record on subject, stamped with the time it was appended. The
// stream is one for every subject, so the stream name is not looked at.
func (s *Stream) LastOn(ctx context.Context, stream, subject string) (store.Record, bool, error) {
	if err := ctx.Err(); err != nil {
		return store.Record{}, false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range slices.Backward(s.msgs) {
		if m.Subject == subject {
			return store.Record{Subject: m.Subject, Data: m.Data, Time: m.At}, true, nil
		}
	}
	return store.Record{}, false, nil
}

// Matches reports whether subject matches the NATS subject filter.
func Matches(filter, subject string) bool {
	f, s := strings.Split(filter, "."), strings.Split(subject, ".")
	for i, tok := range f {
		switch {
		case tok == ">":
			return len(s) > i
		case i >= len(s) || (tok != "*" && tok != s[i]):
			return false
		}
	}
	return len(f) == len(s)
}

// Msgs returns every record appended, oldest first.
func (s *Stream) Msgs() []Msg {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.msgs)
}
