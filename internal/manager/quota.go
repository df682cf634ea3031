package manager

import (
	"context"
	"errors"
	"slices"

	"github.com/cotal-ai/authplane/internal/body"
	"github.com/cotal-ai/authplane/internal/fault"
	"github.com/cotal-ai/authplane/internal/fence"
	"github.com/cotal-ai/authplane/internal/gate"
	"github.com/cotal-ai/authplane/internal/issue"
	"github.com/cotal-ai/authplane/subjects"
)

// instances is `instances.<owner>` in the fence bucket: the owner's live manager instances.
// One owner cannot fill what every tenant shares (the minted stream, the gates): a first
// registration joins this list in the same commit as its gate, and is refused once the owner
// has as many live instances as the quota allows.
type instances struct {
	V     int      `json:"v"`
	Owner string   `json:"owner"`
	IDs   []string `json:"instanceIds"`
}

func instancesOf(kv fence.KV, owner string) *fence.Fence[instances] {
	return fence.New(kv, subjects.InstancesKey(owner), func(data []byte) (instances, error) {
		var r instances
		if err := body.Decode(data, &r); err != nil {
			return instances{}, err
		}
		if r.V != 1 || r.Owner != owner || r.IDs == nil || !slices.IsSorted(r.IDs) { // a nil list could not be written back
			return instances{}, errors.New("not a version 1 sorted list of this owner")
		}
		return r, nil
	}, nil)
}

// quotaRefusal is the refusal of an owner at its quota.
func (e *Engine) quotaRefusal(owner string, n int) *fault.Error {
	return fault.New(fault.ResourceExhausted, "owner %s has %d live manager instances, the most --max-instances-per-owner allows (%d); retire one first", owner, n, e.MaxInstancesPerOwner)
}

// checkQuota refuses, before anything is signed, a first registration that would take owner
// past its quota. The commit checks again (joinQuota): this read only spares a doomed mint.
func (e *Engine) checkQuota(ctx context.Context, owner string) error {
	o, err := instancesOf(e.Gates, owner).Observe(ctx)
	if err != nil {
		return fault.Store(err, "reading the instances of owner %s", owner)
	}
	if len(o.Row.IDs) < e.MaxInstancesPerOwner {
		return nil
	}
	live, err := e.live(ctx, o.Row.IDs)
	if err != nil {
		return err
	}
	if len(live) >= e.MaxInstancesPerOwner {
		return e.quotaRefusal(owner, len(live))
	}
	return nil
}

// joinQuota is the commit step that adds iid to owner's live instances, refusing past the
// quota. It is an update, not a fence: registrations of other instances may land in between,
// and each decides again on the list it reads.
func (e *Engine) joinQuota(owner, iid string) issue.Step {
	f := instancesOf(e.Gates, owner)
	return issue.Step{Fence: f.Key(), Commit: func(ctx context.Context) (uint64, error) {
		o, err := f.Update(ctx, func(cur *fence.Observed[instances]) (instances, error) {
			ids := cur.Row.IDs
			if slices.Contains(ids, iid) {
				return cur.Row, nil
			}
			if len(ids) >= e.MaxInstancesPerOwner {
				live, err := e.live(ctx, ids)
				if err != nil {
					return instances{}, err
				}
				if len(live) >= e.MaxInstancesPerOwner {
					return instances{}, e.quotaRefusal(owner, len(live))
				}
				ids = live
			}
			ids = append(slices.Clone(ids), iid)
			slices.Sort(ids)
			return instances{V: 1, Owner: owner, IDs: ids}, nil
		})
		if err != nil {
			return 0, err
		}
		return o.Revision, nil
	}}
}

// live returns the instances of ids whose gates are not retired (a gate not written yet is
// live: its registration may be committing).
func (e *Engine) live(ctx context.Context, ids []string) ([]string, error) {
	var out []string
	for _, iid := range ids {
		g, err := gate.Of(e.Gates, subjects.GateEndpointManager, iid).Observe(ctx)
		if err != nil && !errors.Is(err, fence.ErrGone) {
			return nil, fault.Store(err, "reading the gate of instance %s", iid)
		}
		if err == nil && !g.Absent() && g.Row.State == gate.Retired {
			continue
		}
		out = append(out, iid)
	}
	return out, nil
}
