package manager

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/internal/core/store"
	"github.com/cotal-ai/authplane/subjects"
)

// MaxInstancesPerOwner is the most live instances --max-instances-per-owner may allow: what
// one owner's `instances` row holds with room to spare (about 33 bytes an id: some 330 KB of a
// broker message's 1 MiB).
const MaxInstancesPerOwner = 10_000

// MaxPending bounds an owner's first registrations in flight at once (each holds a pending
// slot until its deadline): past it a new one is refused, resource-exhausted.
const MaxPending = 256

// maxInstancesRow bounds a stored `instances` row: every id at the flag's maximum (33 bytes
// each), and MaxPending registrations pending (about 120 bytes each).
const maxInstancesRow = MaxInstancesPerOwner*40 + MaxPending*160 + 4<<10

// instances is `instances.<owner>` in the fence bucket: the owner's instances that hold a slot
// of its quota. One owner cannot fill what every tenant shares (the minted stream, the gates):
// a first registration takes a slot in its commit, before its gate, and is refused once the
// owner has as many live instances as the quota allows. A slot is held only by a registration
// that commits: each taking is pending (its token, until its request's deadline) until its gate
// exists; a registration that did not commit gives its slot back (Release), and one a crash cut
// short stops counting once its deadline has passed with no gate written.
type instances struct {
	V       int       `json:"v"`
	Owner   string    `json:"owner"`
	IDs     []string  `json:"instanceIds"`
	Pending []pending `json:"pending"`
}

// pending is one registration in flight that took a slot for its instance.
type pending struct {
	InstanceID string `json:"instanceId"`
	Token      string `json:"token"`
	// Until is when its request's deadline has surely passed (unix milliseconds): past it,
	// with no gate, the registration never committed.
	Until int64 `json:"until"`
}

func instancesOf(kv fence.KV, owner string) *fence.Fence[instances] {
	return fence.New(kv, subjects.InstancesKey(owner), func(data []byte) (instances, error) {
		var r instances
		if err := fault.DecodeRow(data, &r, maxInstancesRow); err != nil {
			return instances{}, err
		}
		if r.V != 1 || r.Owner != owner || r.IDs == nil || !slices.IsSorted(r.IDs) { // a nil list could not be written back
			return instances{}, errors.New("not a version 1 sorted list of this owner")
		}
		if r.Pending == nil {
			r.Pending = []pending{}
		}
		return r, nil
	}, nil)
}

// quotaRefusal is the refusal of an owner at its quota.
func (e *Engine) quotaRefusal(owner string, n int) *fault.Error {
	return fault.New(fault.ResourceExhausted, "owner %s has %d live manager instances, the most --max-instances-per-owner allows (%d); retire one first", owner, n, e.MaxInstancesPerOwner)
}

// checkQuota refuses, before anything is signed, a first registration that would take owner
// past its quota. The commit checks again (takeSlot): this read only spares a doomed mint.
func (e *Engine) checkQuota(ctx context.Context, owner string) error {
	o, err := instancesOf(e.Gates, owner).Observe(ctx)
	if err != nil {
		return fault.Store(err, "reading the instances of owner %s", owner)
	}
	if len(o.Row.IDs) < e.MaxInstancesPerOwner {
		return nil
	}
	live, err := e.live(ctx, o.Row)
	if err != nil {
		return err
	}
	if len(live.IDs) >= e.MaxInstancesPerOwner {
		return e.quotaRefusal(owner, len(live.IDs))
	}
	return nil
}

// takeSlot is the commit step that takes a slot of owner's quota for iid, refusing past it;
// its Release gives the slot back when the registration does not commit. It is an update, not
// a fence: registrations of other instances may land in between, and each decides again on the
// list it reads.
func (e *Engine) takeSlot(ctx context.Context, owner, iid string) issue.Step {
	f := instancesOf(e.Gates, owner)
	mine := pending{InstanceID: iid, Token: subjects.NewNonce(), Until: e.until(ctx)}
	return issue.Step{
		Fence: f.Key(),
		Commit: func(ctx context.Context) (uint64, error) {
			o, err := f.Update(ctx, func(cur *fence.Observed[instances]) (instances, error) {
				next := e.withoutLapsed(cur.Row)
				next.V, next.Owner = 1, owner
				if next.IDs == nil {
					next.IDs = []string{}
				}
				if !slices.Contains(next.IDs, iid) && len(next.IDs) >= e.MaxInstancesPerOwner {
					live, err := e.live(ctx, next)
					if err != nil {
						return instances{}, err
					}
					if len(live.IDs) >= e.MaxInstancesPerOwner {
						return instances{}, e.quotaRefusal(owner, len(live.IDs))
					}
					next = live
				}
				if len(next.Pending) >= MaxPending {
					return instances{}, fault.Wrap(fault.ResourceExhausted, &issue.Exceeded{Budget: issue.PendingRegistrations},
						"owner %s has %d first registrations in flight, the most it may; retry shortly", owner, len(next.Pending))
				}
				if !slices.Contains(next.IDs, iid) {
					next.IDs = append(slices.Clone(next.IDs), iid)
					slices.Sort(next.IDs)
				}
				next.Pending = append(slices.Clone(next.Pending), mine)
				return next, nil
			})
			if err != nil {
				return 0, err
			}
			return o.Revision, nil
		},
		Release: func(ctx context.Context, cause error) error {
			if errors.Is(cause, fence.ErrUnknownOutcome) || errors.Is(cause, store.ErrUnknownOutcome) {
				return nil // the gate may yet land: the slot lapses at Until if it did not
			}
			_, err := f.Update(ctx, func(cur *fence.Observed[instances]) (instances, error) {
				next := cur.Row
				i := slices.Index(next.Pending, mine)
				if i < 0 {
					return instances{}, fence.ErrKeep // never taken, or already given back
				}
				next.Pending = slices.Delete(slices.Clone(next.Pending), i, i+1)
				if !slices.ContainsFunc(next.Pending, func(p pending) bool { return p.InstanceID == iid }) {
					g, err := issue.GateOf(e.Gates, subjects.GateEndpointManager, iid).Observe(ctx)
					if err != nil {
						return instances{}, err
					}
					if g.Absent() {
						next.IDs = slices.DeleteFunc(slices.Clone(next.IDs), func(id string) bool { return id == iid })
					}
				}
				return next, nil
			})
			if err != nil {
				return fmt.Errorf("give back the slot of instance %s (it lapses at its deadline): %w", iid, err)
			}
			return nil
		},
	}
}

