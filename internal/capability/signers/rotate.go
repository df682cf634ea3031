package signers

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/nats-io/jwt/v2"

	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/internal/core/store"
)

// Report is what a rotation came to, as far as it went.
type Report struct {
	OpID, Kind string
	From, To   uint64
	// Step is the last step made; Done says the rotation is over (StepDone).
	Step string
	Done bool
	// RemoveAfter is when a scheduled rotation's old generation may leave: the longest life
	// of a credential it signed after the switch, or a later `authplane creds` expiry.
	RemoveAfter time.Time
	// Bearer is the kid of the bearer key an emergency rotation made the one that signs.
	Bearer string
	// Confirmed names the servers whose data account JWT shows the step last made to the
	// broker; Unconfirmed those that did not by the deadline.
	Confirmed, Unconfirmed []string
	// Left counts the connections still listed whose credential a key the JWT no longer lists
	// signed (the eviction step waits for none).
	Left int
}

// Resume takes the rotation under way as far as it goes now: to done, or, for a scheduled one,
// to the switch until its old generation may leave (Report.RemoveAfter). With none under way it
// reports done. An error leaves the rotation where its last stored step put it.
func (r *Rotation) Resume(ctx context.Context) (*Report, error) {
	rep := &Report{Step: StepDone, Done: true}
	for {
		o, err := r.observe(ctx)
		if err != nil {
			return rep, fault.Store(err, "reading the rotation")
		}
		op := o.Row.Op
		if op == nil {
			rep.Step, rep.Done = StepDone, true
			return rep, nil
		}
		rep = r.report(op, rep)
		next, err := r.step(ctx, o, rep)
		if err != nil {
			return rep, err
		}
		if next == "" {
			return rep, nil // waiting: a scheduled rotation's old keys may not leave yet
		}
		if r.stop(next) {
			return rep, ErrStopped
		}
	}
}

// Status reports the rotation under way, as Resume would, without making a step (Done: none
// is under way).
func (r *Rotation) Status(ctx context.Context) (*Report, error) {
	o, err := r.observe(ctx)
	if err != nil {
		return nil, fault.Store(err, "reading the rotation")
	}
	if o.Row.Op == nil {
		return &Report{Step: StepDone, Done: true}, nil
	}
	return r.report(o.Row.Op, &Report{}), nil
}

// report describes op as stored, with what the broker showed last (from last).
func (r *Rotation) report(op *rotOp, last *Report) *Report {
	rep := &Report{OpID: op.ID, Kind: op.Kind, From: op.From, To: op.To, Step: op.Step, Bearer: op.Bearer,
		Confirmed: last.Confirmed, Unconfirmed: last.Unconfirmed, Left: last.Left}
	if op.Kind == Scheduled && op.Switched != 0 {
		rep.RemoveAfter = r.removeAfter(op)
	}
	return rep
}

// step makes the step after o's, and returns the step made ("" when it must wait).
func (r *Rotation) step(ctx context.Context, o *fence.Observed[rotRow], rep *Report) (string, error) {
	op := o.Row.Op
	order := steps[op.Kind]
	i := slices.Index(order, op.Step)
	if i == len(order)-1 {
		return StepDone, r.finish(ctx, op.ID)
	}
	next := order[i+1]
	switch next {
	case StepListed:
		if err := r.Set.Keys.Generate(ctx, op.To); err != nil {
			return "", fault.Store(err, "storing the new signing key generation")
		}
		if r.stop(StepGenerated) {
			return "", ErrStopped
		}
		if err := r.list(ctx, o.Row, rep); err != nil {
			return "", err
		}
	case StepBearers:
		if r.Bearers == nil {
			return "", fault.New(fault.FailedPrecondition, "an emergency rotation replaces the bearer issuer key, and this rotation cannot reach the key set")
		}
		kid, err := r.Bearers.Replace(ctx, time.Unix(op.Begun, 0))
		if err != nil {
			return "", fault.Store(err, "replacing the bearer issuer key")
		}
		return next, r.advance(ctx, op, next, func(row *rotRow) { row.Op.Bearer = kid })
	case StepSwitched:
		now := r.Now().Unix()
		return next, r.advance(ctx, op, next, func(row *rotRow) {
			row.Op.Switched, row.Op.OldCredsUntil = now, row.CredsUntil
			row.Current, row.Since, row.CredsUntil = op.To, now, 0
			if op.Kind == Emergency {
				row.Trust = op.To
			}
		})
	case StepRemoved:
		if op.Kind == Scheduled && r.Now().Before(r.removeAfter(op)) {
			return "", nil
		}
		if err := r.confirm(ctx, []uint64{op.To}, false, rep); err != nil {
			return "", err
		}
	case StepEvicted:
		if err := r.evict(ctx, rep); err != nil {
			return "", err
		}
	}
	return next, r.advance(ctx, op, next, nil)
}

