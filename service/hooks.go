package service

import (
	"time"

	"github.com/cotal-ai/authplane/internal/capability/signers"
)

// Hooks let tests pause the plane at points where races matter.
type Hooks struct {
	// BeforeCommit runs after a mint is signed and recorded, before its commit fence.
	BeforeCommit func()
	// AfterEndStep runs after each step (1 to supervisor.EndSteps) of the supervisor-end of
	// instance iid; an error stops the end there, as a crash would.
	AfterEndStep func(iid string, step int) error
	// WitnessSampleEvery, when set, is how often the witness streams are sampled for the
	// metrics, instead of every WitnessSampleEvery.
	WitnessSampleEvery time.Duration
	// SignersRecheckEvery, when set, is how often the broker's signing keys are checked
	// against the set, instead of every SignersRecheckEvery.
	SignersRecheckEvery time.Duration
	// SyncCheckEvery, when set, is how often the servers' sync settings are read again,
	// instead of every SyncCheckEvery.
	SyncCheckEvery time.Duration
	// SignersCapacity, when set, lowers the space's instance capacity to it (a space filled
	// with a few real registrations rather than some 13,000).
	SignersCapacity int
	// SignersBroker, when set, wraps the broker the signer set pushes to and reads back from
	// (a fault injected between them).
	SignersBroker func(signers.Broker) signers.Broker
	// ConnectionHold, when set, is how long a JWT user's key that keeps connecting in its
	// back-off is held out at the broker, instead of conns.DefaultHold.
	ConnectionHold time.Duration
	// RotationTick, when set, is how often a rotation of the signing keys is resumed (and a
	// scheduled one begun), instead of every RotationTick.
	RotationTick time.Duration
	// RotationStopAfter, when set, stops a rotation of the signing keys this plane makes as a
	// crash would, after each step for which it reports true (signers.Step…).
	RotationStopAfter func(step string) bool
}
