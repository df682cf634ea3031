package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotal-ai/authplane/subjects"
)

// The witness (docs/PROTOCOL.md, "manager-run-admission") is one stream per owner (WitnessSpec): JetStream bounds a stream,
// not one publisher within it, so a shared stream let one owner's flood evict every other
// owner's run-starts. An owner's stream is made before one of its managers is first issued the
// serve credential that receives run-starts (OpenWitness), and after a start for every owner
// with registered instances (OpenEveryWitness): owners are only those an admin granted
// `supervise` (or a platform supervisor acts for), so their number is the space's, not a
// caller's, to choose. A run-start of an owner with no stream is stored nowhere.

// witnesses is what this process knows of the owners' witness streams: which exist, and what
// each held when last sampled.
type witnesses struct {
	mu      sync.Mutex
	open    map[string]bool
	watches map[string]*witnessWatch

	owners  atomic.Int64
	evicted atomic.Uint64
}

func (w *witnesses) isOpen(owner string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.open[owner]
}

func (w *witnesses) setOpen(owner string, open bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.open == nil {
		w.open = map[string]bool{}
	}
	if open {
		w.open[owner] = true
	} else {
		delete(w.open, owner)
	}
}

// witnessOpenTimeout bounds how long a mint waits for its owner's witness stream to be made.
const witnessOpenTimeout = 2 * time.Second

// OpenWitness makes sure owner has a witness stream, creating it on the first call for that
// owner, so the run-starts of its callers are captured from then on. It is called before any
// of owner's managers is issued a serve credential, so before one can receive a run-start. It
// waits at most half of what ctx has left (and at most 2 s); a failure is logged and tried
// again at the next call, and until then owner's run-starts are not witnessed: an admission of
// one is refused, never granted.
func (s *Stores) OpenWitness(ctx context.Context, owner string) { s.openWitness(ctx, owner) }

// openWitness is OpenWitness, reporting whether owner's witness stream is open.
func (s *Stores) openWitness(ctx context.Context, owner string) bool {
	if s.witness.isOpen(owner) {
		return true
	}
	wait := witnessOpenTimeout
	if deadline, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(deadline)/2)
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	spec := WitnessSpec(s.Space, owner, s.opts)
	if err := retry(ctx, s.log, func(ctx context.Context) error { return ensureOne(ctx, s.js, spec, s.log) }); err != nil {
		s.log.Warn("the owner's witness stream is not there yet; its run-starts are not witnessed until it is", "owner", owner, "stream", spec.Config.Name, "err", err)
		return false
	}
	s.witness.setOpen(owner, true)
	return true
}

// Witnessed reports whether the witness holds a run-start published on subject (a leader
// read): one its owner's caller published within the last five minutes and that its owner's
// own newer run-starts have not pushed out. It never creates a stream: a subject may name any
// owner.
func (s *Stores) Witnessed(ctx context.Context, subject string) (bool, error) {
	start, ok := subjects.ParseRunStart(s.Space, subject)
	if !ok {
		return false, nil
	}
	st, err := s.js.Stream(ctx, subjects.WitnessStream(s.Space, start.Owner))
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		s.witness.setOpen(start.Owner, false) // made again at its managers' next credential
		return false, nil
	}
	if err != nil {
		return false, Classify(err)
	}
	_, err = st.GetLastMsgForSubject(ctx, subject)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return false, nil
	case err != nil:
		return false, Classify(err)
	}
	return true, nil
}

// OpenEveryWitness makes a witness stream for every owner with registered manager instances
// (an `instances.<owner>` row in the fence bucket) that has none: after an upgrade from the
// shared witness, or a stream removed by hand, the owner's run-starts are captured again
// without waiting for its managers' next serve credential. It returns how many it made.
func (s *Stores) OpenEveryWitness(ctx context.Context) (int, error) {
	prefix := "$KV." + s.Auth.bucket + "."
	info, err := s.Auth.stream.Info(ctx, jetstream.WithSubjectFilter(prefix+subjects.InstancesKey("*")))
	if err != nil {
		return 0, fmt.Errorf("owners with instances: %w", Classify(err))
	}
	made := 0
	for subject := range info.State.Subjects {
		owner, ok := strings.CutPrefix(subject, prefix+subjects.InstancesKey(""))
		if !ok || !subjects.ValidOwner(owner) || s.witness.isOpen(owner) {
			continue
		}
		if s.openWitness(ctx, owner) {
			made++
		}
	}
	return made, nil
}

