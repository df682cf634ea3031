package service

import (
	"errors"
	"fmt"
	"time"

	"github.com/cotal-ai/authplane/internal/mint"
	"github.com/cotal-ai/authplane/subjects"
	"github.com/nats-io/nats.go"
)

// connect opens one of the plane's own connections as a fresh short-lived user of issuer's
// account, renewed by reconnecting at two thirds of its life. Close drains it.
func (p *Plane) connect(role string, iss *mint.Issuer, perms subjects.Permissions) (*nats.Conn, error) {
	ttl := p.cfg.PlaneUserTTL
	auth, err := iss.Connect("plane."+role+"_"+p.identity.InstanceID, perms, ttl)
	if err != nil {
		return nil, err
	}
	log := p.log.With("conn", role)
	nc, err := nats.Connect(p.info.NATSURL, auth,
		nats.Name("authplane "+role+" "+p.identity.InstanceID),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("disconnected from NATS", "err", err)
			}
		}),
		nats.ReconnectHandler(func(*nats.Conn) { log.Debug("reconnected to NATS") }),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subj := ""
			if sub != nil {
				subj = sub.Subject
			}
			log.Warn("NATS async error", "subject", subj, "err", err)
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("connect %s user to %s: %w", role, p.info.NATSURL, err)
	}
	// A drain waits for requests in flight: each may take its whole deadline.
	p.conns = append(p.conns, nc)
	p.onClose("drain the "+role+" connection", func() error { return drain(nc, p.cfg.RequestTimeout+2*time.Second) })
	stop := make(chan struct{})
	p.bg.Go(func() {
		t := time.NewTicker(ttl * 2 / 3)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if err := nc.ForceReconnect(); err != nil && !nc.IsClosed() {
					log.Warn("renewing the plane's user failed", "err", err)
				}
			}
		}
	})
	p.onClose("stop renewing the "+role+" user", func() error { close(stop); return nil })
	return nc, nil
}

// connected reports whether every connection of the plane is up.
func (p *Plane) connected() bool {
	for _, nc := range p.conns {
		if !nc.IsConnected() {
			return false
		}
	}
	return true
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
