package manager

import (
	"context"
	"errors"
	"sync"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/internal/body"
	"github.com/cotal-ai/authplane/internal/fault"
	"github.com/cotal-ai/authplane/internal/fence"
	"github.com/cotal-ai/authplane/internal/issue"
	"github.com/cotal-ai/authplane/subjects"
)

// claim is `nkey.<pub>` in the fence bucket: the instance a user nkey belongs to, for life
// (docs/PROTOCOL.md, "manager-service-authority"). An end revokes by nkey; without the claim one owner could register another
// owner's public nkeys, and ending the first instance would revoke the second's credentials.
type claim struct {
	V          int    `json:"v"`
	NKey       string `json:"nkey"`
	InstanceID string `json:"instanceId"`
}

func claimOf(kv fence.KV, nkey string) *fence.Fence[claim] {
	return fence.New(kv, subjects.NKeyClaimKey(nkey), func(data []byte) (claim, error) {
		var c claim
		if err := body.Decode(data, &c); err != nil {
			return claim{}, err
		}
		if c.V != 1 || c.NKey != nkey || !subjects.ValidUID(c.InstanceID) {
			return claim{}, errors.New("not a version 1 claim on this nkey")
		}
		return c, nil
	}, nil)
}

// claimedElsewhere is the refusal of an identity another instance claimed first.
func claimedElsewhere(d subjects.Duty, nkey string) *fault.Error {
	return fault.New(fault.AlreadyExists, "identities.%s: nkey %s belongs to another manager instance; an nkey serves one instance for life, so generate a fresh one", d, nkey)
}

// checkClaims refuses, before anything is signed, identities another instance has claimed.
// The commit claims them (claimKeys): this read only spares a doomed mint.
func (e *Engine) checkClaims(ctx context.Context, iid string, ids client.Identities) error {
	return eachDuty(func(d subjects.Duty) error {
		o, err := claimOf(e.Gates, ids.Of(d)).Observe(ctx)
		if err != nil {
			return fault.Store(err, "reading the claim on identities.%s", d)
		}
		if !o.Absent() && o.Row.InstanceID != iid {
			return claimedElsewhere(d, ids.Of(d))
		}
		return nil
	})
}

// claimKeys is the commit step that claims each identity for iid, create-only; a claim iid
// holds already stands, and one another instance holds refuses the commit (already-exists).
func (e *Engine) claimKeys(iid string, ids client.Identities) issue.Step {
	return issue.Step{Fence: "the claims on its identities", Commit: func(ctx context.Context) (uint64, error) {
		return 0, eachDuty(func(d subjects.Duty) error { // five keys: no one revision
			nkey := ids.Of(d)
			_, err := claimOf(e.Gates, nkey).Update(ctx, func(cur *fence.Observed[claim]) (claim, error) {
				switch {
				case cur.Absent():
					return claim{V: 1, NKey: nkey, InstanceID: iid}, nil
				case cur.Row.InstanceID == iid:
					return claim{}, fence.ErrKeep
				}
				return claim{}, claimedElsewhere(d, nkey)
			})
			return err
		})
	}}
}

// eachDuty runs f for every standing duty at once (five keys, five store round trips that need
// not wait for one another) and answers the error of the first duty, in their order, that
// failed: the refusal a caller sees does not depend on which answer came back first. Every f
// runs to its end: a claim write cut short would be of unknown outcome.
func eachDuty(f func(subjects.Duty) error) error {
	errs := make([]error, len(subjects.StandingDuties))
	var wg sync.WaitGroup
	for i, d := range subjects.StandingDuties {
		wg.Go(func() { errs[i] = f(d) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
