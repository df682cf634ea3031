// Package audit writes the plane's decisions: every mint, refusal and discard past the reply
// check and the rate limit is one structured log line and one record (`minted` records in the
// minted stream, the rest in the audit stream). The audit stream is shared by every owner, so
// each owner has a budget of full records per decision and minute; past it, its records are
// counted in one summary record. Records name keys by their public part only; no seed, JWT,
// proof or bearer ever reaches them.
package audit

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/store"
	"github.com/cotal-ai/authplane/subjects"
)

// Stream is the plane's record streams, as the writer uses them: Append appends one record and
// waits for its ack (a non-empty msgID makes a repeat of the same append idempotent); Last reads
// back the last record of each subject of a stream that matches a filter; LastOn the last
// record on one subject, with the time the stream stored it.
type Stream interface {
	Append(ctx context.Context, subject string, data []byte, msgID string) error
	Last(ctx context.Context, stream, filter string) ([]store.Record, error)
	LastOn(ctx context.Context, stream, subject string) (r store.Record, found bool, err error)
}

// Writer writes decisions.
type Writer struct {
	// PerMinute is how many full records of each decision one owner gets a minute in this
	// process (DefaultPerMinute when 0); past it, that owner's records of the decision are
	// counted in one summary record for the minute. Set it before the first record.
	PerMinute int
	// Summarized, when set, is told of each record counted in a summary instead of written.
	Summarized func(decision string)

	space string
	out   Stream
	log   *slog.Logger
	now   func() time.Time

	// standing is the `minted` records this writer wrote or read, for a short while.
	standing standing

	// windows are the budgets of the minute, one per owner and decision.
	mu      sync.Mutex
	windows map[budgetKey]*window
}

// New returns a writer for space.
func New(space string, out Stream, log *slog.Logger, now func() time.Time) *Writer {
	return &Writer{space: space, out: out, log: log, now: now, windows: map[budgetKey]*window{}}
}

// Request identifies the request a decision is about. Only what passed its grammar is set: a
// refused body's fields may be anything a caller chose.
type Request struct {
	Endpoint   string `json:"endpoint"`
	Caller     string `json:"caller"`
	Kind       string `json:"kind,omitempty"`
	Operation  string `json:"operation,omitempty"`
	InstanceID string `json:"instanceId,omitempty"`
	RequestID  string `json:"requestId,omitempty"`
	RunID      string `json:"runId,omitempty"`
}

func (r Request) attrs() []any {
	a := []any{"endpoint", r.Endpoint, "caller", r.Caller}
	for _, kv := range [][2]string{{"kind", r.Kind}, {"operation", r.Operation}, {"instance", r.InstanceID}, {"request_id", r.RequestID}, {"run_id", r.RunID}} {
		if kv[1] != "" {
			a = append(a, kv[0], kv[1])
		}
	}
	return a
}

// Credential names one signed credential by its public key.
type Credential struct {
	Duty string `json:"duty"`
	NKey string `json:"nkey"`
	Exp  int64  `json:"exp"` // seconds
}

// Decision is an audit record.
type Decision struct {
	V        int    `json:"v"`
	Decision string `json:"decision"`
	Request
	Code        string       `json:"code,omitempty"`
	Message     string       `json:"message,omitempty"`
	Credentials []Credential `json:"credentials,omitempty"`
	// Assignment is the platform supervisor assignment an `assigned` or `ended` record is about.
	Assignment *Assignment `json:"assignment,omitempty"`
	// Revoked are the user nkeys an `ended` record revokes at the broker; Unrevoked those of them
	// the broker is not known to revoke (past the revocation set's ceiling, no operator signing
	// key, or not confirmed by the deadline).
	Revoked   []string `json:"revoked,omitempty"`
	Unrevoked []string `json:"unrevoked,omitempty"`
	// Bearer is the bearer an `exchanged` record is about.
	Bearer *Bearer `json:"bearer,omitempty"`
	// Subject is the run-start an `admitted` record's run was admitted from.
	Subject string `json:"subject,omitempty"`
	At      int64  `json:"at"` // milliseconds
}

