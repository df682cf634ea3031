package supervisor

import (
	"context"
	"time"

	"github.com/cotal-ai/authplane/internal/capability/manager"
	"github.com/cotal-ai/authplane/internal/capability/signers"
	"github.com/cotal-ai/authplane/internal/core/audit"
	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/internal/core/issue"
)

// Supervisor serves the platform supervisor of one space: supervisor-assign,
// supervisor-authority and supervisor-end.
type Supervisor struct {
	Space string
	// Account is the data account's public key: what an assignment names.
	Account string

	// Platform holds the assignments; Gates the fences (gates, the signer set); Ledger the
	// scopes; Issued the evidence and attempt rows; Accepted the write-once accepted rows.
	Platform fence.KV
	Gates    fence.KV
	Ledger   fence.KV
	Issued   fence.KV
	Accepted fence.KV

	// Engine runs the manager-service operations a supervisor asks for, through the pipeline.
	Engine *manager.Engine
	// Minted lists the keys of every credential minted for an instance, and Claims says which
	// instance claimed each: an end revokes those its instance claimed.
	Minted Minted
	Claims *issue.Claims
	// Signers are the data account's live signing keys and the broker they are applied to.
	Signers *signers.Set
	Audit   Recorder

	// MaxTTL bounds an assignment's expiresAt from now (--max-assignment-ttl).
	MaxTTL time.Duration
	Now    func() time.Time
	// AfterEndStep, when set, runs after each step (1 to 7) of the end of instance iid's
	// assignment; an error stops the end there, as a crash would. A test seam.
	AfterEndStep func(iid string, step int) error
}

// Minted lists the public keys of the `minted` records of instance iid.
type Minted interface {
	MintedKeys(ctx context.Context, iid string) ([]string, error)
}

// Recorder writes the supervisor's own decisions: `assigned` and `ended`.
type Recorder interface {
	Assigned(ctx context.Context, req audit.Request, a audit.Assignment)
	// Ended records an end's outcome; an error means it is not on record.
	Ended(ctx context.Context, req audit.Request, a audit.Assignment, reason string, revoked, unrevoked []string) error
}
