package faces

import (
	"net/http"
	"strings"
	"testing"

	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/subjects"
)

// After a known sequence of calls, /metrics counts each by endpoint and code, times
// them, counts the credentials issued by duty, and reports the epoch and that the plane is
// not fenced; the public face does not serve it.
func TestMetricsCountAKnownSequenceOfCalls(t *testing.T) {
	t.Parallel()
	p := harness.StartFacesPlane(t, testkit.NewIdP(t), nil)
	cli := harness.CallerConn(t, p, harness.OwnerA, "cli")
	m := harness.NewManagerKeys(t)
	const ma = subjects.EndpointManagerAuthority

	for range 2 { // no scope yet
		if o := harness.Ask(t, cli, harness.OwnerA, "cli", ma, m.Body(t, "prepare", "cli")); o.Code != "permission-denied" {
			t.Fatalf("prepare without scope: got %q, want permission-denied", o.Code)
		}
	}
	if o := harness.Ask(t, cli, harness.OwnerA, "cli", ma, map[string]any{"kind": "nonsense"}); o.Code != "bad-request" {
		t.Fatalf("a bad kind: got %q, want bad-request", o.Code)
	}
	harness.Grant(t, p, harness.OwnerA, "cli", "supervise")
	harness.MustMint(t, cli, harness.OwnerA, "cli", m.Body(t, "prepare", "cli"))

	got := harness.Scrape(t, p.HTTPURL())
	for _, want := range []struct {
		name   string
		labels map[string]string
		value  float64
	}{
		{"authplane_requests_total", map[string]string{"endpoint": ma, "code": "permission-denied"}, 2},
		{"authplane_requests_total", map[string]string{"endpoint": ma, "code": "bad-request"}, 1},
		{"authplane_requests_total", map[string]string{"endpoint": ma, "code": "ok"}, 1},
		{"authplane_request_duration_seconds", map[string]string{"endpoint": ma}, 4},
		{"authplane_credentials_issued_total", map[string]string{"endpoint": ma, "duty": "supervisor"}, 1},
		{"authplane_credentials_issued_total", map[string]string{"endpoint": ma, "duty": "executor"}, 1},
		{"authplane_process_epoch", map[string]string{}, float64(p.Epoch())},
		{"authplane_fenced", map[string]string{}, 0},
	} {
		if v := harness.Sample(got, want.name, want.labels); v != want.value {
			t.Errorf("%s%v: got %v, want %v", want.name, want.labels, v, want.value)
		}
	}
	for _, name := range []string{"authplane_cas_retries_total", "authplane_kv_errors_total", "go_goroutines"} {
		if got[name] == nil {
			t.Errorf("/metrics has no %s", name)
		}
	}
	for _, m := range got["authplane_mints_discarded_total"].GetMetric() {
		if m.Counter.GetValue() != 0 {
			t.Errorf("discarded mints: got %v, want none", m)
		}
	}
	if r := harness.Get(t, p.PublicURL()+"/metrics"); r.Status != http.StatusNotFound {
		t.Errorf("the public face's /metrics: got %d, want 404", r.Status)
	}
}

// /metrics of a plane that has served nothing stays under 20 KB: its series are labelled by
// endpoint and code, and only the codes an alert reads exist before their first answer (an
// endpoint's latency appears with its first call).
func TestMetricsOfAFreshPlaneAreUnder20KB(t *testing.T) {
	t.Parallel()
	p := harness.StartPlane(t, nil)
	r := harness.Get(t, p.HTTPURL()+"/metrics")
	if r.Status != http.StatusOK {
		t.Fatalf("GET /metrics: got %d, want 200", r.Status)
	}
	if len(r.Body) >= 20_000 {
		t.Errorf("/metrics of a fresh plane: got %d bytes, want under 20 KB", len(r.Body))
	}
	lines := 0
	for _, line := range strings.Split(string(r.Body), "\n") {
		if strings.HasPrefix(line, "authplane_requests_total{") {
			lines++
		}
	}
	if want := 3 * (len(subjects.Endpoints) + 3); lines != want {
		t.Errorf("/metrics of a fresh plane: got %d series of authplane_requests_total, want %d (ok, unavailable and internal of each endpoint)", lines, want)
	}
}
