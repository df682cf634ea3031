package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/internal/ledger"
	"github.com/cotal-ai/authplane/internal/revocation"
	"github.com/cotal-ai/authplane/internal/space"
	"github.com/cotal-ai/authplane/subjects"
)

// FillMax in Config.EndFill (`--end-fill max`) is the largest size below the set's capacity
// that leaves room for the phase's own ends.
const FillMax = -1

// endTimeout bounds one end as the platform admin waits for it: past the plane's own request
// deadline, so the plane's answer (a refusal at its deadline) is what is counted.
const endTimeout = 30 * time.Second

// EndCell is one cell of the end phase: Concurrency ends at once, Rounds times, with the data
// account's revocation set filled to Fill keys before the cell.
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
	// SetKeys is how many keys the data account's JWT revokes after the cell, and JWTBytes its
	// size.
	SetKeys  int `json:"set_keys"`
	JWTBytes int `json:"account_jwt_bytes"`
}

// runEnds runs the end phase: for each fill of cfg.EndFill in turn (the set only grows), the
// revocation set is filled to it with made-up user keys, then for each concurrency of
// cfg.EndConcurrency, cfg.EndRounds rounds of that many supervisor-ends at once, each of a
// lifecycle assigned, prepared and activated beforehand.
func runEnds(ctx context.Context, t Target, s *side, cfg Config, progress io.Writer) ([]EndCell, error) {
	admin, err := connect(ctx, t, newPlatformOwner(), "bench_admin", ledger.PlatformAdmin)
	if err != nil {
		return nil, err
	}
	defer admin.cli.Close()
	fills, err := resolveFill(cfg, t.RevocationCapacity)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(progress, "bench: ends: the revocation set holds at most %d keys; filling it to %v\n", t.RevocationCapacity, fills)
	var cells []EndCell
	for _, fill := range fills {
		if err := fillSet(ctx, t, s, fill); err != nil {
			return cells, fmt.Errorf("fill the revocation set to %d keys: %w", fill, err)
		}
		for _, c := range cfg.EndConcurrency {
			cell, err := endCell(ctx, admin.cli, s, cfg, fill, c)
			if err != nil {
				return cells, err
			}
			fmt.Fprintf(progress, "bench: ends at %d at once, set filled to %d: %.1f ends/s, p50 %.0f ms, p99 %.0f ms, failed %v; the set holds %d keys, the account JWT %d bytes\n",
				c, fill, cell.EndsPerS, cell.P50, cell.P99, cell.Failed, cell.SetKeys, cell.JWTBytes)
			cells = append(cells, cell)
		}
	}
	return cells, nil
}

// fillSet puts made-up user keys on the data account's revocation set until the account JWT
// every server holds revokes at least fill keys. It goes through the set's own Revoke, as an
// end does: the keys join the row, the account JWT is signed and pushed, and every server's
// copy is read back.
func fillSet(ctx context.Context, t Target, s *side, fill int) error {
	_, have, err := s.dataAccount(ctx)
	if err != nil || have >= fill {
		return err
	}
	keys := make([]string, 0, fill-have)
	for range fill - have {
		kp, err := nkeys.CreateUser()
		if err != nil {
			return err
		}
		pub, err := kp.PublicKey()
		if err != nil {
			return err
		}
		keys = append(keys, pub)
	}
	gates, err := s.bucket(ctx, subjects.AuthBucket(t.Keys.Space))
	if err != nil {
		return err
	}
	set := &revocation.Set{
		Gates:   gates,
		Account: t.Keys.Data.Public(),
		Sign: func(revoked map[string]int64) (string, int64, error) {
			// What the plane signs: its limits, and the set.
			return t.Keys.DataAccountJWT(space.DataPolicy{MaxConnections: t.MaxConnections, Revocations: revoked})
		},
		Broker:   s.data,
		Now:      time.Now,
		Capacity: t.RevocationCapacity,
	}
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	out, err := set.Revoke(rctx, keys)
	if err != nil {
		return err
	}
	if !out.Done() {
		return fmt.Errorf("%d keys not revoked: %s", len(out.Unrevoked), out.Reason)
	}
	return nil
}

// keysPerEnd is how many keys an end of the phase adds to the set: its lifecycle's five duty
// keys, minted by the supervised prepare and activate.
const keysPerEnd = 5

// resolveFill turns the fills of cfg into sizes: FillMax is the largest that leaves room on
// the set for the keys of every end the phase runs.
func resolveFill(cfg Config, capacity int) ([]int, error) {
	ends := 0
	for _, c := range cfg.EndConcurrency {
		ends += c * cfg.EndRounds
	}
	room := capacity - keysPerEnd*ends // the keys of earlier sizes' ends count toward a size
	var out []int
	for _, f := range cfg.EndFill {
		if f == FillMax {
			f = room
		}
		if f < 0 || f > room {
			return nil, fmt.Errorf("--end-fill %d: the set holds at most %d keys, and the phase's ends add up to %d", f, capacity, capacity-room)
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
	cell.JWTBytes, cell.SetKeys, err = s.dataAccount(ctx)
	return cell, err
}

// supervise assigns a fresh owner's fresh manager to the platform admin for an hour and
// registers it (prepare, activate) through supervisor-authority: what an end then revokes.
func supervise(ctx context.Context, admin *client.Client) (lifecycle, error) {
	m, _, err := client.NewManager()
	if err != nil {
		return lifecycle{}, err
	}
	l := lifecycle{owner: newOwner(), m: m}
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
	body := admin.SupervisorBody(l.owner, a.Revision, client.OpActivate, m)
	body.Request.RegistrationProof = &prep.RegistrationProof
	if _, err := admin.SupervisorAuthority(rctx, body); err != nil {
		return l, fmt.Errorf("supervised activate: %w", err)
	}
	return l, nil
}
