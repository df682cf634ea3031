package supervisor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/cotal-ai/authplane/internal/capability/manager"
	"github.com/cotal-ai/authplane/internal/capability/supervisor"
	"github.com/cotal-ai/authplane/internal/core/audit"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/internal/core/store"
	"github.com/cotal-ai/authplane/subjects"
)

// assignmentRow is owner's assignment as stored now.
func (w *world) assignmentRow(owner string) (supervisor.Assignment, bool) {
	e, err := w.platform.KV.Get(context.Background(), subjects.AssignmentKey(owner))
	if err != nil {
		return supervisor.Assignment{}, false
	}
	var a supervisor.Assignment
	if json.Unmarshal(e.Value, &a) != nil {
		return supervisor.Assignment{}, false
	}
	return a, true
}

// storedInstances is what the invariants read of an owner's quota row.
type storedInstances struct {
	IDs     []string `json:"instanceIds"`
	Pending []struct {
		InstanceID string `json:"instanceId"`
		Until      int64  `json:"until"`
	} `json:"pending"`
}

// storedRunFence is what the invariants read of a run fence.
type storedRunFence struct {
	InstanceID   string `json:"instanceId"`
	Holder       string `json:"holder"`
	TakeoverID   string `json:"takeoverId"`
	Epoch        uint64 `json:"epoch"`
	FencingToken uint64 `json:"fencingToken"`
	DriverID     string `json:"driverId"`
	MediatorID   string `json:"mediatorId"`
	Revoked      bool   `json:"revoked"`
}

// onRecord is one credential a minted record names, and the latest expiry the record stands
// for by the time the stream stored it (audit.Writer.Minted: a renewal of the same keys
// writes no record while one stands for it).
type onRecord struct {
	audit.Credential
	stays int64
}

// readRecords reads the record stream: the minted records by instance and key (a record of a
// mint counted under each key it names), and the
// `ended` records. What it parsed once it keeps (the stream only grows).
func (w *world) readRecords() (minted map[string]map[string][]onRecord, ended []audit.Decision, bad []string) {
	c := &w.parsed
	if c.minted == nil {
		c.minted = map[string]map[string][]onRecord{}
	}
	mintedPrefix := "cotal." + testSpace + ".minted."
	endedPrefix := strings.TrimSuffix(subjects.AuditSubject(testSpace, audit.Ended, "", ""), "..") + "."
	msgs := w.records.Msgs()
	for _, msg := range msgs[c.n:] {
		if rest, ok := strings.CutPrefix(msg.Subject, mintedPrefix); ok {
			iid, digest, _ := strings.Cut(rest, ".")
			var m audit.Minted
			if err := json.Unmarshal(msg.Data, &m); err != nil || len(m.Credentials) == 0 || digest != subjects.MintedDigest(credentialKeys(m.Credentials)) {
				c.bad = append(c.bad, fmt.Sprintf("the minted record on %s does not decode as a record of the keys its subject names: %v", msg.Subject, err))
				continue
			}
			if c.minted[iid] == nil {
				c.minted[iid] = map[string][]onRecord{}
			}
			stays := msg.At.Add(store.MintedMaxAge - audit.RecordMargin).Unix()
			for _, cred := range m.Credentials {
				c.minted[iid][cred.NKey] = append(c.minted[iid][cred.NKey], onRecord{cred, stays})
			}
		} else if strings.HasPrefix(msg.Subject, endedPrefix) {
			var d audit.Decision
			if err := json.Unmarshal(msg.Data, &d); err != nil || d.Assignment == nil {
				c.bad = append(c.bad, fmt.Sprintf("the ended record on %s does not decode: %v", msg.Subject, err))
				continue
			}
			c.ended = append(c.ended, d)
		}
	}
	c.n = len(msgs)
	return c.minted, c.ended, slices.Clone(c.bad)
}

// credentialKeys are the keys of creds.
func credentialKeys(creds []audit.Credential) []string {
	keys := make([]string, len(creds))
	for i, c := range creds {
		keys[i] = c.NKey
	}
	return keys
}

