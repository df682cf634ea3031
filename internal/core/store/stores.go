package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotal-ai/authplane/subjects"
)

// Stores is every bucket and record stream of a space, opened on the plane-account connection.
type Stores struct {
	Space string

	// Auth holds the fences: gates, run fences, revocation sets.
	Auth *KV
	// Actors is the ledger of scopes.
	Actors *KV
	// Issued holds issued evidence and attempt rows; Accepted the write-once accepted rows.
	Issued   *KV
	Accepted *KV
	// Admission holds run admissions, revocation markers and witness markers (create-only).
	Admission *KV
	// RunStatus holds run status rows (the `cotal_records_<space>` bucket).
	RunStatus *KV
	// Platform holds supervisor assignments.
	Platform *KV
	// Keys holds bearer issuer keys; Secrets claimed instance identities.
	Keys    *KV
	Secrets *KV

	// Retries counts the writes fences retried on any of the buckets: what the plane's
	// metrics export.
	Retries atomic.Int64

	js      jetstream.JetStream
	streams sync.Map // stream name → jetstream.Stream, for LastOn
	opts    Options
	log     *slog.Logger
	witness witnesses
}

// Open ensures every stream of the space (Ensure) and every owner's witness stream that
// exists, and opens the buckets. Only a first start creates streams: once the space's stores
// existed (o.Existed, or its fence bucket exists, which a first start creates last), a stream
// or bucket that is gone was lost, and Open refuses (ErrLost) naming each, unless o.Recreate.
func Open(ctx context.Context, nc *nats.Conn, space string, o Options, log *slog.Logger) (*Stores, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	// The fence bucket is created last, once every other stream exists: a first start that
	// stopped half-way leaves it absent, and is completed by the next start.
	specs := Specs(space, o)
	marker := slices.IndexFunc(specs, func(s Spec) bool { return s.Bucket == subjects.AuthBucket(space) })
	if !o.Recreate {
		if err := refuseLost(ctx, js, specs, specs[marker].Config.Name, o.Existed, log); err != nil {
			return nil, err
		}
	}
	if err := Ensure(ctx, js, slices.Delete(slices.Clone(specs), marker, marker+1), log); err != nil {
		return nil, err
	}
	if err := Ensure(ctx, js, specs[marker:marker+1], log); err != nil {
		return nil, err
	}
	s := &Stores{Space: space, js: js, opts: o.withDefaults(), log: log}
	if err := s.openWitnesses(ctx); err != nil {
		return nil, err
	}
	for _, b := range []struct {
		kv   **KV
		name string
	}{
		{&s.Auth, subjects.AuthBucket(space)},
		{&s.Actors, subjects.ActorsBucket(space)},
		{&s.Issued, subjects.IssuedBucket(space)},
		{&s.Accepted, subjects.AcceptedBucket(space)},
		{&s.Admission, subjects.AdmissionBucket(space)},
		{&s.RunStatus, subjects.RecordsBucket(space)},
		{&s.Platform, subjects.PlatformBucket(space)},
		{&s.Keys, subjects.KeysBucket(space)},
		{&s.Secrets, subjects.SecretsBucket(space)},
	} {
		var kv *KV
		err := retry(ctx, log, func(ctx context.Context) error {
			var err error
			kv, err = openKV(ctx, js, b.name)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("open bucket %s: %w", b.name, err)
		}
		kv.retries = &s.Retries
		*b.kv = kv
	}
	return s, nil
}

// Append publishes one record to a record stream (minted, audit) and waits for its ack. A
// non-empty msgID makes a retry idempotent: within the stream's duplicate window a second
// append with the same id is acknowledged without a second record. A full stream is ErrFull; a
// lost ack is ErrUnknownOutcome.
func (s *Stores) Append(ctx context.Context, subject string, data []byte, msgID string) error {
	return Appender{s.js}.Append(ctx, subject, data, msgID)
}

// Appender appends records over a JetStream context of its own, as Stores.Append does: for a
// command that writes records without opening the stores.
type Appender struct{ JS jetstream.JetStream }

// Append is Stores.Append.
func (a Appender) Append(ctx context.Context, subject string, data []byte, msgID string) error {
	var opts []jetstream.PublishOpt
	if msgID != "" {
		opts = append(opts, jetstream.WithMsgID(msgID))
	}
	if _, err := a.JS.Publish(ctx, subject, data, opts...); err != nil {
		return fmt.Errorf("append %s: %w", subject, Classify(err))
	}
	return nil
}

// Last reads the last record of every subject of stream that matches filter, in no order: a
// leader read of the subjects, then of each one's last message, several at once. It makes no
// consumer (the auditors' readers are bounded per stream). A record that ages out between the
// two reads is left out.
func (s *Stores) Last(ctx context.Context, stream, filter string) ([]Record, error) {
	return Appender{s.js}.Last(ctx, stream, filter)
}

// Record is one message of a record stream.
type Record struct {
	Subject string
	Data    []byte
	// Time is when the stream stored it, by the server's clock.
	Time time.Time
}

// lastReads is how many last-message reads Last has in flight at once.
const lastReads = 16

// Last is Stores.Last.
func (a Appender) Last(ctx context.Context, stream, filter string) ([]Record, error) {
	st, err := a.JS.Stream(ctx, stream)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", stream, Classify(err))
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return nil, fmt.Errorf("subjects of %s in %s: %w", filter, stream, Classify(err))
	}
	names := slices.Collect(maps.Keys(info.State.Subjects))
	out := make([]*Record, len(names))
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	slots := make(chan struct{}, lastReads)
	for i, subject := range names {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			r, found, err := lastOn(ctx, st, subject)
			switch {
			case err != nil:
				errs[i] = err
			case found:
				out[i] = &r
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	records := make([]Record, 0, len(out))
	for _, r := range out {
		if r != nil {
			records = append(records, *r)
		}
	}
	return records, nil
}

// LastOn reads the last record on one subject of stream, a leader read; found is false when
// the subject has none. The stream's handle is looked up once.
func (s *Stores) LastOn(ctx context.Context, stream, subject string) (r Record, found bool, err error) {
	st, ok := s.streams.Load(stream)
	if !ok {
		h, err := s.js.Stream(ctx, stream)
		if err != nil {
			return Record{}, false, fmt.Errorf("stream %s: %w", stream, Classify(err))
		}
		st, _ = s.streams.LoadOrStore(stream, h)
	}
	return lastOn(ctx, st.(jetstream.Stream), subject)
}

// LastOn is Stores.LastOn, the stream looked up each time.
func (a Appender) LastOn(ctx context.Context, stream, subject string) (Record, bool, error) {
	st, err := a.JS.Stream(ctx, stream)
	if err != nil {
		return Record{}, false, fmt.Errorf("stream %s: %w", stream, Classify(err))
	}
	return lastOn(ctx, st, subject)
}

func lastOn(ctx context.Context, st jetstream.Stream, subject string) (Record, bool, error) {
	m, err := st.GetLastMsgForSubject(ctx, subject)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return Record{}, false, nil
	case err != nil:
		return Record{}, false, fmt.Errorf("last record on %s: %w", subject, Classify(err))
	}
	return Record{Subject: m.Subject, Data: m.Data, Time: m.Time}, true, nil
}

// OpenBucket opens one existing bucket without ensuring anything: for tools that connect to a
// plane's broker.
func OpenBucket(ctx context.Context, nc *nats.Conn, bucket string) (*KV, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	return openKV(ctx, js, bucket)
}

// openKV opens a bucket and its stream (read directly, so delete markers are seen).
func openKV(ctx context.Context, js jetstream.JetStream, bucket string) (*KV, error) {
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		return nil, err
	}
	st, err := js.Stream(ctx, "KV_"+bucket)
	if err != nil {
		return nil, err
	}
	return &KV{kv: kv, stream: st, bucket: bucket, sole: st.CachedInfo().Config.AllowDirect}, nil
}
