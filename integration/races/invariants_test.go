package races

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/capability/manager"
	"github.com/cotal-ai/authplane/internal/capability/supervisor"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// invariants checks what docs/SECURITY.md promises after each round of a race, from what the clients received, what
// the fence writers reported, and what the stores hold. A race tells it every reply with
// credentials (material, runMaterial) and every fence change it made (a re-registration is a
// prepare's reply; frozen, revoked); check then reads the stores, as an auditor would, and
// asserts:
//
//   - every credential a client received is a JWT of the data account whose nkey has a
//     `minted` record of its instance (and run) and duty: an end can revoke it;
//   - its commit precedes every fence change that forbids it, by revision: a gate's
//     re-registration to a later epoch and its end's freeze; a run fence's takeover to a later
//     epoch and its revocation; and it follows the change it stands on (its own registration or
//     takeover);
//   - the checker was told of every such change the fences show now (a gate at a later epoch,
//     frozen or retired; a run fence at a later epoch or revoked), so none went unchecked; a
//     revoked run fence was never written again, and its marker is the one the revoke returned;
//   - no credential's exp passes its ceiling: its duty's lifetime and, for a supervised
//     instance, its assignment's end (which its gate carries as supervisedUntil and its issued
//     evidence as its ceiling); every credential is signed by its instance's own key, and an
//     ended instance's key is off the signer set and not listed at the broker;
//   - write-once rows are written once: the write-once buckets never lost a message to a second
//     write of its key, an nkey claim keeps the revision it was created at (before the
//     registration that claimed it), and an issued generation's evidence is the one its attempt
//     names.
type invariants struct {
	p *harness.TestPlane

	mu sync.Mutex
	// got is every credential a client received; got[:checked] were checked against the stores.
	got     []received
	checked int
	// regs: instance → epoch → the revision its registration (a prepare's gate write) landed at.
	regs map[string]map[uint64]uint64
	// frozen: instance → the revision its end's freeze landed at.
	frozen map[string]uint64
	// takeovers: run → epoch → the revision the attempt that took it over landed at.
	takeovers map[string]map[uint64]uint64
	// revoked: run → what its revoke returned.
	revoked map[string]*client.RevokeReply
	// owners: supervised instance → the owner whose assignment it runs under.
	owners map[string]string
	// claims: nkey → the revision of its claim when first read.
	claims map[string]uint64
	// dirty are the instances and runs whose fences changed or minted since the last check.
	dirtyGates, dirtyRuns map[string]bool
}

// received is one credential a client received, and what its reply said of its commit.
type received struct {
	what  string // the operation or kind that minted it, for messages
	iid   string
	runID string
	duty  string
	nkey  string
	// signer is the key that signed it, from the JWT.
	signer string
	exp    int64 // seconds, from the JWT
	iat    int64 // seconds, from the JWT
	// epoch is the gate's process epoch the mint stood on; gate the revision its commit on the
	// gate landed at.
	epoch, gate uint64
	// hold is the run hold a run mint stood on; run the revision its commit on the run fence
	// landed at.
	hold client.RunHold
	run  uint64
}

func (c received) String() string {
	if c.runID != "" {
		return fmt.Sprintf("%s %s of run %s (hold epoch %d, run fence revision %d, gate revision %d)", c.what, c.duty, c.runID, c.hold.Epoch, c.run, c.gate)
	}
	return fmt.Sprintf("%s %s of instance %s (epoch %d, gate revision %d)", c.what, c.duty, c.iid, c.epoch, c.gate)
}

func newInvariants(p *harness.TestPlane) *invariants {
	return &invariants{p: p, regs: map[string]map[uint64]uint64{}, frozen: map[string]uint64{},
		takeovers: map[string]map[uint64]uint64{}, revoked: map[string]*client.RevokeReply{},
		owners: map[string]string{}, claims: map[string]uint64{}, dirtyGates: map[string]bool{}, dirtyRuns: map[string]bool{}}
}

