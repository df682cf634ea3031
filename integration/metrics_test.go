package integration

import (
	"bytes"
	"net/http"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/cotal-ai/authplane/internal/idp/idptest"
	"github.com/cotal-ai/authplane/subjects"
)

// scrape reads the loopback face's /metrics as Prometheus would.
func scrape(t testing.TB, httpURL string) map[string]*dto.MetricFamily {
	t.Helper()
	r := get(t, httpURL+"/metrics")
	if r.Status != http.StatusOK {
		t.Fatalf("GET /metrics: got %d %s, want 200", r.Status, r.Body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(r.Body))
	if err != nil {
		t.Fatalf("GET /metrics: %v\n%s", err, r.Body)
	}
	return families
}

// sample is the value of the sample of family name whose labels are exactly labels (0 when
// there is none); a histogram's value is its count.
func sample(families map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	f, ok := families[name]
	if !ok {
		return 0
	}
	for _, m := range f.Metric {
		if len(m.Label) != len(labels) {
			continue
		}
		match := true
		for _, l := range m.Label {
			if labels[l.GetName()] != l.GetValue() {
				match = false
			}
		}
		if !match {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	return 0
}

// After a known sequence of calls, /metrics counts each by endpoint, kind and code, times
// them, counts the credentials issued by duty, and reports the epoch and that the plane is
// not fenced; the public face does not serve it.
func TestMetricsCountAKnownSequenceOfCalls(t *testing.T) {
	t.Parallel()
	p := startFacesPlane(t, idptest.New(t), nil)
	cli := callerConn(t, p, ownerA, "cli")
	m := newManagerKeys(t)
	const ma = subjects.EndpointManagerAuthority

	for range 2 { // no scope yet
		if o := ask(t, cli, ownerA, "cli", ma, m.body(t, "prepare", "cli")); o.code != "permission-denied" {
			t.Fatalf("prepare without scope: got %q, want permission-denied", o.code)
		}
	}
	if o := ask(t, cli, ownerA, "cli", ma, map[string]any{"kind": "nonsense"}); o.code != "bad-request" {
		t.Fatalf("a bad kind: got %q, want bad-request", o.code)
	}
	grant(t, p, ownerA, "cli", "supervise")
	mustMint(t, cli, ownerA, "cli", m.body(t, "prepare", "cli"))

	got := scrape(t, p.HTTPURL())
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
		if v := sample(got, want.name, want.labels); v != want.value {
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
	if r := get(t, p.PublicURL()+"/metrics"); r.Status != http.StatusNotFound {
		t.Errorf("the public face's /metrics: got %d, want 404", r.Status)
	}
}