// list lists the new generation beside the one that signs, and lets the others go. A
// scheduled rotation needs both to fit (or it ends, refused, before anything signs with the
// new generation); an emergency one lists the new generation alone when they would not.
func (r *Rotation) list(ctx context.Context, row rotRow, rep *Report) error {
	op := row.Op
	gens := []uint64{row.Current, op.To}
	err := r.confirm(ctx, gens, true, rep)
	var f *fault.Error
	if !errors.As(err, &f) || f.Code != fault.ResourceExhausted {
		return err
	}
	if op.Kind == Emergency {
		return r.confirm(ctx, []uint64{op.To}, false, rep)
	}
	// The overlap does not fit: the rotation ends here, the new generation never listed.
	if _, cerr := r.fence().Update(ctx, func(cur *fence.Observed[rotRow]) (rotRow, error) {
		next := cur.Row
		if next.Op == nil || next.Op.ID != op.ID {
			return rotRow{}, fence.ErrKeep
		}
		next.Op = nil
		return next, nil
	}); cerr != nil {
		return errors.Join(err, fault.Store(cerr, "ending the rotation that did not fit"))
	}
	return err
}

// confirm lists exactly gens and reports which servers show it.
func (r *Rotation) confirm(ctx context.Context, gens []uint64, fit bool, rep *Report) error {
	gens = slices.Compact(slices.Sorted(slices.Values(gens)))
	err := r.Set.List(ctx, gens, fit)
	var f *fault.Error
	if errors.As(err, &f) && f.Code == fault.ResourceExhausted {
		return err
	}
	rep.Confirmed, rep.Unconfirmed = r.servers(gens)
	if err != nil {
		return fault.Wrap(fault.Unavailable, err, "the broker did not confirm the data account's signing keys before the deadline (servers not confirmed: %v); resume the rotation to complete it", rep.Unconfirmed)
	}
	return nil
}