// decoded is the credential c as a client reads it: the nkey and times from the JWT itself,
// which must be the data account's and agree with the reply's exp.
func (inv *invariants) decoded(t testing.TB, what, duty string, c client.Credential) (received, bool) {
	uc, err := jwt.DecodeUserClaims(c.JWT)
	switch {
	case err != nil:
		t.Errorf("%s %s: the credential is not a user JWT: %v", what, duty, err)
		return received{}, false
	case uc.IssuerAccount != inv.p.Account() || uc.Expires != c.Exp:
		t.Errorf("%s %s: got issuer account %s exp %d (reply: %d), want the data account %s and the reply's exp", what, duty, uc.IssuerAccount, uc.Expires, c.Exp, inv.p.Account())
		return received{}, false
	}
	return received{what: what, duty: duty, nkey: uc.Subject, signer: uc.Issuer, exp: uc.Expires, iat: uc.IssuedAt}, true
}

// material records m, a manager-authority or supervisor-authority reply with credentials. A
// prepare's is also a fence change: the registration of its epoch, at its gate revision.
func (inv *invariants) material(t testing.TB, m *client.Material) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	if m.Operation == client.OpPrepare {
		regs := inv.regs[m.InstanceID]
		if regs == nil {
			regs = map[uint64]uint64{}
			inv.regs[m.InstanceID] = regs
		}
		if r, ok := regs[m.ProcessEpoch]; ok && r != m.GateRevision {
			t.Errorf("instance %s: two registrations of epoch %d, at gate revisions %d and %d", m.InstanceID, m.ProcessEpoch, r, m.GateRevision)
		}
		regs[m.ProcessEpoch] = m.GateRevision
	}
	for duty, c := range m.Credentials {
		if r, ok := inv.decoded(t, m.Operation, duty, c); ok {
			r.iid, r.epoch, r.gate = m.InstanceID, m.ProcessEpoch, m.GateRevision
			inv.got = append(inv.got, r)
		}
	}
	inv.dirtyGates[m.InstanceID] = true
}

// runMaterial records rm, a run attempt's or driver renewal's reply, minted on the gate at
// process epoch epoch (what the request carried). An attempt's is also a fence change: the
// takeover of its hold's epoch, at its run fence revision.
func (inv *invariants) runMaterial(t testing.TB, rm *client.RunMaterial, epoch uint64) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	what := rm.Kind
	if rm.Operation != "" {
		what = rm.Operation
	}
	if rm.Kind == client.KindRunAttempt {
		tk := inv.takeovers[rm.RunID]
		if tk == nil {
			tk = map[uint64]uint64{}
			inv.takeovers[rm.RunID] = tk
		}
		if r, ok := tk[rm.Hold.Epoch]; ok && r != rm.RunFenceRevision {
			t.Errorf("run %s: two takeovers at epoch %d, at run fence revisions %d and %d", rm.RunID, rm.Hold.Epoch, r, rm.RunFenceRevision)
		}
		tk[rm.Hold.Epoch] = rm.RunFenceRevision
	}
	for duty, c := range rm.Credentials {
		if r, ok := inv.decoded(t, what, duty, c); ok {
			r.iid, r.runID, r.epoch, r.gate, r.hold, r.run = rm.InstanceID, rm.RunID, epoch, rm.GateRevision, rm.Hold, rm.RunFenceRevision
			inv.got = append(inv.got, r)
		}
	}
	inv.dirtyGates[rm.InstanceID] = true
	inv.dirtyRuns[rm.RunID] = true
}

// revokedRun records a revoke's reply: from its run fence revision on, the run issues nothing.
func (inv *invariants) revokedRun(r *client.RevokeReply) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	inv.revoked[r.RunID] = r
	inv.dirtyRuns[r.RunID] = true
}

// frozenAt records that the end of instance iid froze its gate at revision rev.
func (inv *invariants) frozenAt(iid string, rev uint64) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	inv.frozen[iid] = rev
	inv.dirtyGates[iid] = true
}

// isFrozen reports whether the checker was told of the freeze of instance iid.
func (inv *invariants) isFrozen(iid string) bool {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	_, ok := inv.frozen[iid]
	return ok
}

// supervised says instance iid runs under owner's platform supervisor assignment.
func (inv *invariants) supervised(owner, iid string) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	inv.owners[iid] = owner
}

