package service

import (
	"errors"

	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/handlers"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/subjects"
)

// serveCallout serves the broker's auth callout (docs/PROTOCOL.md, "The HTTP face") as the callout user, whose key the
// callout account lists as the one user it does not call out for. Like the serving side, it is
// renewed at two thirds of its user's life: the next connection subscribes before the previous
// one drains, so no connection attempt meets a moment with no callout.
func (p *Plane) serveCallout(c *handlers.Callout) error {
	iss, err := issue.NewIssuer(p.keys.Callout.Public(), p.keys.Callout.Signer, p.cfg.Now)
	if err != nil {
		return err
	}
	open := func() (*nats.Conn, error) {
		auth, err := iss.ConnectAs(p.keys.CalloutUser, p.userName("callout"), subjects.CalloutPermissions(), p.cfg.PlaneUserTTL)
		if err != nil {
			return nil, err
		}
		nc, err := p.dialWith("callout", auth, nil)
		if err != nil {
			return nil, err
		}
		if _, err = c.Subscribe(nc); err == nil {
			err = nc.FlushTimeout(p.cfg.RequestTimeout)
		}
		if err != nil {
			return nil, errors.Join(err, drain(nc, p.drainTimeout()))
		}
		return nc, nil
	}
	nc, err := open()
	if err != nil {
		return err
	}
	p.callout.Store(nc)
	p.onClose("drain the callout connection", func() error { return drain(p.callout.Load(), p.drainTimeout()) })
	p.renewEvery("callout user", func() error {
		if p.fenced.Load() {
			return nil
		}
		next, err := open()
		if err != nil {
			return p.renewal("callout", err)
		}
		p.renewal("callout", nil)
		old := p.callout.Swap(next)
		p.bg.Go(func() {
			if err := drain(old, p.drainTimeout()); err != nil {
				p.log.Warn("retiring the previous callout connection", "err", err)
			}
		})
		return nil
	})
	return nil
}