// servers names the servers whose data account JWT lists exactly the own keys of gens, and
// those that do not (or did not answer).
func (r *Rotation) servers(gens []uint64) (confirmed, not []string) {
	if r.Servers == nil {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	reach := &reach{Broker: r.Set.Broker}
	if reach.count(ctx) != nil {
		return nil, []string{"(the servers could not be counted)"}
	}
	held, err := r.Servers.Held(ctx, reach.servers())
	if err != nil && len(held) == 0 {
		return nil, []string{"(no server answered)"}
	}
	for _, name := range slices.Sorted(maps.Keys(held)) {
		if r.shows(held[name], gens) {
			confirmed = append(confirmed, name)
		} else {
			not = append(not, name)
		}
	}
	if missing := reach.servers() - len(held); missing > 0 {
		not = append(not, fmt.Sprintf("(%d servers did not answer)", missing))
	}
	return confirmed, not
}

// shows reports whether token lists the own key of every generation of gens and of no other
// generation known.
func (r *Rotation) shows(token string, gens []uint64) bool {
	claims, err := jwt.DecodeAccountClaims(token)
	if err != nil {
		return false
	}
	for _, g := range r.Set.Keys.Gens() {
		main, err := r.Set.Keys.Main(g)
		if err != nil {
			return false
		}
		if _, listed := claims.SigningKeys[main.Signer()]; listed != slices.Contains(gens, g) {
			return false
		}
	}
	return true
}

// evict waits until the broker lists no connection of the data account whose credential a
// key the JWT no longer lists signed (the servers close them as they apply the JWT), or ctx
// ends. The keys listed are read again at every poll: a key added meanwhile is listed.
func (r *Rotation) evict(ctx context.Context, rep *Report) error {
	if r.Servers == nil {
		return nil
	}
	reach := &reach{Broker: r.Set.Broker}
	for attempt := 0; ; attempt++ {
		left, err := r.unlisted(ctx, reach)
		if err == nil {
			rep.Left = left
			if left == 0 {
				return nil
			}
		}
		if perr := store.Pause(ctx, attempt); perr != nil {
			if err == nil {
				err = fmt.Errorf("%d connections of keys no longer listed are still open", left)
			}
			return fault.Wrap(fault.Unavailable, err, "the broker did not close every connection of the old signing keys before the deadline; resume the rotation to see them closed")
		}
	}
}

// unlisted counts the connections, on every server, whose credential a key the data account's
// row no longer lists signed.
func (r *Rotation) unlisted(ctx context.Context, reach *reach) (int, error) {
	if err := reach.count(ctx); err != nil {
		return 0, err
	}
	cur, err := r.Set.fence().Observe(ctx)
	if err != nil {
		return 0, err
	}
	pubs, err := r.Set.pubs(ctx, cur.Row)
	if err != nil {
		return 0, err
	}
	conns, answered, err := r.Servers.ListConnections(ctx, reach.servers())
	if err != nil {
		return 0, err
	}
	if len(answered) < reach.servers() {
		reach.forget()
		return 0, fmt.Errorf("%d of %d servers answered the connection listing", len(answered), reach.servers())
	}
	left := 0
	for _, c := range conns {
		if c.Issuer != "" && !slices.Contains(pubs, c.Issuer) && c.Issuer != r.Set.Account {
			left++
		}
	}
	return left, nil
}

// advance stores step next of op, made; a row that moved on already (a resume elsewhere) is
// kept as it is.
func (r *Rotation) advance(ctx context.Context, op *rotOp, next string, change func(*rotRow)) error {
	order := steps[op.Kind]
	_, err := r.fence().Update(ctx, func(cur *fence.Observed[rotRow]) (rotRow, error) {
		row := cur.Row
		if row.Op == nil || row.Op.ID != op.ID || slices.Index(order, row.Op.Step) >= slices.Index(order, next) {
			return rotRow{}, fence.ErrKeep
		}
		moved := *row.Op
		moved.Step = next
		row.Op = &moved
		if change != nil {
			change(&row)
		}
		return row, nil
	})
	if err != nil {
		return fault.Store(err, "storing the rotation's step %s", next)
	}
	return nil
}

// finish ends rotation id: the row holds none.
func (r *Rotation) finish(ctx context.Context, id string) error {
	_, err := r.fence().Update(ctx, func(cur *fence.Observed[rotRow]) (rotRow, error) {
		row := cur.Row
		if row.Op == nil || row.Op.ID != id {
			return rotRow{}, fence.ErrKeep
		}
		row.Op = nil
		return row, nil
	})
	if err != nil {
		return fault.Store(err, "ending the rotation")
	}
	return nil
}

// removeAfter is when a scheduled rotation's old generation may leave the JWT: a mint that
// read the row before the switch signs within its deadline, with at most the longest life,
// and `authplane creds` recorded the latest expiry it signed with it.
func (r *Rotation) removeAfter(op *rotOp) time.Time {
	longest := max(time.Duration(op.Longest)*time.Second, r.Longest)
	return time.Unix(max(op.Switched+int64((longest+r.Slack).Seconds()), op.OldCredsUntil+int64(r.Slack.Seconds())), 0)
}