// check reads the stores and asserts the invariants over everything recorded so far (the
// stores are read for what changed since the last check).
func (inv *invariants) check(t testing.TB) {
	t.Helper()
	inv.mu.Lock()
	defer inv.mu.Unlock()
	fresh := inv.got[inv.checked:]
	inv.checkMinted(t, fresh)
	for _, c := range inv.got {
		if inv.dirtyGates[c.iid] || inv.dirtyRuns[c.runID] {
			inv.checkOrder(t, c)
		}
	}
	for iid := range inv.dirtyGates {
		inv.checkGate(t, iid)
	}
	for runID := range inv.dirtyRuns {
		inv.checkRunFence(t, runID)
	}
	inv.checkCeilings(t, fresh)
	inv.checkWriteOnce(t, fresh)
	inv.checked = len(inv.got)
	clear(inv.dirtyGates)
	clear(inv.dirtyRuns)
}

// checkMinted: every credential's nkey is named by a `minted` record of its instance, with its
// duty and run.
func (inv *invariants) checkMinted(t testing.TB, fresh []received) {
	t.Helper()
	byKey := map[string]map[string]harness.MintedRecord{} // instance → nkey → the record naming it
	for _, c := range fresh {
		if byKey[c.iid] == nil {
			byKey[c.iid] = map[string]harness.MintedRecord{}
			for _, rec := range harness.MintedRecords(t, inv.p, c.iid) {
				for _, k := range rec.Keys() {
					byKey[c.iid][k] = rec
				}
			}
		}
		rec, ok := byKey[c.iid][c.nkey]
		if !ok {
			t.Errorf("%s: no minted record of instance %s names its nkey %s", c, c.iid, c.nkey)
			continue
		}
		cred, _ := rec.Of(c.nkey)
		if cred.Duty != c.duty || rec.InstanceID != c.iid || rec.RunID != c.runID {
			t.Errorf("%s: got minted record of nkey %s duty %s instance %s run %q, want its own", c, cred.NKey, cred.Duty, rec.InstanceID, rec.RunID)
		}
	}
}

// checkOrder: c's commits follow the fence changes it stands on and precede every one known
// that forbids it.
func (inv *invariants) checkOrder(t testing.TB, c received) {
	t.Helper()
	if c.gate == 0 {
		t.Errorf("%s: the reply says no gate revision", c)
	}
	if r, ok := inv.regs[c.iid][c.epoch]; ok && c.gate < r {
		t.Errorf("%s: committed at gate revision %d, before the registration of its epoch at %d", c, c.gate, r)
	}
	// Registrations land in epoch order (checkGate), so the next one bounds it.
	if r, ok := inv.regs[c.iid][c.epoch+1]; ok && c.gate >= r {
		t.Errorf("%s: committed at gate revision %d, at or after the re-registration to epoch %d at %d that forbids it", c, c.gate, c.epoch+1, r)
	}
	if f, ok := inv.frozen[c.iid]; ok && c.gate >= f {
		t.Errorf("%s: committed at gate revision %d, at or after its end's freeze at %d", c, c.gate, f)
	}
	if c.runID == "" {
		return
	}
	if c.run == 0 {
		t.Errorf("%s: the reply says no run fence revision", c)
	}
	if r, ok := inv.takeovers[c.runID][c.hold.Epoch]; ok && c.run < r {
		t.Errorf("%s: committed at run fence revision %d, before its takeover at %d", c, c.run, r)
	}
	if r, ok := inv.takeovers[c.runID][c.hold.Epoch+1]; ok && c.run >= r {
		t.Errorf("%s: committed at run fence revision %d, at or after the takeover to epoch %d at %d that forbids it", c, c.run, c.hold.Epoch+1, r)
	}
	if r, ok := inv.revoked[c.runID]; ok && c.run >= r.RunFenceRevision {
		t.Errorf("%s: committed at run fence revision %d, at or after the revocation at %d", c, c.run, r.RunFenceRevision)
	}
}

