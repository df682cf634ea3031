package faces

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	dto "github.com/prometheus/client_model/go"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/core/audit"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// logged starts a plane whose log the test reads.
func logged(t *testing.T, mutate func(*service.Config)) (*harness.TestPlane, *harness.SyncBuffer, string) {
	t.Helper()
	var log harness.SyncBuffer
	dir := t.TempDir()
	p := harness.StartPlane(t, func(c *service.Config) {
		c.Dir = dir
		c.Logger = slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))
		if mutate != nil {
			mutate(c)
		}
	})
	return p, &log, dir
}

// has reports whether family name has a series with exactly labels.
func has(families map[string]*dto.MetricFamily, name string, labels map[string]string) bool {
	f, ok := families[name]
	if !ok {
		return false
	}
	for _, m := range f.Metric {
		if len(m.Label) != len(labels) {
			continue
		}
		match := true
		for _, l := range m.Label {
			match = match && labels[l.GetName()] == l.GetValue()
		}
		if match {
			return true
		}
	}
	return false
}

// TestEverySeriesExistsFromTheStartAndNoLabelIsEmpty scrapes a plane that has served nothing:
// the series an operator alerts on are there at 0 (reconnects of every connection, discarded
// mints, every endpoint's unavailable answers), and no series of the plane's carries an empty
// label.
func TestEverySeriesExistsFromTheStartAndNoLabelIsEmpty(t *testing.T) {
	t.Parallel()
	p, _, _ := logged(t, nil)
	families := harness.Scrape(t, p.HTTPURL())
	for _, want := range []struct {
		name   string
		labels map[string]string
	}{
		{"authplane_nats_reconnects_total", map[string]string{"conn": "store"}},
		{"authplane_nats_reconnects_total", map[string]string{"conn": "serving"}},
		{"authplane_nats_reconnects_total", map[string]string{"conn": "system"}},
		{"authplane_nats_reconnects_total", map[string]string{"conn": "callout"}},
		{"authplane_mints_discarded_total", map[string]string{"endpoint": subjects.EndpointManagerAuthority, "code": "conflict"}},
		{"authplane_credentials_issued_total", map[string]string{"endpoint": subjects.EndpointManagerAuthority, "duty": "driver"}},
		{"authplane_requests_total", map[string]string{"endpoint": subjects.EndpointSupervisorEnd, "code": "unavailable"}},
		{"authplane_requests_total", map[string]string{"endpoint": "auth-callout", "code": "internal"}},
		{"authplane_requests_total", map[string]string{"endpoint": subjects.EndpointRunRevoke, "code": "ok"}},
	} {
		if !has(families, want.name, want.labels) {
			t.Errorf("/metrics of a fresh plane: no %s%v, want it at 0", want.name, want.labels)
		} else if v := harness.Sample(families, want.name, want.labels); v != 0 {
			t.Errorf("/metrics of a fresh plane: %s%v is %v, want 0", want.name, want.labels, v)
		}
	}
	// A call refused before its body parsed.
	o := harness.Ask(t, harness.CallerConn(t, p, harness.OwnerA, "cli"), harness.OwnerA, "cli", subjects.EndpointManagerAuthority, `{"kind":`)
	if o.Code != "bad-request" {
		t.Fatalf("a body that is not JSON: got %q %q", o.Code, o.Message)
	}
	for name, f := range harness.Scrape(t, p.HTTPURL()) {
		if !strings.HasPrefix(name, "authplane_") {
			continue
		}
		for _, m := range f.Metric {
			for _, l := range m.Label {
				if l.GetValue() == "" {
					t.Errorf("%s has label %s empty: %v", name, l.GetName(), m.Label)
				}
			}
		}
	}
	if v := harness.Sample(harness.Scrape(t, p.HTTPURL()), "authplane_requests_total", map[string]string{"endpoint": subjects.EndpointManagerAuthority, "code": "bad-request"}); v != 1 {
		t.Errorf("a body that is not JSON: requests_total{code=bad-request} is %v, want 1", v)
	}
}

// TestHTTPRefusalsBeforeTheBodyAreCountedAndLogged: a loopback /exchange without the
// capability, a wrong content type, a wrong method and an unknown path are each counted (on
// endpoint http, by code) and logged, with nothing of the caller's but the path.
func TestHTTPRefusalsBeforeTheBodyAreCountedAndLogged(t *testing.T) {
	t.Parallel()
	p, log, _ := logged(t, nil)
	for _, c := range []struct {
		name   string
		do     func() harness.Reply
		status int
		code   string
	}{
		{"a missing capability", func() harness.Reply { return harness.Post(t, p.HTTPURL()+"/exchange", "{}") }, http.StatusUnauthorized, "unauthenticated"},
		{"a wrong content type", func() harness.Reply {
			req, err := http.NewRequest(http.MethodPost, p.HTTPURL()+"/exchange", strings.NewReader("{}"))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "text/plain")
			return harness.Do(t, req)
		}, http.StatusUnsupportedMediaType, "unsupported-media-type"},
		{"a wrong method", func() harness.Reply { return harness.Get(t, p.HTTPURL()+"/exchange") }, http.StatusMethodNotAllowed, "method-not-allowed"},
		{"an unknown path", func() harness.Reply { return harness.Get(t, p.HTTPURL()+"/nope") }, http.StatusNotFound, "not-found"},
	} {
		if r := c.do(); r.Status != c.status {
			t.Fatalf("%s: got %d %s, want %d", c.name, r.Status, r.Body, c.status)
		}
		labels := map[string]string{"endpoint": "http", "code": c.code}
		if v := harness.Sample(harness.Scrape(t, p.HTTPURL()), "authplane_requests_total", labels); v != 1 {
			t.Errorf("%s: requests_total%v is %v, want 1", c.name, labels, v)
		}
		if !strings.Contains(log.String(), `msg="refused by the HTTP face"`) || !strings.Contains(log.String(), "code="+c.code) {
			t.Errorf("%s: want a log line of the refusal, got:\n%s", c.name, log.String())
		}
	}
}