// Assignment names a platform supervisor assignment in a record: the owner it acts for, the
// instance and lifecycle it covers, its end (seconds), its state and revision.
type Assignment struct {
	Owner        string `json:"owner"`
	InstanceID   string `json:"instanceId"`
	LifecycleUID string `json:"lifecycleUid"`
	ExpiresAt    int64  `json:"expiresAt"`
	State        string `json:"state"`
	Revision     uint64 `json:"revision"`
}

// Bearer names a bearer in an `exchanged` record: its view, whether an agent's secret bought
// it, and its expiry (seconds); never the token.
type Bearer struct {
	View  string `json:"view"`
	Agent bool   `json:"agent,omitempty"`
	Exp   int64  `json:"exp"`
}

// Decision names.
const (
	Refused   = "refused"
	Discarded = "discarded"
	Assigned  = "assigned"
	Ended     = "ended"
	Exchanged = "exchanged"
	// Admitted and Revoked record a run's admission and its revocation.
	Admitted = "admitted"
	Revoked  = "revoked"
	// RefusedSummary counts, by code, one owner's refusals of one minute past its budget.
	RefusedSummary = Refused + summarySuffix
)

// SummaryOf is the decision of the record that counts one owner's records of decision past
// its budget of the minute: `<decision>-summary` (RefusedSummary for refusals).
func SummaryOf(decision string) string { return decision + summarySuffix }

const summarySuffix = "-summary"

// Bounds of the audit stream (docs/PROTOCOL.md, "Conventions"; docs/SECURITY.md): one caller once evicted the whole audit history
// with oversized bodies echoed into its refusals, and one agent could evict it with its
// successful exchanges.
const (
	// MaxRefusedRecord is the largest `refused` record, in bytes.
	MaxRefusedRecord = 1024
	// DefaultPerMinute is how many full records of each decision one owner gets a minute;
	// its records past them are counted in one summary record (SummaryOf) for the minute.
	DefaultPerMinute = 60
	// budgetWindow is the span of an owner's budget.
	budgetWindow = time.Minute
)

// Anonymous is the owner whose budget every record without a principal shares: a refusal of
// an HTTP door or the auth callout before its caller was known (caller `_._`). A peer's address
// is not an owner: one who can change it would mint budgets at will.
const Anonymous = "_"

// Summary is a summary record, on `cotal.<space>.audit.<decision>-summary.<owner>._`: what one
// owner's records of one decision past its budget of one minute would have said, counted by
// refusal code (refused, discarded) or, for a decision without a code, under the decision.
type Summary struct {
	V        int    `json:"v"`
	Decision string `json:"decision"`
	Owner    string `json:"owner"`
	// From and To bound the window (milliseconds).
	From   int64          `json:"from"`
	To     int64          `json:"to"`
	Counts map[string]int `json:"counts"`
	At     int64          `json:"at"`
}

// budgetKey names one budget: an owner's records of one decision.
type budgetKey struct{ owner, decision string }

// window is one budget for the minute that began at start.
type window struct {
	start  time.Time
	full   int
	counts map[string]int
}

// LogMinted writes the log line of a committed mint.
func (w *Writer) LogMinted(req Request, creds []Credential) {
	w.log.Info("minted", append(req.attrs(), credentialAttrs(creds)...)...)
}

// Discarded records a signed mint that did not commit: nothing was sent.
func (w *Writer) Discarded(ctx context.Context, req Request, creds []Credential, refusal *fault.Error) {
	w.record(ctx, Decision{Decision: Discarded, Request: req, Code: string(refusal.Code), Message: refusal.Message, Credentials: creds}, refusal.Cause)
}

