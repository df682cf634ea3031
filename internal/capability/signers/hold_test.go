package signers

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

// userKey is a fresh JWT user's public key.
func userKey(t testing.TB) string {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	return pub
}

// heldOut is the keys the JWT the resolver holds revokes, and until when.
func (r *resolver) heldOut(t testing.TB) jwt.RevocationList {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	c, err := jwt.DecodeAccountClaims(r.held)
	if err != nil {
		t.Fatalf("the held JWT: %v", err)
	}
	return c.Revocations
}

// TestAHeldKeyIsRevokedUntilItsTimeWithinItsOwnersShare: a hold puts the key in the account
// JWT's revocations until its time, so every credential of it issued before is refused; one
// owner holds at most HoldsPerOwner keys, and another owner's hold still lands; past its time
// ReleaseHolds signs the account without the key, and a later hold stays.
func TestAHeldKeyIsRevokedUntilItsTimeWithinItsOwnersShare(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, b, _ := newSet(t)
		if err := s.Repush(ctx(t), true); err != nil {
			t.Fatal(err)
		}
		until := time.Now().Add(time.Minute)
		var mine []string
		for range HoldsPerOwner + 2 {
			k := userKey(t)
			mine = append(mine, k)
			s.Hold(k, "u_churner", until)
		}
		other := userKey(t)
		later := time.Now().Add(5 * time.Minute)
		s.Hold(other, "u_other", later)
		if s.Hold("not a key", "u_other", later) {
			t.Error("a hold of what is no user's key was asked for")
		}
		time.Sleep(2 * time.Second) // the round waits for the next second to sign
		synctest.Wait()
		held := b.heldOut(t)
		n := 0
		for _, k := range mine {
			if at, ok := held[k]; ok {
				n++
				if at != until.Unix() {
					t.Errorf("key held until %d, want %d", at, until.Unix())
				}
			}
		}
		if n != HoldsPerOwner {
			t.Errorf("the churning owner has %d of its %d keys held out, want its share of %d", n, len(mine), HoldsPerOwner)
		}
		if held[other] != later.Unix() {
			t.Errorf("the other owner's key is held until %d, want %d (its hold must not wait on the first owner's share)", held[other], later.Unix())
		}
		if len(held) != HoldsPerOwner+1 {
			t.Errorf("%d keys held out, want %d: %v", len(held), HoldsPerOwner+1, held)
		}

		if err := s.ReleaseHolds(ctx(t)); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if len(b.heldOut(t)) != HoldsPerOwner+1 {
			t.Fatal("a release before any hold passed let a key in")
		}
		time.Sleep(time.Until(until) + time.Second)
		pushes := len(b.pushed())
		if err := s.ReleaseHolds(ctx(t)); err != nil {
			t.Fatal(err)
		}
		held = b.heldOut(t)
		if len(b.pushed()) == pushes || len(held) != 1 || held[other] != later.Unix() {
			t.Fatalf("past the churner's holds the broker holds %v (%d pushes after %d), want the other owner's alone", held, len(b.pushed()), pushes)
		}
		cur, err := s.fence().Observe(ctx(t))
		if err != nil || len(cur.Row.Out) != 1 {
			t.Fatalf("the stored holds: %v, %v", cur.Row.Out, err)
		}
	})
}

// stuck is a resolver whose pushes never land: each waits for its context to end.
type stuck struct {
	resolver
	under atomic.Int32
}

func (b *stuck) Push(ctx context.Context, _ string) error {
	b.under.Add(1)
	defer b.under.Add(-1)
	<-ctx.Done()
	return ctx.Err()
}

// TestTheRoundsEndWhenThePlaneCloses: a hold is a change no one waits for, with a minute's
// deadline; once Serve's context ends (the plane closes), the round under way ends at once,
// Serve returns after it, and a change asked for after that is closed unmade.
func TestTheRoundsEndWhenThePlaneCloses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _, _ := newSet(t)
		b := &stuck{resolver: resolver{account: s.Account}}
		s.Broker = b
		stop, served := serving(s.Serve)
		synctest.Wait()
		s.Hold(userKey(t), "u_churner", time.Now().Add(time.Minute))
		time.Sleep(2 * time.Second) // the round waits for the next second to sign
		synctest.Wait()
		if n := b.under.Load(); n != 1 {
			t.Fatalf("%d pushes under way for a hold, want 1", n)
		}
		stop()
		synctest.Wait()
		select {
		case <-served:
		default:
			t.Fatal("Serve still runs after its context ended: a round outlives the plane")
		}
		if n := b.under.Load(); n != 0 {
			t.Fatalf("%d pushes still under way after Serve returned, want none", n)
		}
		if err := s.Repush(context.Background(), true); err == nil {
			t.Fatal("a push asked for after the close: got nil, want it unmade")
		}
		if n := b.under.Load(); n != 0 {
			t.Fatal("a push asked for after the close started a round")
		}
	})
}