// TestAdmissionsAndRevocationsAreLoggedAndRecorded: a run's admission and its revocation are
// decisions like a mint: each is one log line and one record in the audit stream, naming the
// caller, the instance and the run (the run-start it came from; the reason that stands).
func TestAdmissionsAndRevocationsAreLoggedAndRecorded(t *testing.T) {
	t.Parallel()
	p, log, _ := logged(t, nil)
	env := harness.NewRunEnv(t, p)
	runID := env.Admitted()
	if _, err := env.Cli.Revoke(env.Ctx(), env.M.Manager, env.Cur, runID, "stopped by its owner"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ decision, field, want string }{
		{audit.Admitted, "subject", "run-start"},
		{audit.Revoked, "message", "stopped by its owner"},
	} {
		var rec map[string]any
		harness.ReadRecord(t, p, subjects.AuditStream(harness.TestSpace), subjects.AuditSubject(harness.TestSpace, c.decision, harness.OwnerA, "cli"), &rec)
		if rec["decision"] != c.decision || rec["runId"] != runID || rec["instanceId"] != env.M.Iid || rec["caller"] != harness.OwnerA+".cli" ||
			!strings.Contains(rec[c.field].(string), c.want) {
			t.Errorf("the %s record: got %v, want run %s of instance %s by %s.cli with its %s", c.decision, rec, runID, env.M.Iid, harness.OwnerA, c.field)
		}
		if !strings.Contains(log.String(), "msg="+c.decision+" ") || !strings.Contains(log.String(), "run_id="+runID) {
			t.Errorf("want a %s log line for run %s, got:\n%s", c.decision, runID, log.String())
		}
	}
}

// TestCredsRecordsTheCredentialItWritesAndWritesNoneItCannotRecord: `authplane creds` writes
// a `minted` record of the key it signed (no instance, its role as the duty, its expiry) before
// the file; with no broker to record on, it writes no file.
func TestCredsRecordsTheCredentialItWritesAndWritesNoneItCannotRecord(t *testing.T) {
	t.Parallel()
	p := harness.StartPlane(t, nil)
	out := filepath.Join(t.TempDir(), "cli.creds")
	code, _, stderr := harness.RunAuthplane(t, time.Minute, "creds", "--space-dir", p.Info.SpaceDir, "--nats-url", p.NATSURL(),
		"--owner", harness.OwnerA, "--actor", "cli", "--out", out)
	if code != 0 {
		t.Fatalf("creds: exit %d\n%s", code, stderr)
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	token, err := jwt.ParseDecoratedJWT(raw)
	if err != nil {
		t.Fatal(err)
	}
	claims, err := jwt.DecodeUserClaims(token)
	if err != nil {
		t.Fatal(err)
	}
	var rec audit.Minted
	harness.ReadRecord(t, p, subjects.MintedStream(harness.TestSpace), subjects.MintedSubject(harness.TestSpace, "", []string{claims.Subject}), &rec)
	if rec.Endpoint != admin.EndpointCreds || rec.Caller != harness.OwnerA+".cli" || len(rec.Credentials) != 1 ||
		rec.Credentials[0] != (audit.Credential{Duty: "caller", NKey: claims.Subject, Exp: claims.Expires}) {
		t.Errorf("the creds' minted record: got %+v, want caller %s.cli, one credential of key %s until %d", rec, harness.OwnerA, claims.Subject, claims.Expires)
	}
	if js, err := json.Marshal(rec); err != nil || strings.Contains(string(js), token) {
		t.Errorf("the minted record holds the JWT: %s", js)
	}

	lost := filepath.Join(t.TempDir(), "lost.creds")
	code, _, stderr = harness.RunAuthplane(t, time.Minute, "creds", "--space-dir", p.Info.SpaceDir, "--nats-url", "nats://127.0.0.1:1",
		"--owner", harness.OwnerA, "--actor", "cli", "--out", lost)
	if code == 0 || !strings.Contains(stderr, "not written") {
		t.Errorf("creds with no broker: exit %d %q, want non-zero and that nothing was written", code, stderr)
	}
	if _, err := os.Stat(lost); !os.IsNotExist(err) {
		t.Errorf("creds with no broker wrote %s (%v)", lost, err)
	}
}
