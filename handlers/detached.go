package handlers

import (
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

// detached is the bound of one Register's detached answers (see Detached), shared by its
// instances.
type detached struct {
	nc    *nats.Conn
	slots chan struct{}
	// stopped closes when the services stop: requests delivered after it are answered inline.
	stopped chan struct{}
	// drained closes once the stop holds every slot: no detached answer is under way.
	drained chan struct{}
	stop    sync.Once
}

// answers counts one instance's detached answers of one endpoint.
type answers struct {
	mu       sync.Mutex
	answered uint64
	errors   uint64
	last     string
	took     time.Duration
	inFlight int
}

func newDetached(nc *nats.Conn, inFlight int) *detached {
	return &detached{nc: nc, slots: make(chan struct{}, inFlight), stopped: make(chan struct{}), drained: make(chan struct{})}
}

// wait reports whether every detached answer under way is sent by by (or already was):
// from the first wait on, requests are answered inline, and the slots are taken as the answers
// under way finish. A wait repeated, or one whose by has passed, reports the same.
func (d *detached) wait(by time.Time) bool {
	d.stop.Do(func() {
		close(d.stopped)
		held := 0
		for held < cap(d.slots) && d.tryTake() {
			held++
		}
		if held == cap(d.slots) {
			close(d.drained)
			return
		}
		go func() {
			for ; held < cap(d.slots); held++ {
				d.slots <- struct{}{}
			}
			close(d.drained)
		}()
	})
	select {
	case <-d.drained:
		return true
	default:
	}
	t := time.NewTimer(time.Until(by))
	defer t.Stop()
	select {
	case <-d.drained:
		return true
	case <-t.C:
		return false
	}
}

func (c *answers) counters() *DetachedCounters {
	c.mu.Lock()
	defer c.mu.Unlock()
	return &DetachedCounters{Answered: c.answered, Errors: c.errors, LastError: c.last, ProcessingTime: c.took, InFlight: c.inFlight}
}

// answerTo is req answered off micro's handler, counted in c: its reads are req's (a
// request's message does not change once delivered), its answers are published on the
// connection and counted in c, for micro counts them only on the handler's own goroutine.
func (d *detached) answerTo(req micro.Request, c *answers) *answer {
	c.mu.Lock()
	c.inFlight++
	c.mu.Unlock()
	return &answer{Request: req, nc: d.nc, c: c, at: time.Now()}
}

// answer is a detached request.
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
func (d *detached) tryTake() bool {
	select {
	case d.slots <- struct{}{}:
		return true
	default:
		return false
	}
}

// isStopped reports whether the services stopped.
func (d *detached) isStopped() bool {
	select {
	case <-d.stopped:
		return true
	default:
		return false
	}
}
