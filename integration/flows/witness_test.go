package flows

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/core/store"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// ownerC is a third owner: one with no scope and no manager.
const ownerC = "u_cccccccccccccccccccccccccc"

// publishRunStarts publishes n run-starts of principal owner.actor with payloads of size bytes
// on nc, waits until the broker has taken them, and returns their subjects in order.
func publishRunStarts(t testing.TB, nc *nats.Conn, owner, actor, uid string, n, size int) []string {
	t.Helper()
	payload := make([]byte, size)
	var out []string
	for range n {
		nonce := make([]byte, 12)
		if _, err := rand.Read(nonce); err != nil {
			t.Fatal(err)
		}
		s := subjects.RunStart{Space: harness.TestSpace, Route: subjects.RouteOne, Owner: owner, Actor: actor, UID: uid,
			Generation: "1", Nonce: hex.EncodeToString(nonce)}.Subject()
		if err := nc.Publish(s, payload); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return out
}

// A witnessed run-start of one owner survives every other owner's flood of run-starts: one with no scope and no manager sends run-starts of 1 MiB, which are stored
// nowhere; one with a manager of its own sends twice its byte budget and then twice its count
// budget, and its own stream keeps within both, its oldest pushed out and counted. The first
// owner's manager still admits its run afterwards.
func TestAFloodOfRunStartsCannotEvictAnotherOwnersWitness(t *testing.T) {
	t.Parallel()
	const bytes, runs = 4 << 20, 16
	p := harness.StartPlane(t, func(c *service.Config) {
		c.WitnessBytes, c.WitnessRuns = bytes, runs
		c.Hooks = &service.Hooks{WitnessSampleEvery: 20 * time.Millisecond}
	})
	env := harness.NewRunEnv(t, p)
	victim := env.RunStart(subjects.RouteOne, "")

	// Owner B has a manager of its own: its run-starts are witnessed, within its budget.
	harness.Grant(t, p, harness.OwnerB, "cli", "supervise")
	bm := harness.NewManagerKeys(t)
	harness.Registered(t, harness.CallerConn(t, p, harness.OwnerB, "cli"), harness.OwnerB, "cli", bm)
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if n := harness.Sample(harness.Scrape(t, p.HTTPURL()), "authplane_witness_owners", nil); n != 2 {
			return fmt.Errorf("authplane_witness_owners: got %v, want 2 (owners A and B)", n)
		}
		return nil
	})

	const big = 1<<20 - 4<<10
	publishRunStarts(t, harness.CallerConn(t, p, ownerC, "flood"), ownerC, "flood", harness.NewManagerKeys(t).Uid, 2*bytes/big, big)
	flooder := harness.CallerConn(t, p, harness.OwnerB, "flood")
	stored := func(subject string) {
		t.Helper()
		testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
			_, err := harness.LastMsg(t, p, harness.WitnessStream(harness.OwnerB), subject)
			return err
		})
	}
	flood := publishRunStarts(t, flooder, harness.OwnerB, "flood", bm.Uid, 2*bytes/big, big)
	stored(flood[len(flood)-1])
	info, err := harness.StreamInfo(t, p, harness.WitnessStream(harness.OwnerB))
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Bytes > bytes || info.State.Msgs == 0 {
		t.Errorf("owner B's witness after %d run-starts of 1 MiB: %d of them in %d bytes, want some, in at most its budget of %d", len(flood), info.State.Msgs, info.State.Bytes, bytes)
	}
	small := publishRunStarts(t, flooder, harness.OwnerB, "flood", bm.Uid, 2*runs, 2)
	stored(small[len(small)-1])
	if info, err = harness.StreamInfo(t, p, harness.WitnessStream(harness.OwnerB)); err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != runs {
		t.Errorf("owner B's witness after %d more run-starts: %d of them, want its budget of %d", len(small), info.State.Msgs, runs)
	}
	if _, err := harness.LastMsg(t, p, harness.WitnessStream(harness.OwnerB), small[0]); err == nil {
		t.Errorf("owner B's oldest small run-start is still witnessed, want it pushed out by its newer ones")
	}
	pushedOut := float64(len(flood) + len(small) - runs)
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if n := harness.Sample(harness.Scrape(t, p.HTTPURL()), "authplane_witness_evicted_total", nil); n != pushedOut {
			return fmt.Errorf("authplane_witness_evicted_total: got %v, want %v (owner B's own, pushed out)", n, pushedOut)
		}
		return nil
	})
	if _, err := p.JS(t).Stream(t.Context(), harness.WitnessStream(ownerC)); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("owner C (no manager) has a witness stream: %v, want none: its run-starts are stored nowhere", err)
	}

	if _, err := harness.LastMsg(t, p, harness.WitnessStream(harness.OwnerA), victim); err != nil {
		t.Errorf("owner A's witness after the floods: %v, want it still there", err)
	}
	if _, err := env.Cli.Admit(env.Ctx(), env.M.Manager, env.Cur, client.NewRunID(), victim); err != nil {
		t.Errorf("admitting owner A's run-start after the floods: %v, want it admitted", err)
	}
}

