package documents

import (
	"regexp"
	"strings"
	"testing"

	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/subjects"
)

// documentedMetric is a family named in docs/OPERATIONS.md's table of series.
var documentedMetric = regexp.MustCompile("`(authplane_[a-z_]+)")

// Every family of the plane's own that /metrics serves is in the table of docs/OPERATIONS.md's
// "Read the metrics", and every family the table names is served.
func TestOperationsDocumentsEveryMetricServedAndNoOther(t *testing.T) {
	t.Parallel()
	doc := readDoc(t, "docs/OPERATIONS.md")
	_, section, ok := strings.Cut(doc, "\n## Read the metrics\n")
	if !ok || !strings.Contains(section, "| series |") {
		t.Fatal("docs/OPERATIONS.md has no section \"Read the metrics\" with its table of series")
	}
	table := section[strings.Index(section, "| series |"):]
	table = table[:strings.Index(table, "\n\n")]
	documented := map[string]bool{}
	for _, row := range strings.Split(table, "\n") {
		if cells := strings.Split(row, "|"); strings.HasPrefix(row, "| `") && len(cells) > 2 {
			for _, m := range documentedMetric.FindAllStringSubmatch(cells[1], -1) {
				documented[m[1]] = true
			}
		}
	}
	p := harness.StartPlane(t, nil)
	// One call: an endpoint's latency is served from its first call on.
	if o := harness.Ask(t, harness.CallerConn(t, p, harness.OwnerA, "cli"), harness.OwnerA, "cli", subjects.EndpointManagerAuthority, "{}"); o.Code != "bad-request" {
		t.Fatalf("an empty body: got %q, want bad-request", o.Code)
	}
	served := map[string]bool{}
	for name := range harness.Scrape(t, p.HTTPURL()) {
		if strings.HasPrefix(name, "authplane_") {
			served[name] = true
		}
	}
	for name := range served {
		if !documented[name] {
			t.Errorf("/metrics serves %s, which docs/OPERATIONS.md's table of series does not document", name)
		}
	}
	for name := range documented {
		if !served[name] {
			t.Errorf("docs/OPERATIONS.md documents %s, which /metrics does not serve", name)
		}
	}
	if len(served) == 0 {
		t.Error("/metrics serves no family of the plane's own")
	}
}
