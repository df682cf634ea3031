package store

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Errors of the KV verbs. Test them with errors.Is.
var (
	// ErrNotFound: the key has never been written.
	ErrNotFound = errors.New("key not found")
	// ErrDeleted: the key's latest entry is a DEL or PURGE marker, which no writer of the
	// plane ever leaves: a fence that reads one refuses with failed-precondition.
	ErrDeleted = errors.New("key holds a delete marker")
	// ErrCASLost: the key moved since the revision the write was pinned to (or exists, for a
	// create). Re-read and re-check the fence before any retry.
	ErrCASLost = errors.New("revision mismatch")
	// ErrUnknownOutcome: the write may or may not have landed (timeout, leader change).
	// Settle it by re-reading.
	ErrUnknownOutcome = errors.New("outcome unknown")
	// ErrFull: the stream is at its size limit and discards new messages.
	ErrFull = errors.New("stream full")
)

const codeStoreFailed = 10077

// KV is one bucket. Reads are the leader's: a bucket of one replica on a server that is no
// cluster allows direct gets, which only that server answers; any other allows none (a
// follower would answer them).
type KV struct {
	kv     jetstream.KeyValue
	stream jetstream.Stream
	bucket string
	// sole: the bucket is one copy on a server that is no cluster (it allows direct gets).
	sole bool
	// retries counts the writes fences retried on the bucket (fence.RetryCounter); nil counts
	// nothing.
	retries *atomic.Int64
}

// Retried counts one write a fence retried on the bucket.
func (k *KV) Retried() {
	if k.retries != nil {
		k.retries.Add(1)
	}
}

// The headers a KV delete or purge marker carries.
const (
	kvOperationHeader = "KV-Operation"
	markerReason      = "Nats-Marker-Reason"
)

// Entry is a key's latest value and its revision.
type Entry struct {
	Value    []byte
	Revision uint64
}

// Sole reports whether the bucket is one copy, on a server that is no cluster: the only
// buckets that allow direct gets (directReads). Every read is then that copy's, which
// acknowledged every write made before the read was sent, so no read is stale
// (fence.Sole).
func (k *KV) Sole() bool { return k.sole }

// Bucket returns the bucket name.
func (k *KV) Bucket() string { return k.bucket }

// Get reads key's latest entry from the stream leader. It returns ErrNotFound for a key never
// written and ErrDeleted (with the marker's revision) for a DEL or PURGE marker, which the
// client's own Get would report as never written.
func (k *KV) Get(ctx context.Context, key string) (Entry, error) {
	m, err := k.stream.GetLastMsgForSubject(ctx, "$KV."+k.bucket+"."+key)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return Entry{}, fmt.Errorf("%s/%s: %w", k.bucket, key, ErrNotFound)
	case err != nil:
		return Entry{}, k.classify("read", key, err)
	case m.Header.Get(kvOperationHeader) != "" || m.Header.Get(markerReason) != "":
		return Entry{Revision: m.Sequence}, fmt.Errorf("%s/%s: %w", k.bucket, key, ErrDeleted)
	}
	return Entry{Value: m.Data, Revision: m.Sequence}, nil
}

// Create writes key only if it has never been written. Unlike the client's Create it does not
// write over a delete marker: that returns ErrDeleted. A key that exists is ErrCASLost.
func (k *KV) Create(ctx context.Context, key string, value []byte) (uint64, error) {
	rev, err := k.kv.Update(ctx, key, value, 0)
	if err == nil {
		return rev, nil
	}
	err = k.classify("create", key, err)
	if errors.Is(err, ErrCASLost) {
		if _, gerr := k.Get(ctx, key); errors.Is(gerr, ErrDeleted) {
			return 0, gerr
		}
	}
	return 0, err
}

// Update writes key only if its latest revision is rev.
func (k *KV) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	n, err := k.kv.Update(ctx, key, value, rev)
	if err != nil {
		return 0, k.classify("update", key, err)
	}
	return n, nil
}

// Watch streams updates of key, starting with its current value.
func (k *KV) Watch(ctx context.Context, key string) (jetstream.KeyWatcher, error) {
	return k.kv.Watch(ctx, key)
}

func (k *KV) classify(op, key string, err error) error {
	return fmt.Errorf("%s %s/%s: %w", op, k.bucket, key, Classify(err))
}

// Errors counts the JetStream errors Classify has mapped in this process, by class: what the
// plane's metrics export.
var Errors struct {
	CASLost, Full, UnknownOutcome, Refused atomic.Int64
}

// Classify maps a JetStream call's error to what a writer can act on: ErrCASLost and ErrFull
// are the server's definite answers; another JetStream API error (but a 503, which a leader
// change gives) is the server's definite refusal, returned as it is; anything else (a timeout,
// no responders, a connection cut or being renewed) leaves the outcome unknown:
// ErrUnknownOutcome, to be settled by re-reading.
func Classify(err error) error {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, jetstream.ErrKeyRevisionMismatch), errors.Is(err, jetstream.ErrKeyExists):
		Errors.CASLost.Add(1)
		return fmt.Errorf("%w: %w", ErrCASLost, err)
	case errors.As(err, &apiErr) && apiErr.ErrorCode == codeStoreFailed && strings.Contains(apiErr.Description, "maximum bytes"):
		Errors.Full.Add(1)
		return fmt.Errorf("%w: %w", ErrFull, err)
	case errors.As(err, &apiErr) && apiErr.ErrorCode == codeStoreFailed && strings.Contains(apiErr.Description, "per subject"):
		Errors.CASLost.Add(1)
		return fmt.Errorf("%w: %w", ErrCASLost, err) // a write-once key already holds its value
	case errors.As(err, &apiErr) && apiErr.Code != 503:
		Errors.Refused.Add(1)
		return err
	}
	Errors.UnknownOutcome.Add(1)
	return fmt.Errorf("%w: %w", ErrUnknownOutcome, err)
}

// backoff is the jittered pause before retry number attempt: 2ms doubling to 200ms, each
// drawn uniformly from [d/2, d).
func backoff(attempt int) time.Duration {
	d := 2 * time.Millisecond << min(attempt, 7)
	d = min(d, 200*time.Millisecond)
	return d/2 + rand.N(d/2)
}

// Attempt returns the context for one attempt of a retried store call: a third of ctx's
// remaining time, at most two seconds, so a call whose answer is lost (a leader change) leaves
// time to settle it and try again before the deadline.
func Attempt(ctx context.Context) (context.Context, context.CancelFunc) {
	d := 2 * time.Second
	if deadline, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(deadline)/3)
	}
	return context.WithTimeout(ctx, max(d, time.Millisecond))
}

// Pause waits the jittered backoff for attempt, or returns ctx's error if it ends first.
func Pause(ctx context.Context, attempt int) error {
	t := time.NewTimer(backoff(attempt))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