// parsed is what the checks parsed of the stores so far.
type parsed struct {
	n      int // records parsed
	minted map[string]map[string][]onRecord
	ended  []audit.Decision
	bad    []string
	gates  map[uint64]issue.GateRow // by revision
}

// parseGate parses a gate row as written, once.
func (w *world) parseGate(wr write) (issue.GateRow, error) {
	if row, ok := w.parsed.gates[wr.rev]; ok {
		return row, nil
	}
	row, err := issue.ParseGate(wr.value)
	if err == nil {
		if w.parsed.gates == nil {
			w.parsed.gates = map[uint64]issue.GateRow{}
		}
		w.parsed.gates[wr.rev] = row
	}
	return row, err
}

// signerSet is the data account's live instances as stored: instance → when its key was added.
func (w *world) signerSet() map[string]int64 {
	e, err := w.gates.KV.Get(context.Background(), subjects.SignersKey(w.account))
	if err != nil {
		return map[string]int64{}
	}
	var r struct {
		Live map[string]int64 `json:"live"`
	}
	if json.Unmarshal(e.Value, &r) != nil {
		return map[string]int64{}
	}
	return r.Live
}

// signerOf is the public signing key of instance iid.
func (w *world) signerOf(iid string) string {
	pub, err := w.instanceKeys.Public(iid)
	if err != nil {
		panic(err)
	}
	return pub
}

var stateOrder = map[string]int{issue.GateOpen: 0, issue.GateFrozen: 1, issue.GateRetired: 2,
	supervisor.StateAssigned: 0, supervisor.StateEnding: 1, supervisor.StateEnded: 2}

// When the invariants are checked.
const (
	// running: between two actions (no request in flight; a pending registration's slot may
	// still count).
	running = iota
	// quiet: the schedule is over and every end completed: a slot counted without a live gate
	// is one a registration of unknown outcome took (it lapses at its deadline), no other.
	quiet
	// lapsed: every pending registration's deadline has passed: the quota counts exactly the
	// live gates.
	lapsed
)

