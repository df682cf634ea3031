package bench

import (
	"context"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/cotal-ai/authplane/client"
)

// requestTimeout bounds one request of a requester.
const requestTimeout = 10 * time.Second

// drive runs do from cfg.Requesters goroutines (goroutine i passes i) for a warm-up and then
// cfg.Duration, and counts what completed within the measured window: successes (with the
// credentials each returned), their latencies, and refusals by code. prof, when set, receives
// a CPU profile of the measured window.
func drive(ctx context.Context, cfg Config, prof io.Writer, do func(ctx context.Context, i int) (int, error)) Phase {
	type tally struct {
		lat     []time.Duration
		creds   int
		refused map[string]int
	}
	from := time.Now().Add(cfg.warmup())
	end := from.Add(cfg.Duration)
	tallies := make([]tally, cfg.Requesters)
	var wg sync.WaitGroup
	for i := range tallies {
		wg.Go(func() {
			t := &tallies[i]
			t.refused = map[string]int{}
			for ctx.Err() == nil {
				start := time.Now()
				if !start.Before(end) {
					return
				}
				rctx, cancel := context.WithTimeout(ctx, requestTimeout)
				n, err := do(rctx, i)
				cancel()
				done := time.Now()
				if done.Before(from) || !done.Before(end) {
					continue // warm-up, or past the window
				}
				switch {
				case err == nil:
					t.lat = append(t.lat, done.Sub(start))
					t.creds += n
				case client.CodeOf(err) != "":
					t.refused[client.CodeOf(err)]++
				default:
					t.refused["error"]++
				}
			}
		})
	}
	// The window's CPU time and profile are taken beside the requesters.
	var cpu time.Duration
	wg.Go(func() {
		if !sleepUntil(ctx, from) {
			return
		}
		stop, err := startProfile(prof)
		if err != nil {
			stop = func() {}
		}
		before := cpuTime()
		sleepUntil(ctx, end)
		cpu = cpuTime() - before
		stop()
	})
	wg.Wait()

	ph := Phase{Refused: map[string]int{}}
	var lat []time.Duration
	creds := 0
	for _, t := range tallies {
		lat = append(lat, t.lat...)
		creds += t.creds
		for code, n := range t.refused {
			ph.Refused[code] += n
		}
	}
	if len(ph.Refused) == 0 {
		ph.Refused = nil
	}
	slices.Sort(lat)
	secs := cfg.Duration.Seconds()
	ph.Requests = len(lat)
	ph.RequestsPerS = float64(len(lat)) / secs
	ph.CredentialsPerS = float64(creds) / secs
	ph.P50, ph.P90, ph.P99 = ms(percentile(lat, 50)), ms(percentile(lat, 90)), ms(percentile(lat, 99))
	if len(lat) > 0 {
		ph.Max = ms(lat[len(lat)-1])
		ph.CPUPerRequest = float64(cpu.Microseconds()) / float64(len(lat))
	}
	return ph
}

// percentile is the nearest-rank p-th percentile of sorted (0 when empty).
func percentile(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := (p*len(sorted) + 99) / 100 // ceil(p/100 × n)
	return sorted[max(rank, 1)-1]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// sleepUntil waits until t or until ctx ends; it reports whether t came.
func sleepUntil(ctx context.Context, t time.Time) bool {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}