// A start removes the one witness stream every owner shared in earlier releases (its subjects
// overlap every owner's), checks every owner's witness stream as it checks every store, and
// gives each this start's limits; a misconfigured one refuses the start, naming it.
func TestAStartRemovesTheSharedWitnessAndChecksEveryOwnersOwn(t *testing.T) {
	t.Parallel()
	shared := jetstream.StreamConfig{Name: subjects.SharedWitnessStream(harness.TestSpace), Subjects: subjects.RunStartExports(harness.TestSpace),
		NoAck: true, MaxAge: store.WitnessMaxAge, MaxBytes: 64 << 20, Storage: jetstream.FileStorage, DenyDelete: true, DenyPurge: true}
	owned := func(edit func(*jetstream.StreamConfig)) jetstream.StreamConfig {
		c := store.WitnessSpec(harness.TestSpace, harness.OwnerA, store.Options{}).Config
		edit(&c)
		return c
	}
	tests := []struct {
		name   string
		before jetstream.StreamConfig
		// refused names the fields a refused start names; none: the start serves.
		refused []string
	}{
		{"the shared witness of an earlier release", shared, nil},
		{"an owner's witness with other limits", owned(func(c *jetstream.StreamConfig) { c.MaxMsgs, c.MaxBytes = 5, 2<<20 }), nil},
		{"an owner's witness that acks", owned(func(c *jetstream.StreamConfig) { c.NoAck = false }), []string{"no_ack"}},
		{"an owner's witness of another owner's run-starts", owned(func(c *jetstream.StreamConfig) {
			c.Subjects = subjects.OwnerRunStarts(harness.TestSpace, harness.OwnerB)
		}), []string{"subjects"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := harness.StartStandalone(t, harness.TestSpace)
			_, js := harness.PlaneConn(t, s.Material, s.URL())
			if _, err := js.CreateStream(t.Context(), tt.before); err != nil {
				t.Fatalf("pre-create %s: %v", tt.before.Name, err)
			}
			cfg := harness.PlaneConfig(t)
			harness.AgainstStandalone(s)(&cfg)
			if tt.refused != nil {
				p, err := harness.TryStart(t, cfg)
				if err == nil {
					harness.ClosePlane(t, p)
					t.Fatalf("Start: got a running plane, want service.ErrMisconfigured")
				}
				for _, want := range append([]string{tt.before.Name}, tt.refused...) {
					if !errors.Is(err, service.ErrMisconfigured) || !strings.Contains(err.Error(), want) {
						t.Errorf("Start: got %v, want service.ErrMisconfigured naming %q", err, want)
					}
				}
				return
			}
			p := harness.StartPlane(t, func(c *service.Config) { *c = cfg })
			if _, err := js.Stream(t.Context(), shared.Name); !errors.Is(err, jetstream.ErrStreamNotFound) {
				t.Errorf("the shared witness after the start: %v, want it gone", err)
			}
			env := harness.NewRunEnv(t, p)
			info, err := harness.StreamInfo(t, p, harness.WitnessStream(harness.OwnerA))
			if err != nil {
				t.Fatal(err)
			}
			if c := info.Config; c.MaxMsgs != store.DefaultWitnessRuns || c.MaxBytes != store.DefaultWitnessBytes {
				t.Errorf("owner A's witness: got max_msgs %d max_bytes %d, want this start's %d and %d", c.MaxMsgs, c.MaxBytes, store.DefaultWitnessRuns, store.DefaultWitnessBytes)
			}
			env.Admitted()
		})
	}
}

// An upgrade from the shared witness: a start finds the shared stream an earlier release
// kept, removes it, and makes the witness of every owner with registered instances without
// waiting for a new credential, so a manager registered before the upgrade admits a run
// started after it with the proof it already had.
func TestAnUpgradeFromTheSharedWitnessCapturesEveryOwnerAgain(t *testing.T) {
	t.Parallel()
	s := harness.StartStandalone(t, harness.TestSpace)
	dir := t.TempDir()
	first := harness.StartPlane(t, func(c *service.Config) { harness.AgainstStandalone(s)(c); c.Dir = dir })
	env := harness.NewRunEnv(t, first)
	harness.ClosePlane(t, first.Plane)

	// What an earlier release left: no witness of owner A's, the shared one instead.
	_, js := harness.PlaneConn(t, s.Material, s.URL())
	if err := js.DeleteStream(t.Context(), harness.WitnessStream(harness.OwnerA)); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: subjects.SharedWitnessStream(harness.TestSpace),
		Subjects: subjects.RunStartExports(harness.TestSpace), NoAck: true, MaxAge: store.WitnessMaxAge, DenyDelete: true, DenyPurge: true}); err != nil {
		t.Fatal(err)
	}

	second := harness.StartPlane(t, func(c *service.Config) { harness.AgainstStandalone(s)(c); c.Dir = dir })
	if _, err := js.Stream(t.Context(), subjects.SharedWitnessStream(harness.TestSpace)); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("the shared witness after the upgrade: %v, want it gone", err)
	}
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		_, err := js.Stream(t.Context(), harness.WitnessStream(harness.OwnerA))
		return err
	})
	env.P = second
	if _, err := env.Cli.Admit(env.Ctx(), env.M.Manager, env.Cur, client.NewRunID(), env.RunStart(subjects.RouteOne, "")); err != nil {
		t.Errorf("a run started after the upgrade, admitted with the proof from before: %v, want it admitted", err)
	}
}
