package handlers

import (
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

// pool bounds one endpoint's answers under way (Register).
type pool struct {
	nc    *nats.Conn
	slots chan struct{}
	// stopped closes when the service stops: requests delivered after it are answered on
	// micro's handler.
	stopped chan struct{}
	// drained closes once the stop holds every slot: no answer of the pool is under way.
	drained chan struct{}
	stop    sync.Once
}

// answers counts one endpoint's answers.
type answers struct {
	mu       sync.Mutex
	answered uint64
	errors   uint64
	last     string
	took     time.Duration
	inFlight int
}

func newPool(nc *nats.Conn, inFlight int) *pool {
	return &pool{nc: nc, slots: make(chan struct{}, inFlight), stopped: make(chan struct{}), drained: make(chan struct{})}
}

// take takes a slot, waiting for one; it reports false, taking none, once the service stopped.
func (p *pool) take() bool {
	if p.isStopped() {
		return false
	}
	select {
	case p.slots <- struct{}{}:
		return true
	case <-p.stopped:
		return false
	}
}

// give gives a slot back.
func (p *pool) give() { <-p.slots }

// wait reports whether every answer under way is sent by by (or already was): from the first
// wait on, requests are answered on micro's handler, and the slots are taken as the answers
// under way finish. A wait repeated, or one whose by has passed, reports the same.
func (p *pool) wait(by time.Time) bool {
	p.stop.Do(func() {
		close(p.stopped)
		held := 0
		for held < cap(p.slots) && p.tryTake() {
			held++
		}
		if held == cap(p.slots) {
			close(p.drained)
			return
		}
		go func() {
			for ; held < cap(p.slots); held++ {
				p.slots <- struct{}{}
			}
			close(p.drained)
		}()
	})
	select {
	case <-p.drained:
		return true
	default:
	}
	t := time.NewTimer(time.Until(by))
	defer t.Stop()
	select {
	case <-p.drained:
		return true
	case <-t.C:
		return false
	}
}

func (c *answers) counters() Counters {
	c.mu.Lock()
	defer c.mu.Unlock()
	return Counters{Answered: c.answered, Errors: c.errors, LastError: c.last, ProcessingTime: c.took, InFlight: c.inFlight}
}

// answerTo is req answered by the pool, counted in c: its reads are req's (a request's
// message does not change once delivered), its answers are published on the connection and
// counted in c, for micro counts them only on the handler's own goroutine.
func (p *pool) answerTo(req micro.Request, c *answers) *answer {
	c.mu.Lock()
	c.inFlight++
	c.mu.Unlock()
	return &answer{Request: req, nc: p.nc, c: c, at: time.Now()}
}

// answer is a request the pool answers.
type answer struct {
	micro.Request
	nc *nats.Conn
	c  *answers
	at time.Time
}

// done is the end of the answer's handling, sent or not.
func (a *answer) done() {
	a.c.mu.Lock()
	a.c.inFlight--
	a.c.mu.Unlock()
}

func (a *answer) Respond(data []byte, opts ...micro.RespondOpt) error {
	return a.send(&nats.Msg{Data: data}, "", opts)
}

func (a *answer) RespondJSON(v any, opts ...micro.RespondOpt) error {
	data, err := json.Marshal(v)
	if err != nil {
		return micro.ErrMarshalResponse
	}
	return a.Respond(data, opts...)
}

// Error answers as micro's Request.Error does: the code and description in micro's headers
// (opts may set them again), data as the body.
func (a *answer) Error(code, description string, data []byte, opts ...micro.RespondOpt) error {
	if code == "" || description == "" {
		return fmt.Errorf("%w: error code and description", micro.ErrArgRequired)
	}
	m := &nats.Msg{Data: data, Header: nats.Header{micro.ErrorHeader: {description}, micro.ErrorCodeHeader: {code}}}
	return a.send(m, code+":"+description, opts)
}

// send publishes m to the request's reply subject and counts it: failed, when failed is not "".
func (a *answer) send(m *nats.Msg, failed string, opts []micro.RespondOpt) error {
	for _, opt := range opts {
		opt(m)
	}
	m.Subject = a.Reply()
	err := a.nc.PublishMsg(m)
	c := a.c
	c.mu.Lock()
	defer c.mu.Unlock()
	c.took += time.Since(a.at)
	switch {
	case err != nil:
		c.errors++
		c.last = err.Error()
	case failed != "":
		c.answered++
		c.errors++
		c.last = failed
	default:
		c.answered++
	}
	if err != nil {
		return fmt.Errorf("%w: %s", micro.ErrRespond, err)
	}
	return nil
}

// tryTake takes a slot if one is free.
func (p *pool) tryTake() bool {
	select {
	case p.slots <- struct{}{}:
		return true
	default:
		return false
	}
}

// isStopped reports whether the service stopped.
func (p *pool) isStopped() bool {
	select {
	case <-p.stopped:
		return true
	default:
		return false
	}
}
