package harness

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/service"
)

// RegisteredManager is a manager registered on a plane by ownerA.cli, granted supervise, and
// that caller's connection.
type RegisteredManager struct {
	p   *TestPlane
	Cli *nats.Conn
	m   *ManagerKeys
	act Material
}

func NewRegisteredManager(t testing.TB, p *TestPlane) *RegisteredManager {
	t.Helper()
	Grant(t, p, OwnerA, "cli", "supervise")
	r := &RegisteredManager{p: p, Cli: CallerConn(t, p, OwnerA, "cli"), m: NewManagerKeys(t)}
	_, r.act = Registered(t, r.Cli, OwnerA, "cli", r.m)
	return r
}

// Renewal is a fresh renewal body of operation op, sent by ownerA.cli.
func (r *RegisteredManager) Renewal(t testing.TB, op string) map[string]any {
	return Renewal(r.m.Body(t, op, "cli"), r.act.NextRegistrationProof, r.p.Account(), 0)
}

// PausePoint holds the next mint that reaches the commit fence until released.
type PausePoint struct {
	Armed   atomic.Bool
	reached chan struct{}
	Release chan struct{}
}

func NewPausePoint() *PausePoint {
	return &PausePoint{reached: make(chan struct{}), Release: make(chan struct{})}
}

// Hook is the plane's BeforeCommit: it holds exactly one mint, the first after arm.
func (pp *PausePoint) Hook() {
	if pp.Armed.CompareAndSwap(true, false) {
		close(pp.reached)
		<-pp.Release
	}
}

func (pp *PausePoint) Wait(t testing.TB) {
	t.Helper()
	select {
	case <-pp.reached:
	case <-time.After(10 * time.Second):
		t.Fatal("no mint reached the commit fence")
	}
}

// PausedPlane starts a plane whose next armed mint pauses before its commit, with one manager
// registered by ownerA.cli (who holds supervise).
func PausedPlane(t *testing.T) (*PausePoint, *TestPlane, *nats.Conn, *ManagerKeys, Material) {
	t.Helper()
	pp := NewPausePoint()
	p := StartPlane(t, func(c *service.Config) {
		c.Workers = 4
		c.Hooks = &service.Hooks{BeforeCommit: pp.Hook}
	})
	Grant(t, p, OwnerA, "cli", "supervise")
	cli := CallerConn(t, p, OwnerA, "cli")
	m := NewManagerKeys(t)
	_, act := Registered(t, cli, OwnerA, "cli", m)
	return pp, p, cli, m, act
}
