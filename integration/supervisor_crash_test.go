package integration

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
	"github.com/cotal-ai/authplane/internal/gate"
	"github.com/cotal-ai/authplane/internal/supervisor"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// normalized is an end report with its lifecycle's own names (owner, instance, lifecycle,
// generations, keys by duty, revision) replaced by placeholders: what two ends of two
// lifecycles must share.
func normalized(t testing.TB, s *supervised, r *client.EndReport) string {
	t.Helper()
	byKey := map[string]string{}
	for _, d := range subjects.StandingDuties {
		byKey[s.m.pub(t, d)] = "KEY-" + string(d)
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
	names := []string{s.owner, "OWNER", s.m.iid, "INSTANCE", s.m.uid, "LIFECYCLE",
		fmt.Sprintf(`"revision":%d`, r.Assignment.Revision), `"revision":"R"`}
	for _, g := range r.Retired.Generations {
		names = append(names, g.Generation, "GEN-"+g.Duty)
	}
	return strings.NewReplacer(names...).Replace(out)
}

// finalState describes, from the stores, where s's end left it: the gate, the assignment, the
// generations' attempts, and which of its keys the revocation set holds.
func finalState(t testing.TB, p *testPlane, s *supervised, r *client.EndReport) string {
	t.Helper()
	var g gate.Row
	readRecord(t, p, subjects.AuthBucket(testSpace), "$KV."+subjects.AuthBucket(testSpace)+"."+subjects.GateKey(subjects.GateEndpointManager, s.m.iid), &g)
	opOK := g.Op != nil && g.Op.Kind == gate.OpRetirement && g.Op.OpID == gate.RetirementOpID(s.m.uid)
	var a client.Assignment
	readRecord(t, p, subjects.PlatformBucket(testSpace), "$KV."+subjects.PlatformBucket(testSpace)+"."+subjects.AssignmentKey(s.owner), &a)
	state := fmt.Sprintf("gate %s (its end's op: %v), assignment %s", g.State, opOK, a.State)
	for _, gen := range r.Retired.Generations {
		var at struct {
			State string `json:"state"`
		}
		key := subjects.AttemptKey(subjects.EvidenceKey(s.owner, subjects.DutyActor(subjects.Duty(gen.Duty), s.m.iid, ""), s.m.uid, gen.Generation))
		readRecord(t, p, subjects.IssuedBucket(testSpace), "$KV."+subjects.IssuedBucket(testSpace)+"."+key, &at)
		state += fmt.Sprintf(", %s generation %s", gen.Duty, at.State)
	}
	var set struct {
		Revoked map[string]int64 `json:"revoked"`
	}
	readRecord(t, p, subjects.AuthBucket(testSpace), "$KV."+subjects.AuthBucket(testSpace)+"."+subjects.RevocationsKey(p.Account()), &set)
	held := 0
	for _, k := range identityKeys(t, s.m) {
		if _, ok := set.Revoked[k]; ok {
			held++
		}
	}
	return state + fmt.Sprintf(", %d of its 5 keys on the revocation set", held)
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
			p := startPlane(t, func(c *service.Config) {
				c.Hooks = &service.Hooks{AfterEndStep: func(_ string, n int) error {
					if crashAfter.CompareAndSwap(int32(n), 0) {
						return errors.New("crashed (test hook)")
					}
					return nil
				}}
			})
			pa := newPlatformAdmin(t, p, "admin")
			whole := pa.assign(time.Now().Add(time.Hour))
			pa.register(whole)
			wholeReport, err := pa.end(whole)
			if err != nil {
				t.Fatalf("the uninterrupted end: %v", err)
			}

			s := pa.assign(time.Now().Add(time.Hour))
			pa.register(s)
			sup := watchDuty(t, p.NATSURL(), s, subjects.DutySupervisor, s.prep.Credentials["supervisor"].JWT)
			crashAfter.Store(int32(step))
			_, err = pa.end(s)
			wantRefusalOf(t, "the crashed end", err, "unavailable", fmt.Sprintf("the end stopped after step %d of %d", step, supervisor.EndSteps))

			report, err := pa.end(s)
			if err != nil {
				t.Fatalf("the retried end: %v", err)
			}
			wantEndReport(t, s, report, identityKeys(t, s.m))
			if got, want := normalized(t, s, report), normalized(t, whole, wholeReport); got != want {
				t.Errorf("the retried end's reply:\n got %s\nwant %s (the uninterrupted end's)", got, want)
			}
			if got, want := finalState(t, p, s, report), finalState(t, p, whole, wholeReport); got != want {
				t.Errorf("the retried end's final state:\n got %s\nwant %s (the uninterrupted end's)", got, want)
			}
			sup.wantEvicted(t, subjects.DutySupervisor)
			again, err := pa.end(s)
			if err != nil || normalized(t, s, again) != normalized(t, s, report) {
				t.Errorf("a repeat: got %+v, %v; want the same reply", again, err)
			}
		})
	}
}
