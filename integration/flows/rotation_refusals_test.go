package flows

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/capability/signers"
	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/service"
)

// wantRotationRefused fails the test unless err is a refusal of code whose message says each
// of why.
func wantRotationRefused(t *testing.T, what string, rep *signers.Report, err error, code fault.Code, why ...string) {
	t.Helper()
	f := fault.As(err)
	if err == nil || f.Code != code {
		t.Fatalf("%s: got %+v, %v; want refused %s", what, rep, err, code)
	}
	for _, w := range why {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: the refusal %q does not say %q", what, err, w)
		}
	}
}

// TestARotationWithoutTheOperatorSigningKeyIsRefusedWithTheReasonAndWritesNothing: with a
// space material that lacks the operator signing key (an operator who keeps it elsewhere),
// `authplane keys rotate-signing` of either kind is refused failed-precondition, saying the
// plane cannot re-sign the data account's JWT and how to rotate instead; no store moved and
// the broker holds the same JWT.
func TestARotationWithoutTheOperatorSigningKeyIsRefusedWithTheReasonAndWritesNothing(t *testing.T) {
	t.Parallel()
	p := harness.StartPlane(t, nil)
	keys := *p.Keys()
	keys.OperatorSigner = nil
	claims, _ := harness.DataAccountAtBroker(t, p)
	before := harness.RotationSeqs(t, p)
	for _, kind := range []string{signers.Scheduled, signers.Emergency} {
		rep, err := admin.RotateSigning(harness.GrantCtx(t), &keys, p.NATSURL(), admin.RotateOptions{Kind: kind})
		wantRotationRefused(t, kind+" without the operator signing key", rep, err, fault.FailedPrecondition,
			"cannot re-sign the data account's JWT", "nsc", "Rotate the signing keys")
		if !errors.Is(err, signers.ErrNoSigner) {
			t.Errorf("%s: %v does not wrap ErrNoSigner", kind, err)
		}
	}
	harness.WantRotationUnwritten(t, p, "a rotation without the operator signing key", before, claims.IssuedAt)
	if st, rep := harness.SigningStatus(t, p); st.Current != 0 || !rep.Done {
		t.Fatalf("after the refusals: generation %d signs, rotation %+v; want 0 and none under way", st.Current, rep)
	}
}

// TestASecondRotationWhileOneIsUnderWayIsRefusedAndWritesNothing: a scheduled rotation waits
// at its switch for the old key's credentials to expire; a second scheduled rotation is then
// refused conflict, naming the one under way and how to complete it, and writes nothing. An
// emergency rotation supersedes the scheduled one (a leaked key cannot wait a day); stopped
// after it listed its keys, a second emergency rotation is refused too, and writes nothing. The
// plane's tick, which would resume the stopped rotation, waits an hour.
func TestASecondRotationWhileOneIsUnderWayIsRefusedAndWritesNothing(t *testing.T) {
	t.Parallel()
	p := harness.StartPlane(t, func(c *service.Config) { c.Hooks = &service.Hooks{RotationTick: time.Hour} })
	first := harness.MustRotate(t, p, signers.Scheduled)
	if first.Done || first.Step != signers.StepSwitched || first.To != 1 {
		t.Fatalf("the first scheduled rotation: got %+v, want generation 1 switched, waiting", first)
	}
	claims, _ := harness.DataAccountAtBroker(t, p)
	before := harness.RotationSeqs(t, p)
	rep, err := harness.Rotate(t, p, signers.Scheduled)
	wantRotationRefused(t, "a second scheduled rotation", rep, err, fault.Conflict, "under way", first.OpID, "--resume")
	harness.WantRotationUnwritten(t, p, "a second scheduled rotation", before, claims.IssuedAt)

	rep, err = harness.RotateWith(t, p, admin.RotateOptions{Kind: signers.Emergency, StopAfter: func(step string) bool { return step == signers.StepListed }})
	if !errors.Is(err, signers.ErrStopped) {
		t.Fatalf("an emergency rotation stopped after it listed: got %+v, %v", rep, err)
	}
	_, under := harness.SigningStatus(t, p)
	if under.Kind != signers.Emergency || under.Step != signers.StepListed || under.To != 2 {
		t.Fatalf("the emergency rotation under way: got %+v, want generation 2, listed", under)
	}
	claims, _ = harness.DataAccountAtBroker(t, p)
	before = harness.RotationSeqs(t, p)
	for _, kind := range []string{signers.Emergency, signers.Scheduled} {
		rep, err = harness.Rotate(t, p, kind)
		wantRotationRefused(t, "a "+kind+" rotation during an emergency one", rep, err, fault.Conflict, "under way", under.OpID)
	}
	harness.WantRotationUnwritten(t, p, "a rotation during an emergency one", before, claims.IssuedAt)
	if done := harness.MustRotate(t, p, ""); !done.Done {
		t.Fatalf("resuming the emergency rotation: got %+v, want done", done)
	}
	if st, _ := harness.SigningStatus(t, p); st.Current != 2 || st.Trust != 2 {
		t.Fatalf("after the emergency rotation: %+v, want generation 2 signing and keying the proofs", st)
	}
}