// check checks the invariants on the stores as they are now (at when).
func (w *world) check(t failer, when int) {
	w.mu.Lock()
	handed := slices.Clone(w.handed)
	freezes := maps.Clone(w.freezes)
	instances := maps.Clone(w.instances)
	excused := maps.Clone(w.excused)
	w.mu.Unlock()
	final := when == lapsed
	now := time.Now()
	minted, endedRecords, bad := w.readRecords()
	fail := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }

	// Every signed key is claimed by exactly one instance: every key a credential was handed
	// out for, and every identity a registration bound, is claimed by the credential's
	// instance, and no claim is ever written twice.
	for k, n := range w.gates.keysUnder("nkey.") {
		if n > 1 {
			fail("claims: %s was written %d times; a claim is written once and never changes", k, n)
		}
	}
	holders := map[string]string{}
	holder := func(k string) string {
		if h, ok := holders[k]; ok {
			return h
		}
		holders[k] = w.holder(k)
		return holders[k]
	}
	for _, h := range handed {
		for _, c := range h.creds {
			if got := holder(c.key); got != h.iid {
				fail("claims: %s of %s handed out the %s credential of %s, which is claimed by %q", h.what, h.iid, c.duty, c.key, got)
			}
		}
		if strings.HasSuffix(h.what, "prepare") {
			for _, d := range subjects.StandingDuties {
				if got := holder(h.ids.Of(d)); got != h.iid {
					fail("claims: %s of %s registered %s as its %s, which is claimed by %q", h.what, h.iid, h.ids.Of(d), d, got)
				}
			}
		}
	}

	// A key signed by a mint that was discarded before its commit claimed it may stay
	// unclaimed: no credential of it was handed out (an end of its instance claims it then).
	if when != running {
		for _, byKey := range minted {
			for k := range byKey {
				if holder(k) == "" {
					count("a signed key of a discarded mint was claimed by no instance")
				}
			}
		}
	}

	// Every credential handed out has a minted record under its own instance that names it
	// and stays in the stream past its expiry.
	for _, h := range handed {
		for _, c := range h.creds {
			if !slices.ContainsFunc(minted[h.iid][c.key], func(r onRecord) bool { return r.Duty == c.duty && r.stays >= c.exp }) {
				fail("minted: %s of %s handed out the %s credential of %s (exp %d) with no minted record of it under %s (records: %v)",
					h.what, h.iid, c.duty, c.key, c.exp, h.iid, minted[h.iid][c.key])
			}
		}
	}

	// No credential is committed after a fence that forbids it: each committed on its gate at a
	// revision where the gate was open, at its epoch, for its lifecycle and identities, before
	// any freeze; a run's also on its run fence at its hold; a supervised one within its
	// assignment.
	for _, h := range handed {
		hist := w.gates.history(subjects.GateKey(subjects.GateEndpointManager, h.iid))
		i := slices.IndexFunc(hist, func(wr write) bool { return wr.rev == h.gateRev })
		if i < 0 {
			fail("fences: %s of %s says it committed at gate revision %d, where its gate was never written", h.what, h.iid, h.gateRev)
			continue
		}
		row, err := w.parseGate(hist[i])
		switch {
		case err != nil:
			fail("fences: the gate of %s at revision %d does not parse: %v", h.iid, h.gateRev, err)
			continue
		case row.State != issue.GateOpen:
			fail("fences: %s of %s committed at gate revision %d, where its gate was %s", h.what, h.iid, h.gateRev, row.State)
		case row.ProcessEpoch != h.epoch:
			fail("fences: %s of %s at epoch %d committed at gate revision %d, at epoch %d", h.what, h.iid, h.epoch, h.gateRev, row.ProcessEpoch)
		case row.Registration == nil || row.Registration.LifecycleUID != h.uid || row.Registration.IdentitiesDigest != manager.IdentitiesDigest(h.ids):
			fail("fences: %s of %s committed at gate revision %d, registered to another lifecycle or other identities", h.what, h.iid, h.gateRev)
		}
		for _, later := range hist[i+1:] {
			if r, err := w.parseGate(later); err == nil && r.State != issue.GateOpen {
				if later.rev <= h.gateRev {
					fail("fences: %s of %s committed at gate revision %d, after the gate was %s at %d", h.what, h.iid, h.gateRev, r.State, later.rev)
				}
				break
			}
		}
		if f, ok := freezes[h.iid]; ok && h.gateRev >= f {
			fail("fences: %s of %s committed at gate revision %d, at or after its end froze the gate at %d", h.what, h.iid, h.gateRev, f)
		}
		for _, c := range h.creds {
			if row.SupervisedUntil != 0 && c.exp > row.SupervisedUntil {
				fail("fences: %s of %s handed out a %s credential expiring at %d, past the supervised gate's end %d", h.what, h.iid, c.duty, c.exp, row.SupervisedUntil)
			}
			if h.until != 0 && c.exp > h.until {
				fail("fences: %s of %s under an assignment ending at %d handed out a %s credential expiring at %d", h.what, h.iid, h.until, c.duty, c.exp)
			}
		}
		if h.runID == "" {
			continue
		}
		rh := w.gates.history(subjects.RunFenceKey(h.runID))
		j := slices.IndexFunc(rh, func(wr write) bool { return wr.rev == h.runFenceRev })
		if j < 0 {
			fail("fences: the attempt of %s on %s says it committed at run fence revision %d, where the fence was never written", h.iid, h.runID, h.runFenceRev)
			continue
		}
		var rf storedRunFence
		if err := json.Unmarshal(rh[j].value, &rf); err != nil {
			fail("fences: the run fence of %s at %d does not decode: %v", h.runID, h.runFenceRev, err)
			continue
		}
		if rf.Revoked || rf.InstanceID != h.iid || rf.Holder != h.hold.Holder || rf.TakeoverID != h.hold.TakeoverID || rf.Epoch != h.hold.Epoch ||
			rf.FencingToken != h.hold.FencingToken || rf.DriverID != h.hold.DriverID || rf.MediatorID != h.hold.MediatorID {
			fail("fences: the attempt of %s on %s committed at run fence revision %d, where the fence holds %+v, not its hold %+v", h.iid, h.runID, h.runFenceRev, rf, h.hold)
		}
	}
	// A gate goes open → frozen → retired, never back; its epoch never goes back.
	for iid := range instances {
		var prev *issue.GateRow
		for _, wr := range w.gates.history(subjects.GateKey(subjects.GateEndpointManager, iid)) {
			row, err := w.parseGate(wr)
			if err != nil {
				fail("fences: the gate of %s at %d does not parse: %v", iid, wr.rev, err)
				break
			}
			if prev != nil && (stateOrder[row.State] < stateOrder[prev.State] || row.ProcessEpoch < prev.ProcessEpoch || row.Principal != prev.Principal) {
				fail("fences: the gate of %s went from %s at epoch %d (%s) to %s at epoch %d (%s) at revision %d",
					iid, prev.State, prev.ProcessEpoch, prev.Principal, row.State, row.ProcessEpoch, row.Principal, wr.rev)
			}
			prev = &row
		}
	}

	// A run fence's epoch and fencing token go forward at each takeover and stay put
	// otherwise, and a revoked fence stays revoked.
	for key := range w.gates.keysUnder("runfence.") {
		var prev *storedRunFence
		for _, wr := range w.gates.history(key) {
			var rf storedRunFence
			if err := json.Unmarshal(wr.value, &rf); err != nil {
				fail("fences: %s at %d does not decode: %v", key, wr.rev, err)
				break
			}
			takeover := prev != nil && rf.TakeoverID != prev.TakeoverID
			if prev != nil && (takeover && (rf.Epoch <= prev.Epoch || rf.FencingToken <= prev.FencingToken) ||
				!takeover && (rf.Epoch != prev.Epoch || rf.FencingToken != prev.FencingToken) || prev.Revoked && !rf.Revoked) {
				fail("fences: %s went from epoch %d, fencing token %d (revoked %v) to epoch %d, fencing token %d (revoked %v) at %d",
					key, prev.Epoch, prev.FencingToken, prev.Revoked, rf.Epoch, rf.FencingToken, rf.Revoked, wr.rev)
			}
			prev = &rf
		}
	}

	// An assignment goes assigned → ending → ended, and only an ended one is replaced.
	type lc struct{ owner, iid, uid string }
	ended := map[lc]bool{}
	for _, o := range owners {
		var prev *supervisor.Assignment
		for _, wr := range w.platform.history(subjects.AssignmentKey(o)) {
			var a supervisor.Assignment
			if err := json.Unmarshal(wr.value, &a); err != nil {
				fail("assignments: the row of %s at %d does not decode: %v", o, wr.rev, err)
				break
			}
			same := prev != nil && prev.InstanceID == a.InstanceID && prev.LifecycleUID == a.LifecycleUID
			switch {
			case prev == nil:
			case same && stateOrder[a.State] < stateOrder[prev.State]:
				fail("assignments: the assignment of %s went from %s back to %s at %d", o, prev.State, a.State, wr.rev)
			case !same && prev.State != supervisor.StateEnded:
				fail("assignments: the %s assignment of %s (%s) was replaced by another lifecycle's at %d", prev.State, o, prev.InstanceID, wr.rev)
			}
			if a.State == supervisor.StateEnded {
				ended[lc{o, a.InstanceID, a.LifecycleUID}] = true
			}
			prev = &a
		}
	}

	// Every credential is signed by its instance's own key (with the operator signing key) or
	// by the data account's (without it). Every ended lifecycle's instance key is off the set,
	// or its keys recorded unrevocable, until every credential it signed has expired.
	set := w.signerSet()
	for _, h := range handed {
		want := w.own
		if w.cfg.signer {
			want = w.signerOf(h.iid)
		}
		for _, c := range h.creds {
			if c.signer != want {
				fail("signers: the %s credential of %s (%s) was signed by %s, want %s", c.duty, h.iid, c.key, c.signer, want)
			}
		}
	}
	for l := range ended {
		unrevocable := map[string]bool{}
		for _, d := range endedRecords {
			if d.Assignment.InstanceID == l.iid && d.Assignment.LifecycleUID == l.uid {
				for _, k := range d.Unrevoked {
					unrevocable[k] = true
				}
			}
		}
		_, live := set[l.iid]
		for _, h := range handed {
			if h.iid != l.iid {
				continue
			}
			for _, c := range h.creds {
				switch {
				case c.signer == w.signerOf(l.iid) && !live:
					count("an ended lifecycle's key was off the set")
				case unrevocable[c.key]:
					count("an ended lifecycle's key was recorded unrevocable")
				case c.exp <= now.Unix():
					count("an ended lifecycle's credential had expired")
				default:
					fail("revocation: the %s credential of %s (%s, exp %s) of the ended lifecycle %s/%s is live, and its signing key is on the set (%v) or not its instance's, and it is not recorded unrevocable (ended records of it: %d)",
						c.duty, l.iid, c.key, time.Unix(c.exp, 0).UTC().Format(time.RFC3339), l.owner, l.uid, live, countEnded(endedRecords, l.iid, l.uid))
				}
			}
		}
	}
	if when != running && w.cfg.signer && !w.cfg.brokerDown {
		// With the signing key and a broker that answers, the broker lists no key off the set.
		listed := w.broker.signers()
		for pub := range listed {
			if pub == w.own {
				continue
			}
			if !slices.ContainsFunc(slices.Collect(maps.Keys(set)), func(iid string) bool { return w.signerOf(iid) == pub }) {
				fail("revocation: the broker lists signing key %s, of no instance on the set (%d live)", pub, len(set))
			}
		}
	}

	// Quota counts equal live gates.
	for _, o := range owners {
		var row storedInstances
		if e, err := w.gates.KV.Get(context.Background(), subjects.InstancesKey(o)); err == nil {
			if err := json.Unmarshal(e.Value, &row); err != nil {
				fail("quota: the instances row of %s does not decode: %v", o, err)
			}
		}
		live, counted := map[string]bool{}, map[string]bool{}
		gates := map[string]*issue.GateRow{}
		for iid, owner := range instances {
			e, err := w.gates.KV.Get(context.Background(), subjects.GateKey(subjects.GateEndpointManager, iid))
			if err != nil {
				continue
			}
			g, err := issue.ParseGate(e.Value)
			if err != nil {
				continue
			}
			gates[iid] = &g
			if owner == o && g.Principal == subjects.Principal(o, subjects.ServeActor(iid)) && g.State != issue.GateRetired {
				live[iid] = true
			}
		}
		for _, iid := range row.IDs {
			if g := gates[iid]; g != nil {
				counted[iid] = g.State != issue.GateRetired
				continue
			}
			counted[iid] = slices.ContainsFunc(row.Pending, func(p struct {
				InstanceID string `json:"instanceId"`
				Until      int64  `json:"until"`
			}) bool {
				return p.InstanceID == iid && p.Until > now.UnixMilli()
			})
		}
		n := 0
		for iid, c := range counted {
			if c {
				n++
			}
			if (final || when == quiet && !excused[iid]) && c && !live[iid] {
				fail("quota: owner %s's instances row counts %s, which has no live gate (its registration's outcome was known)", o, iid)
			}
		}
		for iid := range live {
			if !counted[iid] {
				fail("quota: owner %s's instance %s has a live gate its instances row does not count", o, iid)
			}
		}
		if len(live) > w.cfg.quota {
			fail("quota: owner %s has %d live gates, past its quota of %d", o, len(live), w.cfg.quota)
		}
		if final && n != len(live) {
			fail("quota: owner %s's instances row counts %d, and it has %d live gates", o, n, len(live))
		}
	}
	if len(bad) > 0 {
		slices.Sort(bad)
		t.Fatalf("%s\n(%s)\n%s", strings.Join(slices.Compact(bad), "\n"), w.cfg, w.traced())
	}
}

func countEnded(records []audit.Decision, iid, uid string) int {
	n := 0
	for _, d := range records {
		if d.Assignment.InstanceID == iid && d.Assignment.LifecycleUID == uid {
			n++
		}
	}
	return n
}
