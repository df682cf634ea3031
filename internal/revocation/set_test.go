package revocation

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/internal/body"
	"github.com/cotal-ai/authplane/internal/space"
	"github.com/cotal-ai/authplane/internal/store/storetest"
	"github.com/cotal-ai/authplane/subjects"
)

const testKey = "ADATAACCOUNTPUBLICKEYFORTESTSXXXXXXXXXXXXXXXXXXXXXXXXXXX"

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

// noBroker is a broker whose resolvers cannot be read: a revoke then signs and pushes, and here
// signing fails first (no operator signing key), after the keys joined the set.
type noBroker struct{}

func (noBroker) Servers(context.Context) (int, error) { return 1, nil }
func (noBroker) Push(context.Context, string) error   { return errors.New("no broker") }
func (noBroker) Lookup(context.Context, int) ([]string, error) {
	return nil, errors.New("no broker")
}
func (noBroker) Connections(context.Context, string, int) (int, error) {
	return 0, errors.New("no broker")
}

// A revocation set holds every key ended in the last day, which passes a request body's size
// limit after some 180 ended instances: it is still read and added to (the 200th end of a race
// test once failed here, as would every end and start after it).
func TestARevocationSetLargerThanARequestBodyStillTakesKeys(t *testing.T) {
	gates := storetest.New()
	s := &Set{Gates: gates, Account: testKey, Broker: noBroker{}, Capacity: 10_000, Now: func() time.Time { return time.Unix(1_800_000_000, 0) },
		Sign: func(map[string]int64) (string, int64, error) { return "", 0, space.ErrNoOperatorSigner }}
	var keys []string
	for i := range 1200 {
		keys = append(keys, fmt.Sprintf("U%055d", i)) // as long as a user nkey
	}
	for i := 0; i < len(keys); i += 5 { // one end's five keys at a time
		out, err := s.Revoke(ctx(t), keys[i:i+5])
		if err != nil || out.Done() || !errors.Is(out.Cause, ErrNoSigner) {
			t.Fatalf("end %d: got %+v, %v; want the keys on the set and a reason the broker was not told", i/5+1, out, err)
		}
	}
	e, err := gates.Get(ctx(t), subjects.RevocationsKey(testKey))
	if err != nil {
		t.Fatal(err)
	}
	var r row
	if err := decodeRow(e.Value, &r); err != nil || len(r.Revoked) != len(keys) || len(e.Value) <= body.MaxBytes {
		t.Fatalf("got a set of %d bytes with %d keys (%v), want all %d keys in more than %d bytes", len(e.Value), len(r.Revoked), err, len(keys), body.MaxBytes)
	}
}
