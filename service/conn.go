package service

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/internal/platform/broker"
	"github.com/cotal-ai/authplane/subjects"
)

// dial opens one of the plane's own connections as a fresh short-lived user of issuer's
// account; every reconnect presents a newly signed JWT. reconnected, when set, runs after every
// reconnection; extra are options of this connection's own.
func (p *Plane) dial(role string, iss *issue.Issuer, perms subjects.Permissions, reconnected func(), extra ...nats.Option) (*nats.Conn, error) {
	auth, err := iss.Connect(p.userName(role), perms, p.cfg.PlaneUserTTL)
	if err != nil {
		return nil, err
	}
	return p.dialWith(role, auth, reconnected, extra...)
}

// userName is the name of the plane's own user of role.
func (p *Plane) userName(role string) string { return "plane." + role + "_" + p.self() }

// dialWith opens one of the plane's own connections, authenticated by auth: in process to an
// embedded broker, else to the cluster's URL. A connection lost and regained is logged and
// counted (a renewal's forced reconnect is neither); reconnected, when set, runs after every
// reconnection; extra are options of this connection's own.
func (p *Plane) dialWith(role string, auth nats.Option, reconnected func(), extra ...nats.Option) (*nats.Conn, error) {
	log := p.log.With("conn", role)
	var lost atomic.Bool
	var slow atomic.Uint64
	opts := []nats.Option{auth}
	if p.inProcess != nil {
		opts = append(opts, p.inProcess)
	}
	opts = append(opts,
		nats.Name("authplane "+role+" "+p.self()),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil { // nil: a renewal's forced reconnect
				lost.Store(true)
				log.Warn("disconnected from NATS", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			if lost.Swap(false) {
				p.metrics.Reconnected(role)
				log.Info("reconnected to NATS", "url", broker.RedactURL(nc.ConnectedUrl()))
			} else {
				log.Debug("reconnected with a renewed user")
			}
			if reconnected != nil {
				reconnected()
			}
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subj := ""
			if sub != nil {
				subj = sub.Subject
			}
			if errors.Is(err, nats.ErrSlowConsumer) {
				// Requests past an endpoint's pending limits are dropped, not buffered
				// (handlers.PendingMsgs): logged on the 1st, 2nd, 4th, 8th… spell, as a flood
				// may start one a second on every endpoint.
				if n := slow.Add(1); fault.Sparse(n) {
					log.Warn("requests dropped: they arrive faster than the plane takes them", "subject", subj, "spells", n)
				}
				return
			}
			log.Warn("NATS async error", "subject", subj, "err", err)
		}),
	)
	nc, err := p.connect(log, append(opts, extra...))
	if err != nil {
		return nil, fmt.Errorf("connect %s user to %s: %w", role, broker.RedactURL(p.info.NATSURL), err)
	}
	return nc, nil
}

// connect opens a connection with opts. Until --connect-timeout after the start began, a
// broker that cannot be reached yet (none of the URLs answers: a cluster starting beside the
// plane, a server restarting) is tried again, with backoff from 100 ms to 2 s; a broker that
// answers and refuses (the credentials) is not. A signal during the start ends the wait.
func (p *Plane) connect(log *slog.Logger, opts []nats.Option) (*nats.Conn, error) {
	wait := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		nc, err := nats.Connect(p.info.NATSURL, opts...)
		left := time.Until(p.connectBy)
		if err == nil || p.inProcess != nil || !unreachable(err) || left <= 0 {
			return nc, err
		}
		p.setPhase(fmt.Sprintf("connecting to NATS at %s (attempt %d: %v)", broker.RedactURL(p.info.NATSURL), attempt, err))
		if fault.Sparse(attempt) {
			log.Warn("NATS is not reachable yet; retrying until --connect-timeout", "attempt", attempt, "err", err, "connect_timeout", p.cfg.ConnectTimeout.String())
		}
		select {
		case <-p.startCtx.Done():
			return nil, errors.Join(err, p.startCtx.Err())
		case <-time.After(min(wait, left)):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// unreachable reports whether err says no broker could be reached (rather than that one
// answered and refused).
func unreachable(err error) bool {
	var ne net.Error
	return errors.Is(err, nats.ErrNoServers) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, syscall.ECONNREFUSED) || errors.As(err, &ne)
}

// renewRetry is how soon a failed renewal of one of the plane's users is tried again: the user
// it would replace has a third of its life left.
const renewRetry = time.Second

// renewEvery runs fn at two thirds of the plane users' lifetime, before the broker would cut
// them off, and again every renewRetry while it fails, until Close, which waits for a renewal
// under way to finish.
func (p *Plane) renewEvery(what string, fn func() error) {
	stop, done := make(chan struct{}), make(chan struct{})
	p.bg.Go(func() {
		defer close(done)
		t := time.NewTimer(p.cfg.PlaneUserTTL * 2 / 3)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			next := p.cfg.PlaneUserTTL * 2 / 3
			if err := fn(); err != nil {
				next = renewRetry
			}
			t.Reset(next)
		}
	})
	p.onClose("stop renewing the "+what, func() error { close(stop); <-done; return nil })
}

