package flows

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/subjects"
)

// TestAnNKeyClaimedByOneInstanceIsRefusedForAnother: the first registration of an nkey claims
// it for its instance; another instance naming it, of another owner or the same one, is
// refused already-exists before anything is signed, and no credential is issued. A
// registration that names it while the first one's mint is committing loses at its commit.
func TestAnNKeyClaimedByOneInstanceIsRefusedForAnother(t *testing.T) {
	t.Parallel()
	pp, p, cliA, first, _ := harness.PausedPlane(t)
	harness.Grant(t, p, harness.OwnerB, "cli", "supervise")
	cliB := harness.CallerConn(t, p, harness.OwnerB, "cli")

	for _, tt := range []struct {
		name  string
		owner string
		duty  subjects.Duty
	}{
		{"another owner's instance", harness.OwnerB, subjects.DutySupervisor},
		{"the same owner's other instance", harness.OwnerA, subjects.DutyServe},
	} {
		t.Run(tt.name, func(t *testing.T) {
			other := harness.NewManagerKeys(t)
			body := other.Body(t, "prepare", "cli")
			body["identities"].(map[string]any)[string(tt.duty)] = map[string]any{"id": first.Pub(t, tt.duty)}
			before := harness.StoreSeqs(t, p)
			nc := cliA
			if tt.owner == harness.OwnerB {
				nc = cliB
			}
			o := harness.Ask(t, nc, tt.owner, "cli", subjects.EndpointManagerAuthority, body)
			if o.Code != "already-exists" || len(o.Material.Credentials) != 0 ||
				!strings.Contains(o.Message, "identities."+string(tt.duty)) || !strings.Contains(o.Message, "belongs to another manager instance") {
				t.Fatalf("got %s %q with %d credentials, want already-exists naming identities.%s and no credential", o.Code, o.Message, len(o.Material.Credentials), tt.duty)
			}
			if strings.Contains(o.Message, first.Iid) || strings.Contains(o.Message, harness.OwnerA) && tt.owner != harness.OwnerA {
				t.Errorf("the refusal %q names the instance or owner that holds the key", o.Message)
			}
			harness.WantUnwritten(t, p, "a prepare naming a claimed key", before)
		})
	}

	t.Run("a registration racing the first one's commit", func(t *testing.T) {
		racer, late := harness.NewManagerKeys(t), harness.NewManagerKeys(t)
		shared := racer.Pub(t, subjects.DutyExecutor)
		pp.Armed.Store(true)
		result := make(chan harness.Outcome, 1)
		go func() {
			result <- harness.AskAsync(cliA, harness.OwnerA, "cli", subjects.EndpointManagerAuthority, racer.Body(t, "prepare", "cli"))
		}()
		pp.Wait(t) // the racer passed its pre-check, signed, and waits at its commit
		// Another registration claims the key first. (Written to the store as that
		// registration's commit would write it: a request on the bus could be queued behind
		// the paused worker.)
		claim, err := json.Marshal(map[string]any{"v": 1, "nkey": shared, "instanceId": late.Iid})
		if err != nil {
			t.Fatal(err)
		}
		kv, err := p.JS(t).KeyValue(harness.CallCtx(t), subjects.AuthBucket(harness.TestSpace))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Create(harness.CallCtx(t), subjects.NKeyClaimKey(shared), claim); err != nil {
			t.Fatalf("the other registration's claim: %v", err)
		}
		close(pp.Release)
		o := <-result
		if o.Code != "already-exists" || len(o.Material.Credentials) != 0 {
			t.Fatalf("the racer at its commit: got %s %q with %d credentials, want already-exists and none", o.Code, o.Message, len(o.Material.Credentials))
		}
		if _, err := harness.FenceEntry(t, p, subjects.GateKey(subjects.GateEndpointManager, racer.Iid)); err == nil {
			t.Errorf("the racer's gate was written; its commit must not land")
		}
		if dec := harness.LastDecision(t, p, "discarded", harness.OwnerA, "cli"); dec.Code != "already-exists" || dec.InstanceID != racer.Iid {
			t.Errorf("got discarded record %+v, want the racer's mint discarded already-exists", dec)
		}
	})
}
