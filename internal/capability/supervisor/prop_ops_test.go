package supervisor_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nkeys"
	"pgregory.net/rapid"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/internal/capability/manager"
	"github.com/cotal-ai/authplane/internal/capability/supervisor"
	"github.com/cotal-ai/authplane/internal/core/audit"
	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/internal/core/store"
	"github.com/cotal-ai/authplane/subjects"
)

// op is one operation drawn for a schedule: every choice is drawn first, on the schedule's
// goroutine, so that several ops can run at once.
type op struct {
	name string
	run  func()
}

// answered counts an operation's outcome, for the coverage the test reports.
// It also traces it: a failing schedule prints what each of its requests was answered.
func (w *world) answered(what, iid string, err error, detail string) {
	kind, _, _ := strings.Cut(what, " (")
	outcome := "answered " + detail
	if err == nil {
		count(kind + ": answered")
	} else {
		count(kind + ": " + string(fault.CodeOf(err)))
		outcome = err.Error()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.trace = append(w.trace, fmt.Sprintf("%s %s: %s", what, iid, outcome))
}

func detailOf(m *client.Material) string {
	if m == nil {
		return ""
	}
	return fmt.Sprintf("(epoch %d, gate revision %d, %d credentials)", m.ProcessEpoch, m.GateRevision, len(m.Credentials))
}

// snapshot is a slot as a request reads it.
func (w *world) snapshot(si int) (s *slot, m client.Manager, proof string, r *client.Renewal) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s = w.slots[si]
	if s.renewal != nil {
		c := *s.renewal
		r = &c
	}
	return s, s.m, s.prepProof, r
}

// assignmentOf is owner's assignment as its last assign answer said, if it covers m.
func (w *world) assignmentOf(owner string, m client.Manager) *lifecycle {
	w.mu.Lock()
	defer w.mu.Unlock()
	lc := w.assigned[owner]
	if lc == nil || lc.iid != m.InstanceID {
		return nil
	}
	return lc
}

// adopt sets slot s to m with what its prepare was answered, unless a request of the same
// slot adopted a newer registration of the same instance meanwhile.
func (w *world) adopt(s *slot, m client.Manager, mat *client.Material) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if s.m.InstanceID != m.InstanceID {
		s.runs, s.runKeys = nil, nil
	}
	s.m, s.prepProof, s.renewal = m, mat.RegistrationProof, nil
}

// victimKey is a key of another slot than si: one of its identities, or one of its run keys.
func (w *world) victimKey(si, victim, pick int) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if victim%len(w.slots) == si {
		victim++
	}
	v := w.slots[victim%len(w.slots)]
	if pick >= len(subjects.StandingDuties) && len(v.runKeys) > 0 {
		return v.runKeys[pick%len(v.runKeys)]
	}
	return v.m.Identities.Of(subjects.StandingDuties[pick%len(subjects.StandingDuties)])
}

func setIdentity(identities *client.Identities, d subjects.Duty, key string) {
	switch d {
	case subjects.DutySupervisor:
		identities.Supervisor.ID = key
	case subjects.DutyExecutor:
		identities.Executor.ID = key
	case subjects.DutyServe:
		identities.Serve.ID = key
	case subjects.DutyGoalWriter:
		identities.GoalWriter.ID = key
	case subjects.DutySessionLedger:
		identities.SessionLedger.ID = key
	}
}

