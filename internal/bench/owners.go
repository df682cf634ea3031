package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/internal/capability/manager"
	"github.com/cotal-ai/authplane/internal/core/fault"
)

// Owners is the owners phase: Owners owners, each with its own principal and connection, each
// tries to register as many manager instances as its quota allows and one more (first
// prepares, PreparesPerOwner in flight, an owner stopping at its first resource-exhausted and
// going on past an unanswered or unavailable one). Then one more owner's instance, supervised
// and registered before the fill, is ended.
type Owners struct {
	Owners int `json:"owners"`
	// Quota is each owner's --max-instances-per-owner; Capacity the space's.
	Quota    int `json:"quota"`
	Capacity int `json:"capacity"`
	// Live is how many live instances the data account's JWT lists once the owners are done
	// (the ended owner's among them), in JWTBytes bytes.
	Live     int `json:"live"`
	JWTBytes int `json:"account_jwt_bytes"`
	// In counts the owners that registered at least one instance; Held counts owners by how
	// many instances each holds (0 included).
	In   int         `json:"owners_in"`
	Held map[int]int `json:"held"`
	// Prepares counts the prepares that registered an instance; Refused the others by code
	// ("error" for no answer), resource-exhausted told apart as "…: quota" and "…: capacity".
	Prepares int            `json:"prepares"`
	Refused  map[string]int `json:"refused"`
	// FullS is when the last prepare that registered an instance answered, AllS when every
	// owner stopped, in seconds from the first prepare.
	FullS float64 `json:"full_s"`
	AllS  float64 `json:"all_s"`
	// Listed is how many keys of instances that registered nothing (prepares refused after
	// their key was listed) were still listed when every owner stopped; ListedS how long
	// after that the last of them left (0: none was listed; -1: one was still listed 3 min on).
	Listed  int     `json:"listed_unregistered"`
	ListedS float64 `json:"listed_unregistered_s"`
	// EndMs is the end's latency; EndDone says it answered with the broker's revocation
	// confirmed (EndRefused is its code otherwise); CredsRefused that the broker then refused
	// the ended instance's supervisor credential at connect.
	EndMs        float64 `json:"end_ms"`
	EndDone      bool    `json:"end_done"`
	EndRefused   string  `json:"end_refused,omitempty"`
	CredsRefused bool    `json:"ended_credential_refused"`
}

// PreparesPerOwner is how many first prepares each owner of the fill has in flight (within an
// owner's MaxPending); cfg.Workers / PreparesPerOwner owners fill at a time, so that the
// plane's workers answer every prepare in flight at once.
const PreparesPerOwner = 8

