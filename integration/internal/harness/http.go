package harness

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/cotal-ai/authplane/internal/testkit"
)

// ReadBody reads and closes an HTTP response's body.
func ReadBody(t testing.TB, resp *http.Response) []byte {
	t.Helper()
	raw, err := io.ReadAll(resp.Body)
	if cerr := resp.Body.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// Health GETs /health of the plane at url and returns its status and body.
func Health(t testing.TB, url string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Get(url + "/health")
	if err != nil {
		t.Fatalf("GET /health: %v", err)
	}
	var got map[string]any
	if err := json.Unmarshal(ReadBody(t, resp), &got); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, got
}

// WaitUnhealthy polls /health until it answers 503 with a reason that contains want.
func WaitUnhealthy(t testing.TB, url, want string) {
	t.Helper()
	testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		status, got := Health(t, url)
		if reason, _ := got["reason"].(string); status != http.StatusServiceUnavailable || got["ok"] != false || !strings.Contains(reason, want) {
			return fmt.Errorf("GET /health: got %d %v, want 503 {ok:false} with a reason about %q", status, got, want)
		}
		return nil
	})
}

// Scrape reads the loopback face's /metrics as Prometheus would.
func Scrape(t testing.TB, httpURL string) map[string]*dto.MetricFamily {
	t.Helper()
	r := Get(t, httpURL+"/metrics")
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

// Sample is the value of the sample of family name whose labels are exactly labels (0 when
// there is none); a histogram's value is its count.
func Sample(families map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
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
