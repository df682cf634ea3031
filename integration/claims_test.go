package integration

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/cotal-ai/authplane/subjects"
)

// TestAnNKeyClaimedByOneInstanceIsRefusedForAnother: the first registration of an nkey claims
// it for its instance; another instance naming it, of another owner or the same one, is
// refused already-exists before anything is signed, and no credential is issued. A
// registration that names it while the first one's mint is committing loses at its commit.
func TestAnNKeyClaimedByOneInstanceIsRefusedForAnother(t *testing.T) {
	t.Parallel()
	pp, p, cliA, first, _ := pausedPlane(t)
	grant(t, p, ownerB, "cli", "supervise")
	cliB := callerConn(t, p, ownerB, "cli")

	for _, tt := range []struct {
		name  string
		owner string
		duty  subjects.Duty
	}{
		{"another owner's instance", ownerB, subjects.DutySupervisor},
		{"the same owner's other instance", ownerA, subjects.DutyServe},
	} {
		t.Run(tt.name, func(t *testing.T) {
			other := newManagerKeys(t)
			body := other.body(t, "prepare", "cli")
			body["identities"].(map[string]any)[string(tt.duty)] = map[string]any{"id": first.pub(t, tt.duty)}
			before := storeSeqs(t, p)
			nc := cliA
			if tt.owner == ownerB {
				nc = cliB
			}
			o := ask(t, nc, tt.owner, "cli", subjects.EndpointManagerAuthority, body)
			if o.code != "already-exists" || len(o.material.Credentials) != 0 ||
				!strings.Contains(o.message, "identities."+string(tt.duty)) || !strings.Contains(o.message, "belongs to another manager instance") {
				t.Fatalf("got %s %q with %d credentials, want already-exists naming identities.%s and no credential", o.code, o.message, len(o.material.Credentials), tt.duty)
			}
			if strings.Contains(o.message, first.iid) || strings.Contains(o.message, ownerA) && tt.owner != ownerA {
				t.Errorf("the refusal %q names the instance or owner that holds the key", o.message)
			}
			wantUnwritten(t, p, "a prepare naming a claimed key", before)
		})
	}

	t.Run("a registration racing the first one's commit", func(t *testing.T) {
		racer, late := newManagerKeys(t), newManagerKeys(t)
		shared := racer.pub(t, subjects.DutyExecutor)
		pp.armed.Store(true)
		result := make(chan outcome, 1)
		go func() {
			result <- askAsync(cliA, ownerA, "cli", subjects.EndpointManagerAuthority, racer.body(t, "prepare", "cli"))
		}()
		pp.wait(t) // the racer passed its pre-check, signed, and waits at its commit
		// Another registration claims the key first. (Written to the store as that
		// registration's commit would write it: a request on the bus could be queued behind
		// the paused worker.)
		claim, err := json.Marshal(map[string]any{"v": 1, "nkey": shared, "instanceId": late.iid})
		if err != nil {
			t.Fatal(err)
		}
		kv, err := p.JS(t).KeyValue(callCtx(t), subjects.AuthBucket(testSpace))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Create(callCtx(t), subjects.NKeyClaimKey(shared), claim); err != nil {
			t.Fatalf("the other registration's claim: %v", err)
		}
		close(pp.release)
		o := <-result
		if o.code != "already-exists" || len(o.material.Credentials) != 0 {
			t.Fatalf("the racer at its commit: got %s %q with %d credentials, want already-exists and none", o.code, o.message, len(o.material.Credentials))
		}
		if _, err := fenceEntry(t, p, subjects.GateKey(subjects.GateEndpointManager, racer.iid)); err == nil {
			t.Errorf("the racer's gate was written; its commit must not land")
		}
		if dec := lastDecision(t, p, "discarded", ownerA, "cli"); dec.Code != "already-exists" || dec.InstanceID != racer.iid {
			t.Errorf("got discarded record %+v, want the racer's mint discarded already-exists", dec)
		}
	})
}
