package store_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotal-ai/authplane/internal/core/store"
)

// TestClassifyRetriesALeaderChangeAndAnswersACASLossAtOnce: what an R3 bucket answers while
// leadership moves is an unknown outcome, which the fence settles by re-reading and retries
// until the request's deadline: a 503 of any code (10163 "expected last sequence per subject
// temporarily unavailable", which 2.11 servers send after a leader change; 10008 "JetStream
// system temporarily unavailable", what v2.15 sends while a stream has no leader), a timeout,
// no responders, or a connection cut. A CAS loss (10071 on R1; 10164 on R3, which v2.15 also
// answers a write in flight on the same key with) and a full stream are definite; any other API
// error is the server's refusal, kept as it is. The errors are built the way nats.go returns
// them from a KV update or a publish.
func TestClassifyRetriesALeaderChangeAndAnswersACASLossAtOnce(t *testing.T) {
	t.Parallel()
	published := func(code, errCode int, description string) error {
		return fmt.Errorf("nats: %w", &jetstream.APIError{Code: code, ErrorCode: jetstream.ErrorCode(errCode), Description: description})
	}
	casLost := func(code, errCode int, description string) error { // a KV update's wrong last sequence
		return fmt.Errorf("%w: %w", published(code, errCode, description), jetstream.ErrKeyRevisionMismatch)
	}
	tests := []struct {
		name string
		err  error
		want error // nil: returned as it is
	}{
		{"10163 while a new leader applies its log", published(503, 10163, "expected last sequence per subject temporarily unavailable"), store.ErrUnknownOutcome},
		{"10008 while the stream has no leader", published(503, 10008, "JetStream system temporarily unavailable"), store.ErrUnknownOutcome},
		{"the attempt's deadline", fmt.Errorf("publish: %w", context.DeadlineExceeded), store.ErrUnknownOutcome},
		{"no responders", jetstream.ErrNoStreamResponse, store.ErrUnknownOutcome},
		{"a connection cut", nats.ErrConnectionClosed, store.ErrUnknownOutcome},
		{"10164, a CAS lost on R3", casLost(400, 10164, "wrong last sequence"), store.ErrCASLost},
		{"10071, a CAS lost on R1", casLost(400, 10071, "wrong last sequence: 7"), store.ErrCASLost},
		{"a write-once key written", published(503, 10077, "maximum messages per subject exceeded"), store.ErrCASLost},
		{"a full stream", published(503, 10077, "maximum bytes exceeded"), store.ErrFull},
		{"another refusal", published(400, 10058, "stream name already in use"), nil},
	}
	definite := []error{store.ErrUnknownOutcome, store.ErrCASLost, store.ErrFull}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := store.Classify(tt.err)
			for _, class := range definite {
				if is := errors.Is(got, class); is != (class == tt.want) {
					t.Errorf("Classify(%v) is %v: %v, want %v", tt.err, class, is, class == tt.want)
				}
			}
			if !errors.Is(got, tt.err) {
				t.Errorf("Classify(%v) = %v: the cause is lost", tt.err, got)
			}
		})
	}
}