// clockSkew is how far apart the clocks of two replicas may be.
const clockSkew = time.Minute

// until is when a registration made under ctx has surely stopped trying to commit: its
// deadline, plus the skew a replica's clock may have.
func (e *Engine) until(ctx context.Context) int64 {
	now := e.Pipeline.Now()
	left := 5 * time.Second
	if d, ok := ctx.Deadline(); ok {
		left = time.Until(d)
	}
	return now.Add(left + clockSkew).UnixMilli()
}

// withoutLapsed is r without the pending registrations whose deadline has passed.
func (e *Engine) withoutLapsed(r instances) instances {
	now := e.Pipeline.Now().UnixMilli()
	r.Pending = slices.DeleteFunc(slices.Clone(r.Pending), func(p pending) bool { return p.Until <= now })
	return r
}

// live is r without the instances that hold no slot: a retired gate, or no gate and no
// registration pending. Their gates are read at once, a bounded number at a time.
func (e *Engine) live(ctx context.Context, r instances) (instances, error) {
	r = e.withoutLapsed(r)
	pendingFor := map[string]bool{}
	for _, p := range r.Pending {
		pendingFor[p.InstanceID] = true
	}
	keep := make([]bool, len(r.IDs))
	errs := make([]error, len(r.IDs))
	limit := make(chan struct{}, 32)
	var wg sync.WaitGroup
	for i, iid := range r.IDs {
		limit <- struct{}{}
		wg.Go(func() {
			defer func() { <-limit }()
			g, err := issue.GateOf(e.Gates, subjects.GateEndpointManager, iid).Observe(ctx)
			switch {
			case errors.Is(err, fence.ErrGone):
				keep[i] = true // a marker: no one can tell; it counts
			case err != nil:
				errs[i] = fault.Store(err, "reading the gate of instance %s", iid)
			case g.Absent():
				keep[i] = pendingFor[iid] // its registration may yet commit
			default:
				keep[i] = g.Row.State != issue.GateRetired
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return instances{}, err
		}
	}
	out := r
	out.IDs = []string{}
	for i, iid := range r.IDs {
		if keep[i] {
			out.IDs = append(out.IDs, iid)
		}
	}
	return out, nil
}

// Reregistrations bound, an hour, the re-registrations of one instance and of one owner's
// instances: each advances an epoch and may bring fresh keys, whose claims are for life. Both
// hold per space: an instance's is kept in its gate and taken in the registration's own write
// of it (no store work of its own); an owner's is a stored budget the pipeline takes with the
// registration's new keys, all or none.
type Reregistrations struct {
	PerOwner *issue.StoredBudget
	// InstanceHourly is the instance's budget an hour, a tenth of it at once; OwnerHourly is
	// PerOwner's figure, for the refusal.
	InstanceHourly, OwnerHourly int
	Now                         func() time.Time
}

// take takes one re-registration of owner's instance iid, whose gate holds its budget b: the
// instance's budget left, to write in the gate, and the owner's share for the pipeline to
// spend. Past the instance's budget it refuses, and nothing is taken.
func (r *Reregistrations) take(b *issue.Bucket, owner, iid string) (*issue.Bucket, []issue.Spend, error) {
	if r == nil {
		return b, nil, nil
	}
	left, ok := b.Take(r.Now(), float64(r.InstanceHourly)/3600, max(r.InstanceHourly/10, 1), 1)
	if !ok {
		return nil, nil, fault.Wrap(fault.ResourceExhausted, &issue.Exceeded{Budget: issue.ReregistrationsInstance},
			"instance %s was registered again as often as --reregistrations-per-instance allows (%d an hour); retry later", iid, r.InstanceHourly)
	}
	return &left, []issue.Spend{{Want: issue.Want{From: r.PerOwner, Name: owner, N: 1},
		Refusal: fault.Wrap(fault.ResourceExhausted, &issue.Exceeded{Budget: issue.ReregistrationsOwner},
			"owner %s registered its instances again as often as --reregistrations-per-owner allows (%d an hour); retry later", owner, r.OwnerHourly)}}, nil
}
