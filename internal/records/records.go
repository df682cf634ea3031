// Package records writes the plane's decisions: every mint, refusal and discard past the reply
// check and the rate limit is one structured log line and one record (`minted` records in the
// minted stream, the rest in the audit stream). Records name keys by their public part only;
// no seed, JWT, proof or bearer ever reaches them.
package records

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/cotal-ai/authplane/subjects"
)

// Appender appends one record to a record stream and waits for its ack.
type Appender interface {
	Append(ctx context.Context, subject string, data []byte) error
}

// Recorder writes decisions.
type Recorder struct {
	space string
	out   Appender
	log   *slog.Logger
	now   func() time.Time
}

// New returns a recorder for space.
func New(space string, out Appender, log *slog.Logger, now func() time.Time) *Recorder {
	return &Recorder{space: space, out: out, log: log, now: now}
}

// Request identifies the request a decision is about.
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

// Minted is the record of one nkey's latest mint, on `cotal.<space>.minted.<iid>.<nkey>`: the
// source a supervisor end revokes from.
type Minted struct {
	V int `json:"v"`
	Request
	Credential
	At int64 `json:"at"` // milliseconds
}

// Decision is an audit record.
type Decision struct {
	V        int    `json:"v"`
	Decision string `json:"decision"`
	Request
	Code        string       `json:"code,omitempty"`
	Message     string       `json:"message,omitempty"`
	Credentials []Credential `json:"credentials,omitempty"`
	At          int64        `json:"at"` // milliseconds
	// Cause is the underlying error of an internal or store failure: logged, never recorded
	// or sent.
	Cause error `json:"-"`
}

// Decision names.
const (
	Refused   = "refused"
	Discarded = "discarded"
	Assigned  = "assigned"
	Ended     = "ended"
)

// RecordMinted writes one `minted` record per credential, before the mint commits. An error
// means the mint must not commit.
func (r *Recorder) RecordMinted(ctx context.Context, req Request, creds []Credential) error {
	at := r.now().UnixMilli()
	for _, c := range creds {
		data, err := json.Marshal(Minted{V: 1, Request: req, Credential: c, At: at})
		if err != nil {
			return err
		}
		if err := r.out.Append(ctx, subjects.MintedSubject(r.space, req.InstanceID, c.NKey), data); err != nil {
			r.log.Error("minted record not written; the mint will not commit", append(req.attrs(), "err", err)...)
			return fmt.Errorf("record minted %s: %w", c.NKey, err)
		}
	}
	return nil
}

// LogMinted writes the log line of a committed mint.
func (r *Recorder) LogMinted(req Request, creds []Credential) {
	keys := make([]any, 0, len(creds))
	for _, c := range creds {
		keys = append(keys, slog.Group(c.Duty, "nkey", c.NKey, "exp", c.Exp))
	}
	r.log.Info("minted", append(req.attrs(), slog.Group("credentials", keys...))...)
}

// Record writes an audit decision (refused, discarded, assigned, ended) and its log line. A
// failed write is logged; the decision itself stands.
func (r *Recorder) Record(ctx context.Context, d Decision) {
	d.V, d.At = 1, r.now().UnixMilli()
	attrs := append(d.Request.attrs(), "code", d.Code, "message", d.Message)
	for _, c := range d.Credentials {
		attrs = append(attrs, slog.Group(c.Duty, "nkey", c.NKey, "exp", c.Exp))
	}
	level := slog.LevelInfo
	switch {
	case d.Code == "internal":
		level = slog.LevelError
	case d.Decision == Discarded:
		level = slog.LevelWarn
	}
	if d.Cause != nil {
		attrs = append(attrs, "err", d.Cause)
	}
	r.log.Log(ctx, level, d.Decision, attrs...)
	data, err := json.Marshal(d)
	if err == nil {
		owner, actor, ok := subjects.SplitPrincipal(d.Caller)
		if !ok {
			owner, actor = "_", "_"
		}
		err = r.out.Append(ctx, subjects.AuditSubject(r.space, d.Decision, owner, actor), data)
	}
	if err != nil {
		r.log.Error("audit record not written", append(d.Request.attrs(), "decision", d.Decision, "err", err)...)
	}
}
