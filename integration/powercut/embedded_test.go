package powercut

import (
	"testing"
	"time"

	"github.com/cotal-ai/authplane/integration/internal/harness"
)

// TestACutUnderLoadLosesNothingAcknowledged cuts the power of a plane with its embedded broker
// under a mixed load, 3 times (AUTHPLANE_POWERCUT_TRIALS for more), and after each restart
// finds every acknowledged end, epoch, run admission, takeover and revocation, assignment, scope
// and agent secret, every received credential's minted record and claim, no ended credential
// admitted by the broker from the moment it listens again, and every end that was under way
// completed when asked again.
func TestACutUnderLoadLosesNothingAcknowledged(t *testing.T) {
	harness.Long(t, "power cuts of a plane process under load")
	trials := runTrials(t, settings{cuts: trialCount(t, 3), minLoad: 500 * time.Millisecond, maxLoad: 3 * time.Second, minAcks: 5},
		startEmbedded(false, false))
	report(t, "embedded broker", trials)
	wantNoLoss(t, trials)
}

// TestACutOfAnUnsyncedPlaneLosesAcknowledgedWrites is the same test with syncing off
// (--allow-unsynced): it must find lost writes, or the test above proves nothing. The plane is
// stopped cleanly once after its first start, so its streams are on the disk (a cut right after
// a first start loses them whole, and the plane refuses to start: the durability tests of
// the stores show that); the cut then comes right after a burst of acknowledged writes, which
// nats-server has not synced (it syncs every two minutes), so the loss is certain.
func TestACutOfAnUnsyncedPlaneLosesAcknowledgedWrites(t *testing.T) {
	harness.Long(t, "power cuts of a plane process under load")
	trials := runTrials(t, settings{cuts: 2, minLoad: 500 * time.Millisecond, maxLoad: time.Second, minAcks: 30}, startEmbedded(true, true))
	if lost := report(t, "embedded broker, unsynced", trials); len(lost) == 0 {
		t.Errorf("%d cuts of an unsynced plane lost nothing acknowledged; want the test to find lost writes", len(trials))
	}
}