// Assigned records a platform supervisor assignment written (or found already written) for
// the caller of req.
func (w *Writer) Assigned(ctx context.Context, req Request, a Assignment) {
	w.record(ctx, Decision{Decision: Assigned, Request: req, Assignment: &a}, nil)
}

// Ended records the end of a platform supervisor assignment: why (reason, as the caller gave
// it, at most fault.MaxMessage bytes), every credential key it revoked, and those of them the
// broker is not known to revoke.
//
// An end that could not revoke every key is the one record of which keys stay live until their
// clamp, so it is written in full whatever its owner's budget (only ends past the revocation
// set's ceiling, or without the operator signing key, write one), and its error returned: the
// end is not over until it is on record.
func (w *Writer) Ended(ctx context.Context, req Request, a Assignment, reason string, revoked, unrevoked []string) error {
	return w.record(ctx, Decision{Decision: Ended, Request: req, Assignment: &a, Message: fault.Clip(reason, fault.MaxMessage), Revoked: revoked, Unrevoked: unrevoked}, nil)
}

// Exchanged records a bearer issued by /exchange to the caller of req.
func (w *Writer) Exchanged(ctx context.Context, req Request, b Bearer) {
	w.record(ctx, Decision{Decision: Exchanged, Request: req, Bearer: &b}, nil)
}

// Refused records a request refused before anything was signed. A record is at most
// MaxRefusedRecord bytes.
func (w *Writer) Refused(ctx context.Context, req Request, refusal *fault.Error) {
	w.record(ctx, Decision{Decision: Refused, Request: req, Code: string(refusal.Code), Message: refusal.Message}, refusal.Cause)
}

// admit takes one full record of decision from owner's budget; false means the record was
// counted under key instead. An exempt record (one the history must keep) is admitted past the
// budget and not counted. A window that ended is handed back to be summarized.
func (w *Writer) admit(owner, decision, key string, exempt bool) (admitted bool, ended *window) {
	now := w.now()
	limit := w.PerMinute
	if limit <= 0 {
		limit = DefaultPerMinute
	}
	k := budgetKey{owner, decision}
	w.mu.Lock()
	defer w.mu.Unlock()
	win := w.windows[k]
	if win == nil || now.Sub(win.start) >= budgetWindow {
		ended = win
		win = &window{start: now, counts: map[string]int{}}
		w.windows[k] = win
	}
	if win.full < limit {
		win.full++
		return true, ended
	}
	if exempt {
		return true, ended
	}
	win.counts[key]++
	return false, ended
}

// Flush writes the summary of every window that has ended and forgets those windows, so the
// budgets' memory stays as small as the set of owners recorded in the last minute.
func (w *Writer) Flush(ctx context.Context) {
	now := w.now()
	ended := map[budgetKey]*window{}
	w.mu.Lock()
	for k, win := range w.windows {
		if now.Sub(win.start) >= budgetWindow {
			ended[k] = win
			delete(w.windows, k)
		}
	}
	w.mu.Unlock()
	for k, win := range ended {
		w.summarize(ctx, k, win)
	}
}

// Run flushes ended windows every few seconds until ctx ends, then once more for what is left.
func (w *Writer) Run(ctx context.Context) {
	t := time.NewTicker(budgetWindow / 6)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			final, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			w.mu.Lock()
			for _, win := range w.windows {
				win.start = time.Time{} // every window ends now
			}
			w.mu.Unlock()
			w.Flush(final)
			return
		case <-t.C:
			w.Flush(ctx)
		}
	}
}

// summarize writes the summary of k's window win, if it counted anything past the budget.
func (w *Writer) summarize(ctx context.Context, k budgetKey, win *window) {
	if len(win.counts) == 0 {
		return
	}
	total := 0
	for _, n := range win.counts {
		total += n
	}
	decision := SummaryOf(k.decision)
	sum := Summary{V: 1, Decision: decision, Owner: k.owner, From: win.start.UnixMilli(), To: w.now().UnixMilli(), Counts: win.counts, At: w.now().UnixMilli()}
	w.log.Warn("records past the owner's budget, counted", "owner", k.owner, "decision", k.decision, "counted", total, "counts", win.counts)
	data, err := fault.Encode(sum)
	if err == nil {
		err = w.out.Append(ctx, subjects.AuditSubject(w.space, decision, k.owner, "_"), data, "")
	}
	if err != nil {
		w.log.Error("audit summary not written", "owner", k.owner, "decision", k.decision, "err", err)
	}
}

