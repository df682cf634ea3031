package faces

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/subjects"
)

// An ops credential's `$SRV.STATS` counts every refusal but quotes none: micro keeps the
// description of an endpoint's last error, and a refusal's message quotes its caller (its
// principal, the values it sent). The caller itself still gets the whole message, in the
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

	errorsSeen := 0
	for _, m := range harness.CollectN(t, p.Ops(t), "$SRV.STATS."+subjects.ServiceName, nil, p.Workers, 3*time.Second) {
		if strings.Contains(string(m.Data), marker) || strings.Contains(string(m.Data), harness.OwnerB) {
			t.Errorf("ownerA's ops view of $SRV.STATS shows ownerB's refusal: %.400s", m.Data)
		}
		var stats micro.Stats
		if err := json.Unmarshal(m.Data, &stats); err != nil {
			t.Fatal(err)
		}
		for _, e := range stats.Endpoints {
			errorsSeen += e.NumErrors
			if e.NumErrors > 0 && !strings.HasPrefix(e.LastError, "4") {
				t.Errorf("endpoint %s: last_error %q, want the refusal's code", e.Name, e.LastError)
			}
		}
	}
	if errorsSeen != len(refusals) {
		t.Errorf("$SRV.STATS: got %d errors counted, want the %d refusals", errorsSeen, len(refusals))
	}
}