// renewal records the outcome of a renewal of the plane's user of role: a failure is counted
// and logged, and /health says so until a renewal of that role succeeds.
func (p *Plane) renewal(role string, err error) error {
	p.renewMu.Lock()
	defer p.renewMu.Unlock()
	if err == nil {
		delete(p.renewFailing, role)
		return nil
	}
	p.metrics.RenewalFailed(role)
	p.log.Warn("renewing the plane's "+role+" user failed; retrying", "in", renewRetry, "err", err)
	if p.renewFailing == nil {
		p.renewFailing = map[string]string{}
	}
	p.renewFailing[role] = err.Error()
	return err
}

// renewalFailing says which of the plane's users could not be renewed, and why; "" when none.
func (p *Plane) renewalFailing() string {
	p.renewMu.Lock()
	defer p.renewMu.Unlock()
	roles := slices.Sorted(maps.Keys(p.renewFailing))
	if len(roles) == 0 {
		return ""
	}
	return "renewing the " + roles[0] + " user fails (it is retried; the current one expires): " + p.renewFailing[roles[0]]
}

// connectRenewed opens one of the plane's own connections (the store's, the system user's),
// renewed by reconnecting with a fresh user: a store call cut off by it has an unknown outcome,
// which every writer settles by re-reading. reconnected, when set, runs after every
// reconnection; extra are options of this connection's own.
func (p *Plane) connectRenewed(role string, iss *issue.Issuer, perms subjects.Permissions, reconnected func(), extra ...nats.Option) (*nats.Conn, error) {
	nc, err := p.dial(role, iss, perms, reconnected, extra...)
	if err != nil {
		return nil, err
	}
	// A drain waits for requests in flight: each may take its whole deadline.
	p.onClose("drain the "+role+" connection", func() error { return drain(nc, p.drainTimeout()) })
	p.renewEvery(role+" user", func() error {
		if err := nc.ForceReconnect(); err != nil && !nc.IsClosed() {
			return p.renewal(role, err)
		}
		return p.renewal(role, nil)
	})
	return nc, nil
}

// drainTimeout is how long a drain may wait for requests in flight: what is left of
// --drain-timeout once the plane is stopping (every drain of the stop shares it), or the whole
// of it when a renewal retires a generation of the serving side.
func (p *Plane) drainTimeout() time.Duration {
	if by := p.drainBy.Load(); by != nil {
		return max(time.Until(*by), 0)
	}
	return p.cfg.DrainTimeout
}

// connected reports whether every connection of the plane is up.
func (p *Plane) connected() bool {
	if !p.storeNC.IsConnected() {
		return false
	}
	if s := p.serving.Load(); s != nil && !s.nc.IsConnected() {
		return false
	}
	c := p.callout.Load()
	return c == nil || c.IsConnected()
}

// drain drains nc and waits until it has closed, or closes it after timeout. A connection that
// is down has nothing to drain: it is closed, and that is no error.
func drain(nc *nats.Conn, timeout time.Duration) error {
	if nc.IsClosed() {
		return nil
	}
	if !nc.IsConnected() {
		nc.Close()
		return nil
	}
	defer nc.Close()
	closed := make(chan struct{})
	nc.SetClosedHandler(func(*nats.Conn) { close(closed) })
	if err := nc.Drain(); err != nil {
		if errors.Is(err, nats.ErrConnectionClosed) {
			return nil
		}
		return err
	}
	select {
	case <-closed:
	case <-time.After(timeout):
	}
	return nil
}
