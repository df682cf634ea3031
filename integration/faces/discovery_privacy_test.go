package faces

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/micro"

	"github.com/cotal-ai/authplane/handlers"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/subjects"
)

// An ops credential's `$SRV.STATS` counts every refusal but quotes none: each endpoint's data
// keeps its last error, and a refusal's message quotes its caller (its principal, the values
// it sent). The caller itself still gets the whole message, in the
// `Nats-Service-Error` header and the body. Before, ownerA's ops view showed ownerB's refusal
// text word for word.
func TestSRVStatsCountsRefusalsButShowsNoCallersText(t *testing.T) {
	t.Parallel()
	p := harness.StartPlane(t, nil)
	const marker = "zz_only_ownerB_sent_this"
	victim := harness.CallerConn(t, p, harness.OwnerB, "cli")
	var refusals []harness.Outcome
	for _, body := range []any{`{"kind":"` + marker + `"}`, harness.NewManagerKeys(t).Body(t, "prepare", "cli")} {
		o := harness.Ask(t, victim, harness.OwnerB, "cli", subjects.EndpointManagerAuthority, body)
		if o.Code == "" {
			t.Fatalf("%.80v: got no refusal, want one", body)
		}
		if got, want := o.Msg.Header.Get(micro.ErrorHeader), o.Code+": "+o.Message; got != want {
			t.Errorf("the caller's %s header: got %q, want %q", micro.ErrorHeader, got, want)
		}
		refusals = append(refusals, o)
	}
	if !strings.Contains(refusals[0].Message, marker) || !strings.Contains(refusals[1].Message, harness.OwnerB) {
		t.Fatalf("the refusals %q, %q: want them to quote the caller (else this test proves nothing)", refusals[0].Message, refusals[1].Message)
	}

	errorsSeen := uint64(0)
	stats := harness.PlaneStats(t, p)
	raw, err := json.Marshal(stats)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), marker) || strings.Contains(string(raw), harness.OwnerB) {
		t.Errorf("ownerA's ops view of $SRV.STATS shows ownerB's refusal: %.400s", raw)
	}
	for _, e := range stats.Endpoints {
		var d handlers.Counters
		if err := json.Unmarshal(e.Data, &d); err != nil {
			t.Fatal(err)
		}
		errorsSeen += d.Errors
		if d.Errors > 0 && !strings.HasPrefix(d.LastError, "4") {
			t.Errorf("endpoint %s: data.last_error %q, want the refusal's code", e.Name, d.LastError)
		}
	}
	if errorsSeen != uint64(len(refusals)) {
		t.Errorf("$SRV.STATS: got %d errors counted, want the %d refusals", errorsSeen, len(refusals))
	}
}