// checkGate: the gate of iid as stored shows no change the checker was not told of, and no
// credential claims a revision it has not reached.
func (inv *invariants) checkGate(t testing.TB, iid string) {
	t.Helper()
	m, err := harness.FenceEntry(t, inv.p, subjects.GateKey(subjects.GateEndpointManager, iid))
	if err != nil {
		t.Errorf("gate of %s: %v", iid, err)
		return
	}
	row, err := issue.ParseGate(m.Data)
	if err != nil {
		t.Errorf("gate of %s: %v", iid, err)
		return
	}
	first := row.ProcessEpoch
	for _, c := range inv.got {
		if c.iid != iid {
			continue
		}
		first = min(first, c.epoch)
		if c.gate > m.Sequence {
			t.Errorf("%s: a commit at gate revision %d, past the gate's %d", c, c.gate, m.Sequence)
		}
	}
	var last uint64
	for epoch := first; epoch <= row.ProcessEpoch; epoch++ {
		r, ok := inv.regs[iid][epoch]
		switch {
		case !ok && epoch > first:
			t.Errorf("gate of %s: at epoch %d, but the checker saw no registration of epoch %d", iid, row.ProcessEpoch, epoch)
		case ok && r <= last:
			t.Errorf("gate of %s: epoch %d registered at revision %d, not after the epoch before it (%d)", iid, epoch, r, last)
		}
		last = max(last, r)
	}
	if row.State != issue.GateOpen {
		if _, ok := inv.frozen[iid]; !ok {
			t.Errorf("gate of %s: %s, but the checker saw no freeze", iid, row.State)
		}
	}
	if owner, ok := inv.owners[iid]; ok {
		a := inv.assignment(t, owner)
		if row.SupervisedUntil != a.ExpiresAt {
			t.Errorf("gate of %s: supervisedUntil %d, want its assignment's end %d", iid, row.SupervisedUntil, a.ExpiresAt)
		}
	}
}

// checkRunFence: the run fence of runID as stored shows no change the checker was not told
// of; a revoked one was never written after its revocation, and its marker is the revoke's.
func (inv *invariants) checkRunFence(t testing.TB, runID string) {
	t.Helper()
	m, err := harness.FenceEntry(t, inv.p, subjects.RunFenceKey(runID))
	if err != nil {
		t.Errorf("run fence of %s: %v", runID, err)
		return
	}
	var row struct {
		Epoch   uint64 `json:"epoch"`
		Revoked bool   `json:"revoked"`
	}
	if err := json.Unmarshal(m.Data, &row); err != nil {
		t.Errorf("run fence of %s: %v", runID, err)
		return
	}
	for _, c := range inv.got {
		if c.runID == runID && c.run > m.Sequence {
			t.Errorf("%s: a commit at run fence revision %d, past the fence's %d", c, c.run, m.Sequence)
		}
	}
	var last uint64
	for epoch := uint64(1); epoch <= row.Epoch; epoch++ {
		r, ok := inv.takeovers[runID][epoch]
		switch {
		case !ok:
			t.Errorf("run fence of %s: at epoch %d, but the checker saw no takeover at epoch %d", runID, row.Epoch, epoch)
		case r <= last:
			t.Errorf("run fence of %s: taken over at epoch %d at revision %d, not after the epoch before it (%d)", runID, epoch, r, last)
		}
		last = max(last, r)
	}
	r, told := inv.revoked[runID]
	switch {
	case row.Revoked && !told:
		t.Errorf("run fence of %s: revoked, but the checker saw no revocation", runID)
	case told && (!row.Revoked || m.Sequence != r.RunFenceRevision):
		t.Errorf("run fence of %s: revoked %t at revision %d, want revoked at %d and never written since", runID, row.Revoked, m.Sequence, r.RunFenceRevision)
	case told:
		if marker := harness.MarkerOf(t, inv.p, runID); string(marker) != string(r.Revocation) {
			t.Errorf("run %s: stored marker %s, want the one its revoke returned %s", runID, marker, r.Revocation)
		}
	}
}

