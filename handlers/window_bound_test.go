package handlers

import (
	"testing"
	"time"

	"github.com/cotal-ai/authplane/admin"
)

// A revoke kicks the agent's connections for admin.RevokeWindow after its ledger write; a
// decision that read the row before that write answers within CalloutDeadline of its
// request's arrival. The window must outlast the deadline with room to send the answer.
func TestTheRevokeWindowOutlastsTheCalloutDeadline(t *testing.T) {
	const slack = 500 * time.Millisecond
	if admin.RevokeWindow < CalloutDeadline+slack {
		t.Fatalf("admin.RevokeWindow %s is shorter than CalloutDeadline %s plus %s to send the answer", admin.RevokeWindow, CalloutDeadline, slack)
	}
}
