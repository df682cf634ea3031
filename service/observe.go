package service

import (
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"sync"

	"github.com/cotal-ai/authplane/handlers"
	"github.com/cotal-ai/authplane/internal/core/audit"
	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/platform/conns"
	"github.com/cotal-ai/authplane/internal/platform/metrics"
	"github.com/cotal-ai/authplane/subjects"
)

// connRoles are the roles of the plane's own NATS connections, as the metrics name them.
var connRoles = []string{"store", "system", "serving", "callout"}

// series are the label values of the plane's metrics: every endpoint's calls of the codes an
// alert reads (docs/OPERATIONS.md, "Read the metrics"), the duties each minting endpoint issues,
// the connections.
func series() metrics.Series {
	alerted := []string{metrics.CodeOK, string(fault.Unavailable), string(fault.Internal)}
	codes := map[string][]string{}
	for _, e := range append(slices.Clone(subjects.Endpoints), handlers.EndpointExchange, handlers.EndpointManagerServiceAuthority, handlers.EndpointCallout) {
		codes[e] = alerted
	}
	var standing []string
	for _, d := range subjects.StandingDuties {
		standing = append(standing, string(d))
	}
	return metrics.Series{
		Codes: codes,
		Duties: map[string][]string{
			subjects.EndpointManagerAuthority:    append(append([]string{}, standing...), string(subjects.DutyDriver), string(subjects.DutyMediator)),
			subjects.EndpointSupervisorAuthority: standing,
			handlers.EndpointCallout:             {string(subjects.DutyCaller), string(subjects.DutyOps)},
		},
		// What a commit refuses: a store's answers, a revoked run, a claimed key.
		DiscardCodes: []string{string(fault.Conflict), string(fault.FailedPrecondition), string(fault.ResourceExhausted),
			string(fault.Internal), string(fault.Unavailable), string(fault.PermissionDenied), string(fault.AlreadyExists)},
		Conns:             connRoles,
		ConnectionBudgets: []string{conns.BudgetPrincipal, conns.BudgetOwner, conns.BudgetTenants, conns.BudgetBackoff},
		Decisions: []string{audit.Refused, audit.Discarded, audit.Admitted, audit.Revoked, audit.Assigned, audit.Ended,
			audit.Exchanged},
	}
}

// transportRefusals counts and logs what the HTTP face refuses before any door has the
// request (a wrong method, path, origin, content type or capability, a body too large or not
// JSON, a busy face): the answers the face closes the connection after, because it did not read
// the body, and a wrong method on a GET route. A door's own refusals pass the guard, which
// counts and records them. Each code's log lines are the 1st, 2nd, 4th, 8th… of it, so a flood
// cannot flood the log; the counter says how many there were.
type transportRefusals struct {
	p    *Plane
	face string
	next http.Handler

	mu   sync.Mutex
	seen map[string]uint64
}

func (t *transportRefusals) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := &recorder{ResponseWriter: w}
	t.next.ServeHTTP(rec, r)
	closed := rec.Header().Get("Connection") == "close"
	if rec.status < http.StatusBadRequest || !closed && rec.status != http.StatusMethodNotAllowed {
		return
	}
	var answer struct {
		Error string `json:"error"`
		Code  string `json:"code"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(rec.body.Bytes()), &answer); err != nil || !fault.Code(answer.Code).Known() {
		answer.Code = string(fault.Internal)
	}
	t.p.metrics.Refused(metrics.EndpointHTTP, answer.Code)
	t.mu.Lock()
	t.seen[answer.Code]++
	n := t.seen[answer.Code]
	t.mu.Unlock()
	if fault.Sparse(n) {
		t.p.log.Info("refused by the HTTP face", "face", t.face, "method", fault.Clip(r.Method, 16), "path", fault.Clip(r.URL.Path, fault.MaxQuote),
			"status", rec.status, "code", answer.Code, "message", answer.Error, "refused", n)
	}
}

// countTransportRefusals wraps a face's handler in transportRefusals.
func (p *Plane) countTransportRefusals(face string, h http.Handler) http.Handler {
	return &transportRefusals{p: p, face: face, next: h, seen: map[string]uint64{}}
}

// recorder keeps an answer's status, and the body of an error answer (the faces' are small
// JSON objects), as it passes through.
type recorder struct {
	http.ResponseWriter
	status int
	body   bytes.Buffer
}

func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
	r.ResponseWriter.WriteHeader(status)
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	if r.status >= http.StatusBadRequest && r.body.Len() < 4096 {
		r.body.Write(b)
	}
	return r.ResponseWriter.Write(b)
}

// Flush passes a flush on (pprof's streams need it).
func (r *recorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection (read deadlines).
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }
