package store

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotal-ai/authplane/subjects"
)

// Stores is every bucket and record stream of a space, opened on the plane-account connection.
type Stores struct {
	Space string

	Auth      *KV
	Actors    *KV
	Issued    *KV
	Accepted  *KV
	Admission *KV
	Records   *KV
	Platform  *KV
	Keys      *KV
	Secrets   *KV

	js jetstream.JetStream
}

// Open ensures every stream of the space (Ensure) and opens the buckets.
func Open(ctx context.Context, nc *nats.Conn, space string, o Options, log *slog.Logger) (*Stores, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	if err := Ensure(ctx, js, Specs(space, o), log); err != nil {
		return nil, err
	}
	s := &Stores{Space: space, js: js}
	for _, b := range []struct {
		kv   **KV
		name string
	}{
		{&s.Auth, subjects.AuthBucket(space)},
		{&s.Actors, subjects.ActorsBucket(space)},
		{&s.Issued, subjects.IssuedBucket(space)},
		{&s.Accepted, subjects.AcceptedBucket(space)},
		{&s.Admission, subjects.AdmissionBucket(space)},
		{&s.Records, subjects.RecordsBucket(space)},
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
		*b.kv = kv
	}
	return s, nil
}

// Append publishes one record to a record stream (minted, audit) and waits for the ack. A full
// stream is ErrFull; a lost ack is ErrUnknownOutcome.
func (s *Stores) Append(ctx context.Context, subject string, data []byte) error {
	if _, err := s.js.Publish(ctx, subject, data); err != nil {
		return fmt.Errorf("append %s: %w", subject, Classify(err))
	}
	return nil
}

// LastRecord returns the latest record on subject of stream (a leader read).
func (s *Stores) LastRecord(ctx context.Context, stream, subject string) ([]byte, error) {
	st, err := s.js.Stream(ctx, stream)
	if err != nil {
		return nil, err
	}
	m, err := st.GetLastMsgForSubject(ctx, subject)
	if err != nil {
		return nil, err
	}
	return m.Data, nil
}

// JetStream returns the JetStream context for callers that need a stream directly.
func (s *Stores) JetStream() jetstream.JetStream { return s.js }

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
	return &KV{kv: kv, stream: st, bucket: bucket}, nil
}
