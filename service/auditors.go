package service

import (
	"fmt"

	"github.com/cotal-ai/authplane/handlers"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/subjects"
)

// auditorsQueue is the queue group of every replica's auditors subscription: one answers.
const auditorsQueue = "cotal-auth-auditors"

// serveAuditors takes the auditors' consumer creations and deletions for the minted and audit
// streams on a plane-account connection of their own (the store's subscribes to nothing but its
// inbox), and passes the pull consumers among them on to JetStream, each the auditor's own, and
// the deletions of those (handlers.AuditorConsumers). The auditors' other requests are mapped to
// JetStream by the plane account (subjects.AuditorMappings) and never reach it.
func (p *Plane) serveAuditors(planeIssuer *issue.Issuer) error {
	nc, err := p.connectRenewed("auditors", planeIssuer, subjects.AuditorsPermissions(p.cfg.Space), nil)
	if err != nil {
		return err
	}
	h := &handlers.AuditorConsumers{Space: p.cfg.Space, JetStream: nc, Timeout: p.cfg.RequestTimeout,
		Metrics: p.metrics, Log: p.log.With("conn", "auditors")}
	subject := subjects.AuditorReads(p.cfg.Space)[0].Remote
	if _, err := nc.QueueSubscribe(subject, auditorsQueue, h.Handle); err != nil {
		return fmt.Errorf("subscribe %s: %w", subject, err)
	}
	return nc.Flush()
}