func freshKey() string {
	kp, err := nkeys.CreateUser()
	if err != nil {
		panic(err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		panic(err)
	}
	return pub
}

func freshManager() client.Manager {
	m, _, err := client.NewManager()
	if err != nil {
		panic(err)
	}
	return m
}

// The draws every request makes: which slot and replica, and how it misbehaves.

func (w *world) drawSlot(t *rapid.T) int  { return rapid.IntRange(0, len(w.slots)-1).Draw(t, "slot") }
func (w *world) drawPlane(t *rapid.T) int { return rapid.IntRange(0, 1).Draw(t, "replica") }
func drawHostile(t *rapid.T) bool         { return rapid.IntRange(0, 3).Draw(t, "hostile") == 0 }
func drawSupervised(t *rapid.T) bool      { return rapid.Bool().Draw(t, "supervised") }

// drawVictim draws another slot and which of its keys (an identity, or a run key) to name.
func drawVictim(t *rapid.T) (int, int) {
	return rapid.IntRange(0, 5).Draw(t, "victim"), rapid.IntRange(0, 6).Draw(t, "victimKey")
}

// drawCrash draws the end step to crash after (0: none).
func drawCrash(t *rapid.T) int {
	return rapid.IntRange(0, supervisor.EndSteps).Draw(t, "crashAfterStep")
}

func drawDuty(t *rapid.T) subjects.Duty {
	return rapid.SampledFrom(subjects.StandingDuties).Draw(t, "duty")
}

func drawTTL(t *rapid.T) time.Duration {
	return rapid.SampledFrom([]time.Duration{10 * time.Minute, 2 * time.Hour, 20 * time.Hour}).Draw(t, "assignmentTTL")
}

// pickSlot draws one of the slots ok accepts (it runs under w.mu), or returns -1 when none does.
func (w *world) pickSlot(t *rapid.T, ok func(*slot) bool) int {
	w.mu.Lock()
	var idx []int
	for i, s := range w.slots {
		if ok(s) {
			idx = append(idx, i)
		}
	}
	w.mu.Unlock()
	if len(idx) == 0 {
		return -1
	}
	return rapid.SampledFrom(idx).Draw(t, "slot")
}

// supervisedSlot says whether s's instance is under its owner's assignment (w.mu held).
func (w *world) supervisedSlot(s *slot) bool {
	lc := w.assigned[s.owner]
	return lc != nil && lc.iid == s.m.InstanceID
}

// pickFor draws a slot for a request, under the platform supervisor or not: a supervised one
// among the slots an assignment covers (any slot when none is), the others among those ok
// accepts.
func (w *world) pickFor(t *rapid.T, sup bool, ok func(*slot) bool) int {
	if sup {
		if si := w.pickSlot(t, func(s *slot) bool { return ok(s) && w.supervisedSlot(s) }); si >= 0 {
			return si
		}
	}
	return w.pickSlot(t, ok)
}

// drawPrepare draws a prepare: of a slot's registration again, a new lifecycle, new keys, or
// a new instance; by the owner's CLI or the platform supervisor; now and then naming another
// instance's key among its identities.
func (w *world) drawPrepare(t *rapid.T) *op {
	sup, pl := drawSupervised(t), w.drawPlane(t)
	si := w.pickFor(t, sup, func(*slot) bool { return true })
	change := rapid.IntRange(0, 3).Draw(t, "change")
	hostile := drawHostile(t)
	duty := drawDuty(t)
	victim, pick := drawVictim(t)
	return &op{name: "prepare", run: func() { w.prepare(pl, si, sup, change, hostile, duty, victim, pick) }}
}

func (w *world) prepare(pl, si int, sup bool, change int, hostile bool, duty subjects.Duty, victim, pick int) {
	s, m, _, _ := w.snapshot(si)
	var lc *lifecycle
	if sup {
		lc = w.assignmentOf(s.owner, m)
		if lc != nil {
			m.LifecycleUID = lc.uid
		}
	}
	switch change {
	case 1:
		if lc == nil {
			m.LifecycleUID = subjects.NewUID()
		}
	case 2:
		fresh := freshManager()
		m.Identities = fresh.Identities
		if lc == nil {
			m.LifecycleUID = fresh.LifecycleUID
		}
	case 3:
		m = freshManager()
		w.mu.Lock()
		w.instances[m.InstanceID] = s.owner
		w.mu.Unlock()
	}
	var f *foreign
	if hostile {
		key := w.victimKey(si, victim, pick)
		setIdentity(&m.Identities, duty, key)
		f = w.expectForeign(m.InstanceID, key, "identities."+string(duty))
	}
	body := client.ServiceAuthority{Envelope: envelope(client.KindServiceAuthority, cliActor, m, nil), Operation: client.OpPrepare}
	what := "prepare"
	if lc != nil {
		what = "supervised prepare"
	}
	mat, err := w.authority(w.plane(pl), manager.Caller{Owner: s.owner, Actor: cliActor}, body, lc)
	w.answered(what, m.InstanceID, err, detailOf(mat))
	w.checkForeign(what, m.InstanceID, f, err)
	if err != nil {
		w.mu.Lock()
		if w.faulted == "instances." || errors.Is(err, store.ErrUnknownOutcome) || errors.Is(err, fence.ErrUnknownOutcome) {
			w.excused[m.InstanceID] = true
		}
		w.mu.Unlock()
		return
	}
	var until int64
	if lc != nil {
		until = lc.expiresAt
	}
	w.handOutMaterial(what, s.owner, m.Identities, mat, until)
	w.adopt(s, m, mat)
}

// drawActivate draws an activate of a slot's last prepare.
func (w *world) drawActivate(t *rapid.T) *op {
	sup, pl := drawSupervised(t), w.drawPlane(t)
	si := w.pickFor(t, sup, func(s *slot) bool { return s.prepProof != "" })
	if si < 0 {
		return nil
	}
	return &op{name: "activate", run: func() { w.activate(pl, si, sup) }}
}

func (w *world) activate(pl, si int, sup bool) {
	s, m, proof, _ := w.snapshot(si)
	if proof == "" {
		return
	}
	var lc *lifecycle
	if sup {
		lc = w.assignmentOf(s.owner, m)
	}
	body := client.ServiceAuthority{Envelope: envelope(client.KindServiceAuthority, cliActor, m, nil), Operation: client.OpActivate}
	body.RegistrationProof = &proof
	mat, err := w.authority(w.plane(pl), manager.Caller{Owner: s.owner, Actor: cliActor}, body, lc)
	w.answered("activate", m.InstanceID, err, detailOf(mat))
	if err != nil {
		return
	}
	var until int64
	if lc != nil {
		until = lc.expiresAt
	}
	w.handOutMaterial("activate", s.owner, m.Identities, mat, until)
	r := mat.Renewal()
	w.mu.Lock()
	if s.m == m && s.prepProof == proof {
		s.renewal = &r
	}
	w.mu.Unlock()
}

// drawRenew draws a renew or renewStandingBundle, by the owner's CLI, the instance's own
// supervisor duty or the platform supervisor.
func (w *world) drawRenew(t *rapid.T) *op {
	pl := w.drawPlane(t)
	bundle := rapid.Bool().Draw(t, "bundle")
	as := rapid.IntRange(0, 2).Draw(t, "as")
	si := w.pickFor(t, as == 2, func(s *slot) bool { return s.renewal != nil })
	if si < 0 {
		return nil
	}
	return &op{name: "renew", run: func() { w.renew(pl, si, bundle, as) }}
}

func (w *world) renew(pl, si int, bundle bool, as int) {
	s, m, _, r := w.snapshot(si)
	if r == nil {
		return
	}
	caller := manager.Caller{Owner: s.owner, Actor: cliActor}
	var lc *lifecycle
	switch as {
	case 1:
		caller.Actor = subjects.SupervisorActor(m.InstanceID)
	case 2:
		lc = w.assignmentOf(s.owner, m)
	}
	operation := client.OpRenew
	if bundle {
		operation = client.OpRenewStandingBundle
	}
	body := client.ServiceAuthority{Envelope: envelope(client.KindServiceAuthority, caller.Actor, m, r), Operation: operation}
	mat, err := w.authority(w.plane(pl), caller, body, lc)
	w.answered(operation+" (as "+caller.Actor+")", m.InstanceID, err, detailOf(mat))
	if err != nil {
		return
	}
	var until int64
	if lc != nil {
		until = lc.expiresAt
	}
	w.handOutMaterial(operation, s.owner, m.Identities, mat, until)
}

// drawAdmit draws the admission of a new run to a slot's instance.
func (w *world) drawAdmit(t *rapid.T) *op {
	pl := w.drawPlane(t)
	si := w.pickSlot(t, func(s *slot) bool { return s.renewal != nil })
	if si < 0 {
		return nil
	}
	return &op{name: "admit", run: func() { w.admit(pl, si) }}
}

func (w *world) admit(pl, si int) {
	s, m, _, r := w.snapshot(si)
	if r == nil {
		return
	}
	runID := client.NewRunID()
	subject := subjects.RunStart{Space: testSpace, Route: subjects.RouteOne, Owner: s.owner, Actor: cliActor,
		UID: subjects.NewUID(), Generation: "1", Nonce: subjects.NewSecret(12)}.Subject()
	body := client.RunAdmission{Envelope: envelope(client.KindRunAdmission, cliActor, m, r), Run: client.RunStart{RunID: runID, Subject: subject}}
	ctx, cancel := opContext()
	defer cancel()
	caller := manager.Caller{Owner: s.owner, Actor: cliActor}
	_, _, err := w.plane(pl).engine.Admit(ctx, caller, audit.Request{Endpoint: subjects.EndpointManagerAuthority, Caller: caller.String()}, mustJSON(body))
	w.answered("admission", m.InstanceID, err, runID)
	if err != nil {
		return
	}
	w.mu.Lock()
	if s.m.InstanceID == m.InstanceID {
		s.runs = append(s.runs, &run{id: runID, subject: subject})
	}
	w.mu.Unlock()
}

// drawAttempt draws an attempt on one of a slot's admitted runs: with fresh driver and
// mediator keys, with run keys the instance named before, or with another instance's key as
// the driver or the mediator.
func (w *world) drawAttempt(t *rapid.T) *op {
	pl := w.drawPlane(t)
	si := w.pickSlot(t, func(s *slot) bool { return s.renewal != nil && len(s.runs) > 0 })
	if si < 0 {
		return nil
	}
	ri := rapid.IntRange(0, 7).Draw(t, "run")
	keys := rapid.IntRange(0, 4).Draw(t, "keys")
	own := rapid.Bool().Draw(t, "ownDuty")
	victim, pick := drawVictim(t)
	// Now and then a manager behind the run fence: the epoch and fencing token it last knew,
	// not the next ones.
	stale := rapid.IntRange(0, 5).Draw(t, "stale") == 0
	return &op{name: "attempt", run: func() { w.attempt(pl, si, ri, keys, own, victim, pick, stale) }}
}

func (w *world) attempt(pl, si, ri, keys int, own bool, victim, pick int, stale bool) {
	s, m, _, r := w.snapshot(si)
	w.mu.Lock()
	var rn *run
	var runKeys []string
	if len(s.runs) > 0 && s.m.InstanceID == m.InstanceID {
		rn = s.runs[ri%len(s.runs)]
		runKeys = append(runKeys, s.runKeys...)
	}
	var epoch, token uint64
	if rn != nil {
		epoch, token = rn.epoch+1, rn.token+1
		if stale && rn.epoch > 0 {
			epoch, token = rn.epoch, rn.token
		}
	}
	w.mu.Unlock()
	if r == nil || rn == nil {
		return
	}
	driver, mediator := freshKey(), freshKey()
	var f *foreign
	switch keys {
	case 1:
		driver = w.victimKey(si, victim, pick)
		f = w.expectForeign(m.InstanceID, driver, "attempt.driverId")
	case 2:
		mediator = w.victimKey(si, victim, pick)
		f = w.expectForeign(m.InstanceID, mediator, "attempt.mediatorId")
	case 3:
		if len(runKeys) >= 2 {
			driver, mediator = runKeys[pick%len(runKeys)], runKeys[(pick+1)%len(runKeys)]
		}
	}
	caller := manager.Caller{Owner: s.owner, Actor: cliActor}
	if own {
		caller.Actor = subjects.SupervisorActor(m.InstanceID)
	}
	body := client.RunAttempt{Envelope: envelope(client.KindRunAttempt, caller.Actor, m, r), Attempt: client.Attempt{
		RunID: rn.id, TakeoverID: subjects.NewSecret(8), Epoch: epoch, FencingToken: token, DriverID: driver, MediatorID: mediator}}
	ctx, cancel := opContext()
	defer cancel()
	rm, _, err := w.plane(pl).engine.Attempt(ctx, caller, audit.Request{Endpoint: subjects.EndpointManagerAuthority, Caller: caller.String()}, mustJSON(body))
	detail := ""
	if rm != nil {
		detail = fmt.Sprintf("(gate revision %d, run fence revision %d)", rm.GateRevision, rm.RunFenceRevision)
	}
	w.answered("attempt", m.InstanceID, err, detail)
	w.checkForeign("attempt", m.InstanceID, f, err)
	if err != nil {
		var fe *fault.Error
		if errors.As(err, &fe) {
			if rf, ok := fe.Details.(client.RunFence); ok {
				w.mu.Lock()
				rn.epoch, rn.token = max(rn.epoch, rf.Epoch), max(rn.token, rf.FencingToken)
				w.mu.Unlock()
			}
		}
		return
	}
	w.handOut(&handed{what: "attempt", owner: s.owner, iid: rm.InstanceID, uid: m.LifecycleUID, epoch: r.Epoch, ids: m.Identities,
		gateRev: rm.GateRevision, runID: rm.RunID, hold: rm.Hold, runFenceRev: rm.RunFenceRevision}, rm.Credentials)
	w.mu.Lock()
	rn.epoch, rn.token = max(rn.epoch, rm.Hold.Epoch), max(rn.token, rm.Hold.FencingToken)
	if s.m.InstanceID == m.InstanceID {
		for _, k := range []string{driver, mediator} {
			if !slices.Contains(s.runKeys, k) {
				s.runKeys = append(s.runKeys, k)
			}
		}
	}
	w.mu.Unlock()
}

// drawAssign draws an assignment of a slot's instance, for its lifecycle or a new one.
func (w *world) drawAssign(t *rapid.T) *op {
	si, pl := w.drawSlot(t), w.drawPlane(t)
	newUID := rapid.Bool().Draw(t, "newLifecycle")
	ttl := drawTTL(t)
	return &op{name: "assign", run: func() { w.assign(pl, si, newUID, ttl) }}
}

func (w *world) assign(pl, si int, newUID bool, ttl time.Duration) (*lifecycle, error) {
	s, m, _, _ := w.snapshot(si)
	uid := m.LifecycleUID
	if newUID {
		uid = subjects.NewUID()
	}
	body := client.Assign{V: 1, Kind: client.KindAssign, Owner: s.owner, InstanceID: m.InstanceID, LifecycleUID: uid, ExpiresAt: time.Now().Add(ttl).Unix()}
	ctx, cancel := opContext()
	defer cancel()
	a, _, err := w.plane(pl).sup.Assign(ctx, admin, audit.Request{Endpoint: subjects.EndpointSupervisorAssign, Caller: admin.String()}, mustJSON(body))
	w.answered("assign (lifecycle "+uid+")", m.InstanceID, err, "")
	if err != nil {
		return nil, err
	}
	lc := &lifecycle{owner: a.Owner, iid: a.InstanceID, uid: a.LifecycleUID, rev: a.Revision, expiresAt: a.ExpiresAt}
	w.mu.Lock()
	w.assigned[s.owner] = lc
	w.mu.Unlock()
	return lc, nil
}

// drawEnd draws the end of an owner's assignment, crashed after a step or not; after a crash,
// now and then an assignment of another of the owner's instances, and a repeat of the end.
func (w *world) drawEnd(t *rapid.T) *op {
	w.mu.Lock()
	var assigned []int
	for i, o := range owners {
		if w.assigned[o] != nil {
			assigned = append(assigned, i)
		}
	}
	w.mu.Unlock()
	if len(assigned) == 0 {
		return nil
	}
	o, pl := rapid.SampledFrom(assigned).Draw(t, "owner"), w.drawPlane(t)
	crash := drawCrash(t)
	between := rapid.Bool().Draw(t, "assignWhileEnding")
	other := w.drawSlot(t)
	retry := rapid.Bool().Draw(t, "repeatAtOnce")
	return &op{name: "end", run: func() { w.end(pl, o, crash, between, other, retry) }}
}

func (w *world) end(pl, o, crash int, between bool, other int, retry bool) {
	w.mu.Lock()
	lc := w.assigned[owners[o]]
	w.mu.Unlock()
	if lc == nil {
		return
	}
	if w.endOnce(pl, lc, crash) != endPending {
		return
	}
	if between {
		// The owner's other instance: refused while the end is pending (failed-precondition
		// naming it); after a crash past the last step, the assignment is ended and a new one
		// may take its place.
		si := o*slotsPerOwner + other%slotsPerOwner
		state := w.assignmentState(lc)
		_, err := w.assign(pl, si, false, 2*time.Hour)
		switch {
		case state == supervisor.StateEnding && err == nil && w.assignmentState(lc) == supervisor.StateEnding:
			w.problem("an assignment for owner %s was answered while the end of %s was pending", lc.owner, lc.iid)
		case state == supervisor.StateEnding && fault.CodeOf(err) == fault.FailedPrecondition:
			count("an assignment while the end was pending was refused failed-precondition")
			if !strings.Contains(err.Error(), "still ending") {
				w.problem("an assignment while the end of %s was pending: the refusal %q does not name the pending end", lc.iid, err)
			}
		case state == supervisor.StateEnded && err == nil:
			count("an assignment after an end that crashed once ended was answered")
		}
	}
	if retry {
		w.endOnce(pl, lc, 0)
	}
}

// assignmentState is the stored state of lc's assignment; "" once another lifecycle's is there.
func (w *world) assignmentState(lc *lifecycle) string {
	row, ok := w.assignmentRow(lc.owner)
	if !ok || row.InstanceID != lc.iid || row.LifecycleUID != lc.uid {
		return ""
	}
	return row.State
}

// What one end came to.
const (
	endSettled  = iota // the assignment is ended: the revocation's outcome is settled
	endPending         // it stopped midway: to be repeated
	endReplaced        // it cannot be repeated: another lifecycle's assignment took its place
)

// endOnce ends lc on replica pl, crashed after step crash (0: not crashed), and notes what it
// came to.
func (w *world) endOnce(pl int, lc *lifecycle, crash int) int {
	w.mu.Lock()
	if crash > 0 {
		w.crashAt[lc.iid] = crash
	}
	w.mu.Unlock()
	body := client.End{V: 1, Kind: client.KindEnd, Owner: lc.owner, InstanceID: lc.iid, LifecycleUID: lc.uid, Reason: "the schedule ends it"}
	ctx, cancel := opContext()
	report, _, err := w.plane(pl).sup.End(ctx, admin, audit.Request{Endpoint: subjects.EndpointSupervisorEnd, Caller: admin.String()}, mustJSON(body))
	cancel()
	w.mu.Lock()
	if crash > 0 && w.crashAt[lc.iid] == crash {
		delete(w.crashAt, lc.iid) // it stopped before the step
	}
	w.mu.Unlock()
	detail := ""
	if report != nil {
		detail = fmt.Sprintf("%+v", *report)
	}
	w.answered(fmt.Sprintf("end (lifecycle %s, crash after step %d)", lc.uid, crash), lc.iid, err, detail)
	var fe *fault.Error
	if err != nil && errors.As(err, &fe) {
		if r, ok := fe.Details.(*client.EndReport); ok {
			report = r
		}
	}
	outcome := endPending
	switch {
	case errors.Is(err, errCrash):
		// Ends of one instance racing may stop after each other's step.
		var step int
		if _, serr := fmt.Sscanf(err.Error()[strings.Index(err.Error(), "after step"):], "after step %d of 7", &step); serr != nil || step < 1 {
			w.problem("the end of %s crashed: got %q, want it to say after which step of %d it stopped", lc.iid, err, supervisor.EndSteps)
		}
		count(fmt.Sprintf("an end crashed after step %d", step))
	case report != nil:
		outcome = endSettled
		count("an end settled")
		if report.Done {
			count("an end was done")
		}
		if len(report.Revoked.Unrevoked) > 0 {
			count("an end left keys unrevoked: " + firstWords(report.Revoked.Reason))
		}
		if state := w.assignmentState(lc); state != supervisor.StateEnded && state != "" {
			w.problem("the end of %s answered its report, and its assignment is %s, not ended", lc.iid, state)
		}
	case fault.CodeOf(err) == fault.FailedPrecondition && strings.Contains(err.Error(), "not those of owner"):
		outcome = endReplaced
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	i := slices.Index(w.pending, lc)
	switch {
	case outcome == endPending && i < 0:
		w.pending = append(w.pending, lc)
	case outcome == endReplaced && i >= 0:
		count("an end that stopped midway could not be repeated: another assignment took its place")
		w.pending = append(w.pending[:i], w.pending[i+1:]...)
	case outcome == endSettled && i >= 0:
		count("an end that stopped midway completed when repeated")
		w.pending = append(w.pending[:i], w.pending[i+1:]...)
	}
	return outcome
}

func firstWords(s string) string {
	f := strings.Fields(s)
	return strings.Join(f[:min(len(f), 6)], " ")
}

// drawRepeat draws a repeat of an end that stopped midway, itself crashed now and then.
func (w *world) drawRepeat(t *rapid.T) *op {
	w.mu.Lock()
	n := len(w.pending)
	w.mu.Unlock()
	if n == 0 {
		return nil
	}
	pl, which := w.drawPlane(t), rapid.IntRange(0, 3).Draw(t, "pending")
	crash := 0
	if rapid.IntRange(0, 3).Draw(t, "crashAgain") == 0 {
		crash = drawCrash(t)
	}
	return &op{name: "repeat an end", run: func() {
		w.mu.Lock()
		var lc *lifecycle
		if len(w.pending) > 0 {
			lc = w.pending[which%len(w.pending)]
		}
		w.mu.Unlock()
		if lc != nil {
			w.endOnce(pl, lc, crash)
		}
	}}
}

// drawContention draws requests that contend for one slot's instance: prepares (its first
// registration, or re-registrations) and renewals.
func (w *world) drawContention(t *rapid.T) []*op {
	si := w.drawSlot(t)
	var ops []*op
	for range rapid.IntRange(2, 3).Draw(t, "contenders") {
		pl := w.drawPlane(t)
		if rapid.IntRange(0, 2).Draw(t, "renewInstead") == 0 {
			bundle := rapid.Bool().Draw(t, "bundle")
			ops = append(ops, &op{name: "renew", run: func() { w.renew(pl, si, bundle, 0) }})
			continue
		}
		change := rapid.SampledFrom([]int{0, 0, 1, 2}).Draw(t, "change")
		ops = append(ops, &op{name: "prepare", run: func() { w.prepare(pl, si, false, change, false, "", 0, 0) }})
	}
	return ops
}

// drawRequest draws one of the requests a manager, an owner or the platform supervisor
// makes.
func (w *world) drawRequest(t *rapid.T) *op {
	switch rapid.IntRange(0, 7).Draw(t, "request") {
	case 0:
		return w.drawPrepare(t)
	case 1:
		return w.drawActivate(t)
	case 2:
		return w.drawRenew(t)
	case 3:
		return w.drawAdmit(t)
	case 4:
		return w.drawAttempt(t)
	case 5:
		return w.drawAssign(t)
	case 6:
		return w.drawEnd(t)
	}
	return w.drawRepeat(t)
}