// checkCeilings: no credential's exp passes its duty's lifetime, nor, for a supervised
// instance, its assignment's end.
func (inv *invariants) checkCeilings(t testing.TB, fresh []received) {
	t.Helper()
	ends := map[string]int64{}
	for _, c := range fresh {
		ttl := service.Defaults().StandingTTL
		if c.duty == string(subjects.DutyExecutor) {
			ttl = min(ttl, manager.ExecutorTTL)
		}
		if c.exp <= c.iat || c.exp > c.iat+int64(ttl/time.Second) {
			t.Errorf("%s: exp %d, issued at %d: want within its lifetime %s", c, c.exp, c.iat, ttl)
		}
		owner, ok := inv.owners[c.iid]
		if !ok {
			continue
		}
		if _, ok := ends[c.iid]; !ok {
			ends[c.iid] = inv.assignment(t, owner).ExpiresAt
		}
		if c.exp > ends[c.iid] {
			t.Errorf("%s: exp %d past its assignment's end %d", c, c.exp, ends[c.iid])
		}
	}
	// Every credential is signed by its instance's own key; an ended instance's key is off the
	// signer set and off the account JWT the broker holds.
	var live map[string]int64
	var claims *jwt.AccountClaims
	for _, c := range fresh {
		if want := harness.SignerOf(t, inv.p.Keys(), c.iid); c.signer != want {
			t.Errorf("%s: signed by %s, want its instance's key %s", c, c.signer, want)
		}
		if _, ended := inv.frozen[c.iid]; !ended {
			continue
		}
		if live == nil {
			live = harness.LiveSigners(t, inv.p)
			claims, _ = harness.DataAccountAtBroker(t, inv.p)
		}
		_, onSet := live[c.iid]
		_, atBroker := claims.SigningKeys[c.signer]
		if onSet || atBroker {
			t.Errorf("%s: the ended instance's key is on the signer set (%v) or listed at the broker (%v)", c, onSet, atBroker)
		}
	}
}

// assignment reads owner's assignment row.
func (inv *invariants) assignment(t testing.TB, owner string) client.Assignment {
	t.Helper()
	var a client.Assignment
	bucket := subjects.PlatformBucket(harness.TestSpace)
	harness.ReadRecord(t, inv.p, bucket, "$KV."+bucket+"."+subjects.AssignmentKey(owner), &a)
	return a
}

// checkWriteOnce: the write-once buckets never lost a message to a second write of a key; each
// nkey claim keeps the revision it was created at, before the registration that claimed it; a
// supervised instance's issued evidence is what its attempt names, with its assignment's end
// as its ceiling.
func (inv *invariants) checkWriteOnce(t testing.TB, fresh []received) {
	t.Helper()
	for _, bucket := range []string{subjects.AcceptedBucket(harness.TestSpace), subjects.AdmissionBucket(harness.TestSpace)} {
		info, err := harness.StreamInfo(t, inv.p, bucket)
		if err != nil {
			t.Errorf("%s: %v", bucket, err)
			continue
		}
		s, c := info.State, info.Config
		if s.NumDeleted != 0 || (s.Msgs > 0 && s.Msgs != s.LastSeq-s.FirstSeq+1) || !c.DiscardNewPerSubject || c.MaxMsgsPerSubject != 1 {
			t.Errorf("%s: %d messages in sequences %d to %d, %d deleted (discard new per subject %t, %d per subject): a key was written twice",
				bucket, s.Msgs, s.FirstSeq, s.LastSeq, s.NumDeleted, c.DiscardNewPerSubject, c.MaxMsgsPerSubject)
		}
		for subject, n := range info.State.Subjects {
			if n != 1 {
				t.Errorf("%s: %d messages on %s, want one", bucket, n, subject)
			}
		}
	}
	lifecycles := map[string]received{}
	for _, c := range fresh {
		if !slices.Contains(subjects.StandingDuties, subjects.Duty(c.duty)) {
			continue
		}
		lifecycles[c.iid] = c
		m, err := harness.FenceEntry(t, inv.p, subjects.NKeyClaimKey(c.nkey))
		if err != nil {
			t.Errorf("%s: no claim on its nkey: %v", c, err)
			continue
		}
		if !strings.Contains(string(m.Data), `"instanceId":"`+c.iid+`"`) {
			t.Errorf("%s: the claim on its nkey is %s, want its instance's", c, m.Data)
		}
		first, seen := inv.claims[c.nkey]
		switch {
		case !seen:
			inv.claims[c.nkey] = m.Sequence
		case first != m.Sequence:
			t.Errorf("%s: the claim on its nkey moved from revision %d to %d: a create-only row was written again", c, first, m.Sequence)
		}
		if regs := inv.regs[c.iid]; len(regs) > 0 && m.Sequence >= regs[slices.Min(slices.Collect(maps.Keys(regs)))] {
			t.Errorf("%s: the claim on its nkey is at revision %d, not before the first registration that claimed it", c, m.Sequence)
		}
	}
	for iid, c := range lifecycles {
		if owner, ok := inv.owners[iid]; ok {
			inv.checkEvidence(t, owner, iid, c)
		}
	}
}

