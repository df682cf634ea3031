package races

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/capability/supervisor"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// normalized is an end report with its lifecycle's own names (owner, instance, lifecycle,
// generations, keys by duty, revision) replaced by placeholders: what two ends of two
// lifecycles must share.
func normalized(t testing.TB, s *harness.Supervised, r *client.EndReport) string {
	t.Helper()
	byKey := map[string]string{}
	for _, d := range subjects.StandingDuties {
		byKey[s.M.Pub(t, d)] = "KEY-" + string(d)
	}
	shown := *r
	shown.Revoked.NKeys = nil
	for _, k := range r.Revoked.NKeys {
		shown.Revoked.NKeys = append(shown.Revoked.NKeys, byKey[k])
	}
	slices.Sort(shown.Revoked.NKeys) // sorted by key, they differ in order from one manager to another
	data, err := json.Marshal(shown)
	if err != nil {
		t.Fatal(err)
	}
	out := string(data)
	names := []string{s.Owner, "OWNER", s.M.Iid, "INSTANCE", s.M.Uid, "LIFECYCLE",
		fmt.Sprintf(`"revision":%d`, r.Assignment.Revision), `"revision":"R"`}
	for _, g := range r.Retired.Generations {
		names = append(names, g.Generation, "GEN-"+g.Duty)
	}
	return strings.NewReplacer(names...).Replace(out)
}

// finalState describes, from the stores, where s's end left it: the gate, the assignment, the
// generations' attempts, and whether its signing key is live.
func finalState(t testing.TB, p *harness.TestPlane, s *harness.Supervised, r *client.EndReport) string {
	t.Helper()
	var g issue.GateRow
	harness.ReadRecord(t, p, subjects.AuthBucket(harness.TestSpace), "$KV."+subjects.AuthBucket(harness.TestSpace)+"."+subjects.GateKey(subjects.GateEndpointManager, s.M.Iid), &g)
	opOK := g.Op != nil && g.Op.Kind == issue.OpRetirement && g.Op.OpID == issue.RetirementOpID(s.M.Uid)
	var a client.Assignment
	harness.ReadRecord(t, p, subjects.PlatformBucket(harness.TestSpace), "$KV."+subjects.PlatformBucket(harness.TestSpace)+"."+subjects.AssignmentKey(s.Owner), &a)
	state := fmt.Sprintf("gate %s (its end's op: %v), assignment %s", g.State, opOK, a.State)
	for _, gen := range r.Retired.Generations {
		var at struct {
			State string `json:"state"`
		}
		key := subjects.AttemptKey(subjects.EvidenceKey(s.Owner, subjects.DutyActor(subjects.Duty(gen.Duty), s.M.Iid, ""), s.M.Uid, gen.Generation))
		harness.ReadRecord(t, p, subjects.IssuedBucket(harness.TestSpace), "$KV."+subjects.IssuedBucket(harness.TestSpace)+"."+key, &at)
		state += fmt.Sprintf(", %s generation %s", gen.Duty, at.State)
	}
	_, live := harness.LiveSigners(t, p)[s.M.Iid]
	return state + fmt.Sprintf(", its key on the signer set %v, listed at the broker %v", live, harness.Listed(t, p, s.M.Iid))
}

// TestARetriedEndCompletesAfterACrashAtEveryStep: an end stopped after step N (1 to 5) by a
// test hook, as a crash would stop it, is refused; its retry reaches the same final state as
// an uninterrupted end of another lifecycle, with the same reply, and evicts the supervisor.
func TestARetriedEndCompletesAfterACrashAtEveryStep(t *testing.T) {
	t.Parallel()
	for step := 1; step <= supervisor.EndSteps; step++ {
		t.Run(fmt.Sprintf("after step %d", step), func(t *testing.T) {
			t.Parallel()
			var crashAfter atomic.Int32 // the step the next end stops after; 0: none
			p := harness.StartPlane(t, func(c *service.Config) {
				c.Hooks = &service.Hooks{AfterEndStep: func(_ string, n int) error {
					if crashAfter.CompareAndSwap(int32(n), 0) {
						return errors.New("crashed (test hook)")
					}
					return nil
				}}
			})
			pa := harness.NewPlatformAdmin(t, p, "admin")
			whole := pa.Assign(time.Now().Add(time.Hour))
			pa.Register(whole)
			wholeReport, err := pa.End(whole)
			if err != nil {
				t.Fatalf("the uninterrupted end: %v", err)
			}

			s := pa.Assign(time.Now().Add(time.Hour))
			pa.Register(s)
			sup := harness.WatchDuty(t, p.NATSURL(), s, subjects.DutySupervisor, s.Prep.Credentials["supervisor"].JWT)
			crashAfter.Store(int32(step))
			_, err = pa.End(s)
			harness.WantRefusalOf(t, "the crashed end", err, "unavailable", fmt.Sprintf("the end stopped after step %d of %d", step, supervisor.EndSteps))

			report, err := pa.End(s)
			if err != nil {
				t.Fatalf("the retried end: %v", err)
			}
			harness.WantEndReport(t, s, report, harness.IdentityKeys(t, s.M))
			if got, want := normalized(t, s, report), normalized(t, whole, wholeReport); got != want {
				t.Errorf("the retried end's reply:\n got %s\nwant %s (the uninterrupted end's)", got, want)
			}
			if got, want := finalState(t, p, s, report), finalState(t, p, whole, wholeReport); got != want {
				t.Errorf("the retried end's final state:\n got %s\nwant %s (the uninterrupted end's)", got, want)
			}
			sup.WantEvicted(t, subjects.DutySupervisor)
			again, err := pa.End(s)
			if err != nil || normalized(t, s, again) != normalized(t, s, report) {
				t.Errorf("a repeat: got %+v, %v; want the same reply", again, err)
			}
		})
	}
}
