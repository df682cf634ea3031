package integration

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/internal/audit"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// One owner's flood of successful exchanges is bounded in the audit stream as refusals are: 60
// full `exchanged` records in the minute (--audit-records), the rest counted in one
// `exchanged-summary` record for the minute and in the metric, and another owner's record
// written before the flood is still there.
func TestAFloodOfExchangesIsBoundedPerOwner(t *testing.T) {
	t.Parallel()
	f := startFaces(t, func(c *service.Config) { c.AuditBytes = 1 << 20; c.Rate = 0 })
	victim := humanOwner(t, f.testPlane, f.ip, "victim")
	grant(t, f.testPlane, victim, "cli")
	exchange(t, f.HTTPURL(), map[string]any{"idpToken": f.token(t, "victim", time.Hour), "actor": "cli"}, f.cap...)
	victimSubject := subjects.AuditSubject(testSpace, audit.Exchanged, victim, "cli")
	before, err := lastMsg(t, f.testPlane, subjects.AuditStream(testSpace), victimSubject)
	if err != nil {
		t.Fatal(err)
	}

	flooder := humanOwner(t, f.testPlane, f.ip, "flooder")
	grant(t, f.testPlane, flooder, "cli")
	flood := map[string]any{"idpToken": f.token(t, "flooder", time.Hour), "actor": "cli"}
	const sent = 200
	for range sent {
		exchange(t, f.HTTPURL(), flood, f.cap...)
	}
	info, err := streamInfo(t, f.testPlane, subjects.AuditStream(testSpace))
	if err != nil {
		t.Fatal(err)
	}
	full := info.State.Subjects[subjects.AuditSubject(testSpace, audit.Exchanged, flooder, "cli")]
	if full != 60 {
		t.Errorf("got %d full exchanged records of the flooding owner in the minute, want 60", full)
	}

	// The minute ends (on the plane's clock); the owner's next record brings its summary.
	f.clock.advance(time.Minute + time.Second)
	exchange(t, f.HTTPURL(), flood, f.cap...)
	var sum audit.Summary
	checkFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		m, err := lastMsg(t, f.testPlane, subjects.AuditStream(testSpace), subjects.AuditSubject(testSpace, audit.Exchanged+"-summary", flooder, "_"))
		if err != nil {
			return err
		}
		return json.Unmarshal(m.Data, &sum)
	})
	if sum.Owner != flooder || sum.Counts[audit.Exchanged] != sent-60 {
		t.Errorf("the flooding owner's summary: got %+v, want %d exchanges counted for %s", sum, sent-60, flooder)
	}
	if n := sample(scrape(t, f.HTTPURL()), "authplane_audit_summarized_total", map[string]string{"decision": audit.Exchanged}); n != sent-60 {
		t.Errorf("authplane_audit_summarized_total{decision=exchanged}: got %v, want %d", n, sent-60)
	}
	after, err := lastMsg(t, f.testPlane, subjects.AuditStream(testSpace), victimSubject)
	if err != nil || after.Sequence != before.Sequence {
		t.Errorf("the other owner's record after the flood: got %v, %v; want it still at %d", after, err, before.Sequence)
	}
	t.Logf("%d exchanges: %d full records, the rest in the summary %+v", sent, full, sum.Counts)
}
