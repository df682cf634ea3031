package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/internal/capability/manager"
	"github.com/cotal-ai/authplane/internal/capability/signers"
	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/internal/platform/space"
	"github.com/cotal-ai/authplane/subjects"
)

// FillMax in Config.EndFill (`--end-fill max`) is the largest number of live instances below
// the space's capacity that leaves room for the phase's own ends.
const FillMax = -1

// endTimeout bounds one end as the platform admin waits for it: past the plane's own request
// deadline, so the plane's answer (a refusal at its deadline) is what is counted.
const endTimeout = 30 * time.Second

// EndCell is one cell of the end phase: Concurrency ends at once, Rounds times, with the data
// account's JWT listing the signing keys of Fill live instances before the cell.
type EndCell struct {
	Fill        int `json:"fill"`
	Concurrency int `json:"concurrency"`
	// Ends counts the ends that answered with the broker's revocation confirmed (revoked.done);
	// Failed the others, by refusal code, "not-done" for an answer without the confirmation and
	// "error" for no answer.
	Ends   int            `json:"ends"`
	Failed map[string]int `json:"failed,omitempty"`
	// NotEvicted counts confirmed ends whose eviction was not complete.
	NotEvicted int `json:"not_evicted,omitempty"`
	// EndsPerS is confirmed ends per second of the cell's rounds.
	EndsPerS float64 `json:"ends_per_s"`
	// Latencies of every answered end (confirmed or not), in milliseconds.
	P50 float64 `json:"p50_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
	// Signers is how many signing keys the data account's JWT lists after the cell, and
	// JWTBytes its size.
	Signers  int `json:"signers"`
	JWTBytes int `json:"account_jwt_bytes"`
}

// runEnds runs the end phase: for each fill of cfg.EndFill in turn (the set only grows), the
// data account's JWT is made to list that many live instances' signing keys (made-up instances
// whose gates are open), then for each concurrency of cfg.EndConcurrency, cfg.EndRounds rounds
// of that many supervisor-ends at once, each of a lifecycle assigned, prepared and activated
// beforehand.
func runEnds(ctx context.Context, t Target, s *side, cfg Config, progress io.Writer) ([]EndCell, error) {
	admin, err := connect(ctx, t, newPlatformOwner(), "bench_admin", manager.PlatformAdmin)
	if err != nil {
		return nil, err
	}
	defer admin.cli.Close()
	fills, err := resolveFill(cfg, t.InstanceCapacity)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(progress, "bench: ends: the space holds at most %d live instances; filling it to %v\n", t.InstanceCapacity, fills)
	var cells []EndCell
	for _, fill := range fills {
		if err := fillSet(ctx, t, s, fill); err != nil {
			return cells, fmt.Errorf("fill the data account's signing keys to %d: %w", fill, err)
		}
		for _, c := range cfg.EndConcurrency {
			cell, err := endCell(ctx, admin.cli, s, cfg, fill, c)
			if err != nil {
				return cells, err
			}
			fmt.Fprintf(progress, "bench: ends at %d at once, %d live instances: %.1f ends/s, p50 %.0f ms, p99 %.0f ms, failed %v; the account JWT lists %d keys in %d bytes\n",
				c, fill, cell.EndsPerS, cell.P50, cell.P99, cell.Failed, cell.Signers, cell.JWTBytes)
			cells = append(cells, cell)
		}
	}
	return cells, nil
}

// fillSet registers made-up instances (open gates) and has their signing keys listed until
// the account JWT every server holds lists at least fill of them. It goes through the set's
// own rounds, as a first prepare does: the instances join the row, the account JWT is signed
// and pushed, and every server's copy is read back.
func fillSet(ctx context.Context, t Target, s *side, fill int) error {
	_, have, err := s.dataAccount(ctx)
	if err != nil || have-1 >= fill { // the account's own key is listed too
		return err
	}
	gates, err := s.bucket(ctx, subjects.AuthBucket(t.Keys.Space))
	if err != nil {
		return err
	}
	set, err := benchSigners(t, gates, s)
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, fill-(have-1))
	sem := make(chan struct{}, 256)
	for i := range errs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			iid := subjects.NewSecret(16)
			row := issue.GateRow{State: issue.GateOpen, Generation: 1, RegistrationRevision: 1, Principal: subjects.Principal(newOwner(), subjects.ServeActor(iid))}
			if _, errs[i] = issue.GateOf(gates, subjects.GateEndpointManager, iid).Update(rctx, func(*issue.Gate) (issue.GateRow, error) { return row, nil }); errs[i] != nil {
				return
			}
			_, errs[i] = set.Issuer(rctx, iid, 0, true)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// benchSigners is the data account's signer set as the plane keeps it, on the plane's bucket.
func benchSigners(t Target, gates fence.KV, s *side) (*signers.Set, error) {
	keys, err := signers.NewKeys(t.Keys.Space, t.Keys.Data.Public(), t.Keys.Data.Signer, time.Now)
	if err != nil {
		return nil, err
	}
	return &signers.Set{Gates: gates, Account: t.Keys.Data.Public(), Keys: keys, Broker: s.data, Now: time.Now,
		Capacity: t.InstanceCapacity, Settle: time.Hour,
		Sign: func(signing []string, held map[string]int64) (string, int64, error) {
			// What the plane signs: its limits, the keys and the held.
			return t.Keys.DataAccountJWT(space.DataPolicy{MaxConnections: t.MaxConnections, Signers: signing, Revoked: held})
		}}, nil
}

// resolveFill turns the fills of cfg into sizes: FillMax is the largest that leaves room in
// the space for the instance of every end the phase runs.
func resolveFill(cfg Config, capacity int) ([]int, error) {
	ends := 0
	for _, c := range cfg.EndConcurrency {
		ends += c * cfg.EndRounds
	}
	room := capacity - ends // the instances of earlier sizes' ends count toward a size until ended
	var out []int
	for _, f := range cfg.EndFill {
		if f == FillMax {
			f = room
		}
		if f < 0 || f > room {
			return nil, fmt.Errorf("--end-fill %d: the space holds at most %d live instances, and the phase's ends add up to %d", f, capacity, capacity-room)
		}
		out = append(out, f)
	}
	if !slices.IsSorted(out) {
		return nil, fmt.Errorf("--end-fill %v: want ascending sizes", out)
	}
	return out, nil
}

// lifecycle is one owner's supervised manager, ready to be ended.
type lifecycle struct {
	owner string
	m     client.Manager
	// supervisor and seed are its supervisor credential, for a connect after the end.
	supervisor, seed string
}

// endCell sets up rounds × c lifecycles, then ends them c at a time and counts.
func endCell(ctx context.Context, admin *client.Client, s *side, cfg Config, fill, c int) (EndCell, error) {
	cell := EndCell{Fill: fill, Concurrency: c, Failed: map[string]int{}}
	lives := make([]lifecycle, cfg.EndRounds*c)
	errs := make([]error, len(lives))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i := range lives {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			lives[i], errs[i] = supervise(ctx, admin)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return cell, fmt.Errorf("set up the lifecycles to end: %w", err)
	}

	var mu sync.Mutex
	var lat []time.Duration
	start := time.Now()
	for r := range cfg.EndRounds {
		for _, l := range lives[r*c : (r+1)*c] {
			wg.Go(func() {
				ectx, cancel := context.WithTimeout(ctx, endTimeout)
				defer cancel()
				began := time.Now()
				report, err := admin.End(ectx, client.End{Owner: l.owner, InstanceID: l.m.InstanceID, LifecycleUID: l.m.LifecycleUID, Reason: "bench"})
				took := time.Since(began)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil && report.Revoked.Done:
					cell.Ends++
					if !report.Evicted.Complete {
						cell.NotEvicted++
					}
				case err == nil:
					cell.Failed["not-done"]++
				case client.CodeOf(err) != "":
					cell.Failed[client.CodeOf(err)]++
				default:
					cell.Failed["error"]++
					return // no answer: no latency
				}
				lat = append(lat, took)
			})
		}
		wg.Wait()
	}
	wall := time.Since(start)
	if ctx.Err() != nil {
		return cell, ctx.Err()
	}
	if len(cell.Failed) == 0 {
		cell.Failed = nil
	}
	slices.Sort(lat)
	cell.EndsPerS = float64(cell.Ends) / wall.Seconds()
	cell.P50, cell.P99 = ms(percentile(lat, 50)), ms(percentile(lat, 99))
	if len(lat) > 0 {
		cell.Max = ms(lat[len(lat)-1])
	}
	var err error
	cell.JWTBytes, cell.Signers, err = s.dataAccount(ctx)
	return cell, err
}

// supervise assigns a fresh owner's fresh manager to the platform admin for an hour and
// registers it (prepare, activate) through supervisor-authority: what an end then revokes.
func supervise(ctx context.Context, admin *client.Client) (lifecycle, error) {
	m, keys, err := client.NewManager()
	if err != nil {
		return lifecycle{}, err
	}
	seed, err := keys[subjects.DutySupervisor].Seed()
	if err != nil {
		return lifecycle{}, err
	}
	l := lifecycle{owner: newOwner(), m: m, seed: string(seed)}
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	a, err := admin.Assign(rctx, client.Assign{Owner: l.owner, InstanceID: m.InstanceID, LifecycleUID: m.LifecycleUID, ExpiresAt: time.Now().Add(time.Hour).Unix()})
	if err != nil {
		return l, fmt.Errorf("assign: %w", err)
	}
	prep, err := admin.SupervisorAuthority(rctx, admin.SupervisorBody(l.owner, a.Revision, client.OpPrepare, m))
	if err != nil {
		return l, fmt.Errorf("supervised prepare: %w", err)
	}
	l.supervisor = prep.Credentials[string(subjects.DutySupervisor)].JWT
	body := admin.SupervisorBody(l.owner, a.Revision, client.OpActivate, m)
	body.Request.RegistrationProof = &prep.RegistrationProof
	if _, err := admin.SupervisorAuthority(rctx, body); err != nil {
		return l, fmt.Errorf("supervised activate: %w", err)
	}
	return l, nil
}