// openWitnesses removes the shared witness stream of earlier releases (its subjects overlap
// every owner's), then checks every owner's witness stream as Ensure checks a stream: one
// whose configuration breaks its rule refuses the start, and each takes this start's limits.
func (s *Stores) openWitnesses(ctx context.Context) error {
	shared := subjects.SharedWitnessStream(s.Space)
	err := retry(ctx, s.log, func(ctx context.Context) error {
		err := s.js.DeleteStream(ctx, shared)
		if err == nil {
			s.log.Warn("removed the shared witness stream: each owner has a witness stream of its own now; a run-start published before this start must be published again", "stream", shared)
		}
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("remove the shared witness stream %s: %w", shared, err)
	}
	var streams []witnessStream
	if err := retry(ctx, s.log, func(ctx context.Context) error {
		var err error
		streams, err = s.listWitnesses(ctx)
		return err
	}); err != nil {
		return fmt.Errorf("list the witness streams: %w", err)
	}
	var problems []error
	for _, w := range streams {
		spec := WitnessSpec(s.Space, w.owner, s.opts)
		if err := retry(ctx, s.log, func(ctx context.Context) error { return check(ctx, s.js, spec, w.info.Config, s.log) }); err != nil {
			problems = append(problems, err)
			continue
		}
		s.witness.setOpen(w.owner, true)
	}
	return errors.Join(problems...)
}

// witnessStream is one owner's witness stream as listed: whose it is, its configuration and
// state.
type witnessStream struct {
	owner string
	info  *jetstream.StreamInfo
}

// listWitnesses reads every owner's witness stream of the space.
func (s *Stores) listWitnesses(ctx context.Context) ([]witnessStream, error) {
	prefix := subjects.WitnessStreamPrefix(s.Space)
	l := s.js.ListStreams(ctx, jetstream.WithStreamListSubject("cotal."+s.Space+".ep.v1.>"))
	var out []witnessStream
	for info := range l.Info() {
		owner, ok := strings.CutPrefix(info.Config.Name, prefix)
		if ok && subjects.ValidOwner(owner) {
			out = append(out, witnessStream{owner, info})
		}
	}
	if err := l.Err(); err != nil {
		return nil, Classify(err)
	}
	return out, nil
}

// SampleWitnesses reads every owner's witness stream once, at now, and counts the run-starts
// that left one before their five minutes were up: pushed out by the same owner's newer
// run-starts past its budget (WitnessRuns, WitnessBytes). Nothing else removes one (no
// deletes, no purges, no consumers), and both limits remove the oldest, so a run-start gone
// while younger than the stream's age was pushed out. What WitnessEvicted counts is a lower
// bound, exact to within the run-starts of one sampling interval; sample well within the age.
// Each owner whose run-starts were pushed out since the last sample is named in one log line.
func (s *Stores) SampleWitnesses(ctx context.Context, now time.Time) error {
	streams, err := s.listWitnesses(ctx)
	if err != nil {
		return fmt.Errorf("sample the witness streams: %w", err)
	}
	pushed := map[string]uint64{}
	w := &s.witness
	w.mu.Lock()
	if w.watches == nil {
		w.watches = map[string]*witnessWatch{}
	}
	for _, ws := range streams {
		info := ws.info
		watch := w.watches[info.Config.Name]
		if watch == nil {
			watch = &witnessWatch{}
			w.watches[info.Config.Name] = watch
		}
		if n := watch.observe(now, info.State.FirstSeq, info.State.LastSeq, info.Config.MaxAge); n > 0 {
			pushed[ws.owner] = n
			w.evicted.Add(n)
		}
	}
	w.owners.Store(int64(len(streams)))
	w.mu.Unlock()
	for owner, n := range pushed {
		s.log.Warn("run-starts pushed out of their owner's witness by its own newer ones: past --witness-runs or --witness-bytes", "owner", owner, "run_starts", n)
	}
	return nil
}

// WitnessOwners is how many owners had a witness stream at the last sample.
func (s *Stores) WitnessOwners() int64 { return s.witness.owners.Load() }

// WitnessEvicted is how many run-starts, since this process began sampling, left their
// owner's witness stream pushed out by that owner's newer ones (SampleWitnesses).
func (s *Stores) WitnessEvicted() uint64 { return s.witness.evicted.Load() }

// witnessWatch is one witness stream's recent samples: at when, its last sequence.
type witnessWatch struct {
	samples []seqAt
	// counted is how many of its run-starts were counted as pushed out so far.
	counted uint64
}

type seqAt struct {
	at   time.Time
	last uint64
}

// observe takes one sample of the stream (its first and last sequence at now; it keeps
// maxAge) and returns how many more of its run-starts it now knows were pushed out. Every
// run-start up to first-1 is gone; those published before now-maxAge may have aged out, and
// they are all at or below the last sequence of the oldest sample taken since then. The rest
// were pushed out.
func (w *witnessWatch) observe(now time.Time, first, last uint64, maxAge time.Duration) uint64 {
	if n := len(w.samples); n > 0 && last < w.samples[n-1].last {
		*w = witnessWatch{} // the stream was made again: start over
	}
	w.samples = append(w.samples, seqAt{now, last})
	keep := 0
	for keep < len(w.samples)-1 && w.samples[keep].at.Before(now.Add(-maxAge)) {
		keep++
	}
	w.samples = w.samples[keep:]
	var removed uint64
	if first > 0 {
		removed = first - 1
	}
	mayHaveAged := w.samples[0].last
	if removed <= mayHaveAged || removed-mayHaveAged <= w.counted {
		return 0
	}
	added := removed - mayHaveAged - w.counted
	w.counted = removed - mayHaveAged
	return added
}
