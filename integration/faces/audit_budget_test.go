package faces

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/core/audit"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// One owner's flood of successful exchanges is bounded in the audit stream as refusals are: 60
// full `exchanged` records in the minute (--audit-records), the rest counted in one
// `exchanged-summary` record for the minute and in the metric, and another owner's record
// written before the flood is still there.
func TestAFloodOfExchangesIsBoundedPerOwner(t *testing.T) {
	t.Parallel()
	f := harness.StartFaces(t, func(c *service.Config) { c.AuditBytes = 1 << 20; c.Rate = 0 })
	victim := harness.HumanOwner(t, f.TestPlane, f.Ip, "victim")
	harness.Grant(t, f.TestPlane, victim, "cli")
	harness.Exchange(t, f.HTTPURL(), map[string]any{"idpToken": f.Token(t, "victim", time.Hour), "actor": "cli"}, f.Cap...)
	victimSubject := subjects.AuditSubject(harness.TestSpace, audit.Exchanged, victim, "cli")
	before, err := harness.LastMsg(t, f.TestPlane, subjects.AuditStream(harness.TestSpace), victimSubject)
	if err != nil {
		t.Fatal(err)
	}

	flooder := harness.HumanOwner(t, f.TestPlane, f.Ip, "flooder")
	harness.Grant(t, f.TestPlane, flooder, "cli")
	flood := map[string]any{"idpToken": f.Token(t, "flooder", time.Hour), "actor": "cli"}
	const sent = 200
	for range sent {
		harness.Exchange(t, f.HTTPURL(), flood, f.Cap...)
	}
	info, err := harness.StreamInfo(t, f.TestPlane, subjects.AuditStream(harness.TestSpace))
	if err != nil {
		t.Fatal(err)
	}
	full := info.State.Subjects[subjects.AuditSubject(harness.TestSpace, audit.Exchanged, flooder, "cli")]
	if full != 60 {
		t.Errorf("got %d full exchanged records of the flooding owner in the minute, want 60", full)
	}

	// The minute ends (on the plane's clock); the owner's next record brings its summary.
	f.Clock.Advance(time.Minute + time.Second)
	harness.Exchange(t, f.HTTPURL(), flood, f.Cap...)
	var sum audit.Summary
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		m, err := harness.LastMsg(t, f.TestPlane, subjects.AuditStream(harness.TestSpace), subjects.AuditSubject(harness.TestSpace, audit.Exchanged+"-summary", flooder, "_"))
		if err != nil {
			return err
		}
		return json.Unmarshal(m.Data, &sum)
	})
	if sum.Owner != flooder || sum.Counts[audit.Exchanged] != sent-60 {
		t.Errorf("the flooding owner's summary: got %+v, want %d exchanges counted for %s", sum, sent-60, flooder)
	}
	if n := harness.Sample(harness.Scrape(t, f.HTTPURL()), "authplane_audit_summarized_total", map[string]string{"decision": audit.Exchanged}); n != sent-60 {
		t.Errorf("authplane_audit_summarized_total{decision=exchanged}: got %v, want %d", n, sent-60)
	}
	after, err := harness.LastMsg(t, f.TestPlane, subjects.AuditStream(harness.TestSpace), victimSubject)
	if err != nil || after.Sequence != before.Sequence {
		t.Errorf("the other owner's record after the flood: got %v, %v; want it still at %d", after, err, before.Sequence)
	}
	t.Logf("%d exchanges: %d full records, the rest in the summary %+v", sent, full, sum.Counts)
}
