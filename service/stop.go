package service

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cotal-ai/authplane/internal/capability/instance"
)

// closer is one step of the teardown.
type closer struct {
	what string
	fn   func() error
}

// onClose pushes a teardown step; Close runs them last pushed, first run.
func (p *Plane) onClose(what string, fn func() error) {
	p.closers = append(p.closers, closer{what, fn})
}

// untilClose runs fn on a goroutine of the plane's with a context that Close's step what
// cancels, and that step waits for fn to return.
func (p *Plane) untilClose(what string, fn func(ctx context.Context)) {
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	p.bg.Go(func() {
		defer close(done)
		fn(ctx)
	})
	p.onClose(what, func() error { stop(); <-done; return nil })
}

// onEveryTick runs fn every `every` until ctx ends, and once at the start too when atOnce.
func onEveryTick(ctx context.Context, every time.Duration, atOnce bool, fn func()) {
	t := time.NewTicker(every)
	defer t.Stop()
	for run := atOnce; ; run = true {
		if run {
			fn()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// fence stops serving at once: a newer registration of this instance owns it now.
func (p *Plane) fence(cause error) {
	if !errors.Is(cause, instance.ErrFenced) {
		p.log.Error("instance watch failed; stopping", "err", cause)
	} else {
		p.log.Error("fenced: another process registered this instance at a newer epoch; stopping", "err", cause)
	}
	p.fenced.Store(true)
	// No new request reaches this instance, and Done says so, before the answers under way
	// finish: each of them is refused `unavailable` at its commit, which may be a while.
	if s := p.serving.Load(); s != nil && s.served.Service != nil {
		if err := s.served.Service.Stop(); err != nil {
			p.log.Warn("stopping the micro services", "err", err)
		}
	}
	p.finish(cause)
	if err := p.stopServices(); err != nil {
		p.log.Warn("stopping the micro services", "err", err)
	}
}

func (p *Plane) finish(err error) {
	p.doneOnce.Do(func() {
		p.err = err
		close(p.done)
	})
}

// Done is closed when the plane stops on its own (fenced, or a fatal error); Err says why.
func (p *Plane) Done() <-chan struct{} { return p.done }

// Err is why the plane stopped on its own, or nil.
func (p *Plane) Err() error {
	select {
	case <-p.done:
		return p.err
	default:
		return nil
	}
}

// Close stops the plane in the reverse order Start built it. From its first moment a new
// request is answered `unavailable`; then auth-service.json goes, the fence watch, the micro
// services (no new requests reach them), the serving connection's drain (requests in flight
// finish; they still need the stores), the audit summaries, the HTTP face, the store
// connection, the embedded broker, and last the state directory's lock. Every drain shares one
// deadline, --drain-timeout from the start of Close. It returns why the plane had stopped on
// its own, if it had.
func (p *Plane) Close() error {
	err := p.teardown()
	return errors.Join(p.Err(), err)
}

func (p *Plane) teardown() error {
	p.closing.Do(func() {
		by := time.Now().Add(p.cfg.DrainTimeout)
		p.drainBy.Store(&by)
		p.draining.Store(true)
		p.finish(nil)
		var errs []error
		for i := len(p.closers) - 1; i >= 0; i-- {
			if err := p.closers[i].fn(); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", p.closers[i].what, err))
			}
		}
		p.closeErr = errors.Join(errs...)
	})
	return p.closeErr
}
