package audit

import (
	"context"

	"github.com/cotal-ai/authplane/internal/core/fault"
)

// RunAdmitted records a run admitted for the caller of req (its endpoint, instance and run),
// from the run-start on subject: a new admission, or the identical earlier one returned again.
func (w *Writer) RunAdmitted(ctx context.Context, req Request, subject string) {
	w.record(ctx, Decision{Decision: Admitted, Request: req, Subject: subject}, nil)
}

// RunRevoked records a run revocation answered to the caller of req, with the reason of the
// marker that stands (at most fault.MaxMessage bytes of it): the first one, whoever asks again.
func (w *Writer) RunRevoked(ctx context.Context, req Request, reason string) {
	w.record(ctx, Decision{Decision: Revoked, Request: req, Message: fault.Clip(reason, fault.MaxMessage)}, nil)
}