// record writes an audit decision and its log line while the caller's owner is within its
// budget of the minute for the decision; past it, the decision is counted for the minute's
// summary instead (by its code, or under its own name). An end that left keys unrevoked is
// always written: those keys would be on no other record. A failed write is logged; the
// decision itself stands.
func (w *Writer) record(ctx context.Context, d Decision, cause error) error {
	// A caller that is not a principal is charged, and filed, as Anonymous.
	owner, actor, ok := subjects.SplitPrincipal(d.Caller)
	if !ok {
		owner, actor = Anonymous, "_"
	}
	key := d.Code
	if key == "" {
		key = d.Decision
	}
	admitted, ended := w.admit(owner, d.Decision, key, len(d.Unrevoked) > 0)
	if ended != nil {
		w.summarize(ctx, budgetKey{owner, d.Decision}, ended)
	}
	if !admitted {
		if w.Summarized != nil {
			w.Summarized(d.Decision)
		}
		return nil
	}
	d.V, d.At = 1, w.now().UnixMilli()
	attrs := append(d.Request.attrs(), "code", d.Code, "message", d.Message)
	if a := d.Assignment; a != nil {
		attrs = append(attrs, slog.Group("assignment", "owner", a.Owner, "lifecycle", a.LifecycleUID, "expires_at", a.ExpiresAt, "state", a.State, "revision", a.Revision))
	}
	if len(d.Revoked) > 0 {
		attrs = append(attrs, "revoked", d.Revoked)
	}
	if len(d.Unrevoked) > 0 {
		attrs = append(attrs, "unrevoked", d.Unrevoked)
	}
	if b := d.Bearer; b != nil {
		attrs = append(attrs, slog.Group("bearer", "view", b.View, "agent", b.Agent, "exp", b.Exp))
	}
	if d.Subject != "" {
		attrs = append(attrs, "subject", d.Subject)
	}
	attrs = append(attrs, credentialAttrs(d.Credentials)...)
	level := slog.LevelInfo
	switch {
	case d.Code == string(fault.Internal):
		level = slog.LevelError
	case d.Decision == Discarded:
		level = slog.LevelWarn
	}
	if cause != nil {
		attrs = append(attrs, "err", cause)
	}
	w.log.Log(ctx, level, d.Decision, attrs...)
	data, err := fault.Encode(d)
	for err == nil && d.Decision == Refused && len(data) > MaxRefusedRecord && d.Message != "" {
		d.Message = fault.Clip(d.Message, len(d.Message)/2)
		data, err = fault.Encode(d)
	}
	if err == nil {
		err = w.out.Append(ctx, subjects.AuditSubject(w.space, d.Decision, owner, actor), data, "")
	}
	if err != nil {
		w.log.Error("audit record not written", append(d.Request.attrs(), "decision", d.Decision, "err", err)...)
	}
	return err
}

func credentialAttrs(creds []Credential) []any {
	attrs := make([]any, 0, len(creds))
	for _, c := range creds {
		attrs = append(attrs, slog.Group(c.Duty, "nkey", c.NKey, "exp", c.Exp))
	}
	return attrs
}

// Reserve returns a context for a request's work that ends a tenth of ctx's remaining time
// before ctx does, so the records that follow the work (a discard, a refusal) are still
// written within the request's deadline.
func Reserve(ctx context.Context) (context.Context, context.CancelFunc) {
	deadline, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	return context.WithDeadline(ctx, deadline.Add(-time.Until(deadline)/10))
}
