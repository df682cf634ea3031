package faces

import (
	"net/http"
	"testing"

	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/idp/idptest"
	"github.com/cotal-ai/authplane/subjects"
)

// After a known sequence of calls, /metrics counts each by endpoint, kind and code, times
// them, counts the credentials issued by duty, and reports the epoch and that the plane is
// not fenced; the public face does not serve it.
func TestMetricsCountAKnownSequenceOfCalls(t *testing.T) {
	t.Parallel()
	p := harness.StartFacesPlane(t, idptest.New(t), nil)
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
		{"authplane_requests_total", map[string]string{"endpoint": ma, "kind": "manager-service-authority", "code": "permission-denied"}, 2},
		{"authplane_requests_total", map[string]string{"endpoint": ma, "kind": "none", "code": "bad-request"}, 1},
		{"authplane_requests_total", map[string]string{"endpoint": ma, "kind": "manager-service-authority", "code": "ok"}, 1},
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