// checkEvidence: the supervisor and executor generations recorded for the supervised lifecycle
// of instance iid (c is one of its credentials) are the evidence their attempts name, for the
// duty's nkey, with the assignment's end as ceiling.
func (inv *invariants) checkEvidence(t testing.TB, owner, iid string, c received) {
	t.Helper()
	a := inv.assignment(t, owner)
	for _, d := range []subjects.Duty{subjects.DutySupervisor, subjects.DutyExecutor} {
		var acc struct {
			Ref struct {
				Owner, Actor, UID, Generation string
			} `json:"ref"`
		}
		harness.ReadRecord(t, inv.p, subjects.AcceptedBucket(harness.TestSpace), "$KV."+subjects.AcceptedBucket(harness.TestSpace)+"."+
			subjects.AcceptedKey(supervisor.AcceptedToken(owner, iid, a.LifecycleUID, d)), &acc)
		key := subjects.EvidenceKey(owner, acc.Ref.Actor, acc.Ref.UID, acc.Ref.Generation)
		bucket := subjects.IssuedBucket(harness.TestSpace)
		ev, err := harness.LastMsg(t, inv.p, bucket, "$KV."+bucket+"."+key)
		if err != nil {
			t.Errorf("%s: the %s generation %s has no evidence: %v", c, d, acc.Ref.Generation, err)
			continue
		}
		var attempt struct {
			State  string `json:"state"`
			Digest string `json:"digest"`
		}
		harness.ReadRecord(t, inv.p, bucket, "$KV."+bucket+"."+subjects.AttemptKey(key), &attempt)
		sum := sha256.Sum256(ev.Data)
		var row struct {
			Key       string `json:"key"`
			ExpiresAt int64  `json:"expiresAt"`
		}
		if err := json.Unmarshal(ev.Data, &row); err != nil {
			t.Errorf("%s: evidence %s: %v", c, key, err)
			continue
		}
		if attempt.Digest != "sha256:"+hex.EncodeToString(sum[:]) || row.ExpiresAt != a.ExpiresAt || acc.Ref.UID != a.LifecycleUID {
			t.Errorf("%s: the %s generation's evidence %s (ceiling exp %d) is not what its attempt names (%s) under the assignment's end %d",
				c, d, ev.Data, row.ExpiresAt, attempt.Digest, a.ExpiresAt)
		}
	}
}

// tally counts a race's outcomes: credentials issued, and refusals by code; a conflict lost at
// the commit fence (a fence writer landed between the mint's read and its commit) is counted
// apart from one refused before signing.
type tally struct {
	mu sync.Mutex
	n  map[string]int
}

// commitLost is what a tally calls a conflict lost at the commit fence.
const commitLost = "conflict at commit"

// add counts one outcome: code "" is credentials issued; message is the refusal's.
func (ta *tally) add(code, message string) {
	ta.mu.Lock()
	defer ta.mu.Unlock()
	if ta.n == nil {
		ta.n = map[string]int{}
	}
	switch {
	case code == "":
		code = "issued"
	case code == "conflict" && strings.Contains(message, "moved first"):
		code = commitLost
	}
	ta.n[code]++
}

// of counts the outcome of a client call (err nil: issued; a refusal: its code; anything else:
// transport) and reports whether it issued.
func (ta *tally) of(err error) bool {
	var r *client.Refusal
	switch {
	case err == nil:
		ta.add("", "")
	case errors.As(err, &r):
		ta.add(r.Code, r.Message)
	default:
		ta.add("transport", "")
	}
	return err == nil
}

// count is how many outcomes had code ("" for issued, commitLost for a conflict at commit).
func (ta *tally) count(code string) int {
	ta.mu.Lock()
	defer ta.mu.Unlock()
	if code == "" {
		code = "issued"
	}
	return ta.n[code]
}

// String lists the counts, issued first, then each refusal code.
func (ta *tally) String() string {
	ta.mu.Lock()
	defer ta.mu.Unlock()
	out := []string{fmt.Sprintf("issued %d", ta.n["issued"])}
	for _, code := range slices.Sorted(maps.Keys(ta.n)) {
		if code != "issued" {
			out = append(out, fmt.Sprintf("%s %d", code, ta.n[code]))
		}
	}
	return strings.Join(out, ", ")
}