// runOwners runs the owners phase.
func runOwners(ctx context.Context, t Target, s *side, cfg Config, progress io.Writer) (*Owners, error) {
	out := &Owners{Owners: cfg.Owners, Quota: t.MaxInstancesPerOwner, Capacity: t.InstanceCapacity, Held: map[int]int{}, Refused: map[string]int{}}
	admin, err := connect(ctx, t, newPlatformOwner(), "bench_admin", manager.PlatformAdmin)
	if err != nil {
		return nil, err
	}
	defer admin.cli.Close()
	kept, err := supervise(ctx, admin.cli)
	if err != nil {
		return nil, fmt.Errorf("the instance to end: %w", err)
	}
	fmt.Fprintf(progress, "bench: owners: %d owners, each trying %d first prepares (the quota and one more) in a space of %d\n", cfg.Owners, t.MaxInstancesPerOwner+1, t.InstanceCapacity)
	reqs := make([]*requester, cfg.Owners)
	defer closeAll(reqs)
	errs := make([]error, cfg.Owners)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i := range reqs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			reqs[i], errs[i] = connect(ctx, t, newOwner(), "cli", manager.Supervise)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("connect the owners: %w", err)
	}

	var mu sync.Mutex
	start := time.Now()
	var full time.Duration
	held := make([]int, cfg.Owners)
	owners := make(chan struct{}, max(cfg.Workers/PreparesPerOwner, 1))
	for i, q := range reqs {
		owners <- struct{}{}
		wg.Go(func() {
			defer func() { <-owners }()
			tries := make(chan struct{}, t.MaxInstancesPerOwner+1)
			for range cap(tries) {
				tries <- struct{}{}
			}
			close(tries)
			var stop sync.Once
			stopped := make(chan struct{})
			var each sync.WaitGroup
			for range PreparesPerOwner {
				each.Go(func() {
					for range tries {
						select {
						case <-stopped:
							return
						default:
						}
						code := firstPrepare(ctx, q.cli)
						mu.Lock()
						if code == "" {
							out.Prepares++
							held[i]++
							full = time.Since(start)
						} else {
							out.Refused[code]++
						}
						mu.Unlock()
						if strings.HasPrefix(code, string(fault.ResourceExhausted)) {
							stop.Do(func() { close(stopped) })
						}
					}
				})
			}
			each.Wait()
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out.FullS, out.AllS = full.Seconds(), time.Since(start).Seconds()
	for _, n := range held {
		out.Held[n]++
		if n > 0 {
			out.In++
		}
	}
	if out.JWTBytes, out.Live, err = s.dataAccount(ctx); err != nil {
		return nil, err
	}
	out.Live--                                                    // the account's own key
	if out.Listed = out.Live - out.Prepares - 1; out.Listed > 0 { // the ended owner's is live too
		if out.ListedS, err = unlisted(ctx, s, out.Prepares+1); err != nil {
			return nil, err
		}
	}
	fmt.Fprintf(progress, "bench: owners: %d live instances in %.1f s (all owners stopped at %.1f s), %d owners in (%s), refused %v; the account JWT is %d bytes; %d keys of refused prepares listed, gone %.1f s later\n",
		out.Live, out.FullS, out.AllS, out.In, HeldText(out.Held), out.Refused, out.JWTBytes, out.Listed, out.ListedS)

	ectx, cancel := context.WithTimeout(ctx, endTimeout)
	defer cancel()
	began := time.Now()
	report, err := admin.cli.End(ectx, client.End{Owner: kept.owner, InstanceID: kept.m.InstanceID, LifecycleUID: kept.m.LifecycleUID, Reason: "bench"})
	out.EndMs = ms(time.Since(began))
	switch {
	case err == nil:
		out.EndDone = report.Revoked.Done
	case client.CodeOf(err) != "":
		out.EndRefused = client.CodeOf(err)
	default:
		return nil, fmt.Errorf("the end: %w", err)
	}
	nc, err := nats.Connect(t.NATSURL, nats.UserJWTAndSeed(kept.supervisor, kept.seed), nats.NoReconnect())
	if err == nil {
		nc.Close()
	}
	out.CredsRefused = err != nil
	fmt.Fprintf(progress, "bench: owners: the other owner's end took %.0f ms, done %v (refused %q); its supervisor credential refused at connect: %v\n",
		out.EndMs, out.EndDone, out.EndRefused, out.CredsRefused)
	return out, nil
}

// unlisted polls the data account's JWT until it lists at most live instances, and returns how
// long that took, or -1 after 3 minutes (past the sweep of keys of registrations that never
// committed).
func unlisted(ctx context.Context, s *side, live int) (float64, error) {
	began := time.Now()
	for time.Since(began) < 3*time.Minute {
		_, n, err := s.dataAccount(ctx)
		if err != nil {
			return 0, err
		}
		if n-1 <= live {
			return time.Since(began).Seconds(), nil
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	return -1, nil
}

// firstPrepare registers a fresh instance and returns "" or the refusal's code ("error" for no
// answer).
func firstPrepare(ctx context.Context, cli *client.Client) string {
	m, _, err := client.NewManager()
	if err != nil {
		return "error"
	}
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	if _, err = cli.Prepare(rctx, m); err == nil {
		return ""
	}
	var r *client.Refusal
	switch {
	case !errors.As(err, &r):
		return "error"
	case r.Code != string(fault.ResourceExhausted):
		return r.Code
	case strings.Contains(r.Message, "--max-instances-per-owner"):
		return r.Code + ": quota"
	case strings.Contains(r.Message, "manager instances, as many as"):
		return r.Code + ": capacity"
	}
	return r.Code
}

// HeldText is held as "64×206, 0×794": instances × owners holding that many, most first.
func HeldText(held map[int]int) string {
	text := ""
	for _, n := range slices.Backward(slices.Sorted(maps.Keys(held))) {
		if text != "" {
			text += ", "
		}
		text += fmt.Sprintf("%d×%d", n, held[n])
	}
	return text
}
