package harness

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/client"
)

// Registered prepares and activates manager m for owner through the client of caller conn nc
// (a principal with supervise) and returns both materials.
func Registered(t testing.TB, nc *nats.Conn, owner, actor string, m *ManagerKeys) (prep, act Material) {
	t.Helper()
	prep, act, err := register(nc, owner, actor, m, true)
	if err != nil {
		t.Fatal(err)
	}
	return prep, act
}

// RegisterAll prepares every manager of ms at once, as Registered does one, and activates
// those activate names; preps and acts are in the order of ms (acts zero where not activated).
// A first prepare waits for the account's next signing, about a second, and those sent together
// share it: one at a time, n registrations take n seconds.
func RegisterAll(t testing.TB, nc *nats.Conn, owner, actor string, ms []*ManagerKeys, activate []bool) (preps, acts []Material) {
	t.Helper()
	preps, acts = make([]Material, len(ms)), make([]Material, len(ms))
	errs := make([]error, len(ms))
	var wg sync.WaitGroup
	slots := make(chan struct{}, registerAtOnce)
	for i, m := range ms {
		wg.Go(func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			preps[i], acts[i], errs[i] = register(nc, owner, actor, m, activate[i])
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return preps, acts
}

// registerAtOnce bounds RegisterAll's registrations under way: an owner may have 8 requests
// under way at once (--owner-in-flight's default), and one past that is refused.
const registerAtOnce = 8

// register prepares manager m, and activates it if activate, through the client of nc.
func register(nc *nats.Conn, owner, actor string, m *ManagerKeys, activate bool) (prep, act Material, err error) {
	c, err := PrincipalClient(nc, owner, actor)
	if err != nil {
		return prep, act, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	// A first prepare waits for the broker to list the instance's signing key; one the broker
	// did not confirm within the plane's request timeout answers `unavailable … retry shortly`,
	// and a manager retries it, as this does.
	var p *client.Material
	for {
		p, err = c.Prepare(ctx, m.Manager)
		if client.CodeOf(err) != "unavailable" || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		return prep, act, fmt.Errorf("prepare %s: %w", m.Iid, err)
	}
	if !activate {
		return *p, act, nil
	}
	a, err := c.Activate(ctx, m.Manager, p.RegistrationProof)
	if err != nil {
		return prep, act, fmt.Errorf("activate %s: %w", m.Iid, err)
	}
	return *p, *a, nil
}
