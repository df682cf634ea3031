package powercut

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/testkit"
)

// The trial counts. The default suite runs a few cuts of each kind; AUTHPLANE_POWERCUT_TRIALS=n
// runs n cuts of each (the counts: 200 on the embedded broker, 50 of each kind on the
// cluster), and AUTHPLANE_POWERCUT_SEED=s repeats a run's choices (each test logs its seed).
const (
	// cutsPerLife is how many cuts one set of disks takes before the next trial starts on fresh
	// ones: the first cut of each comes within seconds of the first start, and the checks of a
	// life stay bounded.
	cutsPerLife = 5
)

// trialCount is AUTHPLANE_POWERCUT_TRIALS, or def.
func trialCount(t *testing.T, def int) int {
	t.Helper()
	v := os.Getenv("AUTHPLANE_POWERCUT_TRIALS")
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("AUTHPLANE_POWERCUT_TRIALS=%q: want a positive count", v)
	}
	return n
}

// seed is AUTHPLANE_POWERCUT_SEED, or a fresh one; it is logged.
func seed(t *testing.T) uint64 {
	t.Helper()
	s := mrand.Uint64()
	if v := os.Getenv("AUTHPLANE_POWERCUT_SEED"); v != "" {
		var err error
		if s, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("AUTHPLANE_POWERCUT_SEED=%q: %v", v, err)
		}
	}
	t.Logf("AUTHPLANE_POWERCUT_SEED=%d", s)
	return s
}

// system is what the power is cut on: a plane with its embedded broker, or a cluster a plane
// uses. Its disks are power-cut mounts.
type system interface {
	// target is how the load and the checks reach the plane now.
	target(t *testing.T) target
	// loadGoesOn says whether the load goes on through a cut (the other servers serve on):
	// then what they acknowledge meanwhile counts too.
	loadGoesOn() bool
	// cut cuts the power of one disk or more: the processes on them stop, lose what they did
	// not sync and die. It returns the URL of a server that will restart, for the prober.
	cut(t *testing.T, rng *mrand.Rand) (probe string)
	// restart brings back what was cut, on what its disks kept, and waits until it is current
	// and the plane serves; errStart (with what was seen) when it does not.
	restart(t *testing.T) error
	// stop stops everything cleanly.
	stop(t *testing.T)
}

// settings are how a run of trials loads and cuts.
type settings struct {
	cuts int
	// A cut comes after a load time drawn from [minLoad, maxLoad), once the trial has had at
	// least minAcks acknowledgements.
	minLoad, maxLoad time.Duration
	minAcks          int
}

// trial is what one cut found.
type trial struct {
	n, life int
	loaded  time.Duration // the load's time before the cut
	acked   string        // what the trial acknowledged, by kind
	refused string        // what the load had refused or failed before the cut
	restart time.Duration // from the cut to serving again
	probes  int           // connects the prober tried with ended credentials
	losses  []loss
}

// runTrials cuts the power of systems start starts, s.cuts times, on fresh disks every
// cutsPerLife cuts, under the load, and returns what each cut found.
func runTrials(t *testing.T, s settings, start func(t *testing.T) system) []trial {
	t.Helper()
	sd := seed(t)
	rng := mrand.New(mrand.NewPCG(sd, 0))
	var trials []trial
	for n, lifeN := 0, 1; n < s.cuts; lifeN++ {
		sys := start(t)
		a, lf := newAcks(t), &life{}
		data := sys.target(t).keys.Data.Public()
		grantLoad(t, sys.target(t), a)
		for k := 0; k < cutsPerLife && n < s.cuts; k++ {
			n++
			tr := cutOnce(t, sys, a, lf, s, rng, n, sd+uint64(n))
			tr.n, tr.life = n, lifeN
			if tr.restart >= 0 {
				if got := sys.target(t).keys.Data.Public(); got != data {
					tr.losses = append(tr.losses, loss{"space material", fmt.Sprintf("the data account is %s after the cut, want %s", got, data)})
				}
			}
			trials = append(trials, tr)
			served := "did not serve again"
			if tr.restart >= 0 {
				served = fmt.Sprintf("served again %s after the cut", tr.restart.Round(time.Millisecond))
			}
			t.Logf("cut %d (life %d, after %s of load): acknowledged %s; load refusals %s; %s; %d connects of ended credentials tried meanwhile; lost %d%s",
				n, lifeN, tr.loaded.Round(time.Millisecond), tr.acked, tr.refused, served, tr.probes, len(tr.losses), firstLosses(tr.losses, 3))
			if tr.restart < 0 {
				break // it did not serve again: the next life starts on fresh disks
			}
		}
		sys.stop(t)
	}
	return trials
}

// cutOnce loads sys, cuts its power at a moment drawn from s, restarts it, and checks
// everything a acknowledged. A restart that does not serve is a loss, and its restart time -1.
func cutOnce(t *testing.T, sys system, a *acks, lf *life, s settings, rng *mrand.Rand, n int, seed uint64) trial {
	t.Helper()
	var tr trial
	a.beginTrial(n)
	l := startLoad(t, sys.target(t), a, lf, seed)
	tr.loaded = waitToCut(t, a, rng, s)
	goesOn := sys.loadGoesOn()
	if !goesOn {
		a.beginCut() // before the cut begins: an answer read after it does not count
	}
	cutAt := time.Now()
	probe := sys.cut(t, rng)
	if !goesOn {
		l.finish()
	}
	tr.acked, tr.refused = a.summary()
	pr := startProber(probe, a.endedCreds(), cutAt)
	err := sys.restart(t)
	tr.restart = time.Since(cutAt)
	if goesOn {
		a.beginCut()
		l.finish()
		tr.acked, tr.refused = a.summary()
	}
	if err != nil {
		tr.restart = -1
		tr.losses = append(tr.losses, loss{"plane", err.Error()})
	} else {
		tr.losses = check(t, sys.target(t), a)
	}
	admitted, probes := pr.finish()
	tr.losses, tr.probes = append(tr.losses, admitted...), probes
	return tr
}

// grantLoad grants the load's principals what they need, as acknowledged scopes: ownerA.cli
// supervise, ownerP.admin platform-admin.
func grantLoad(t *testing.T, tg target, a *acks) {
	t.Helper()
	for _, g := range []struct{ owner, actor, scope string }{
		{harness.OwnerA, cliActor, "supervise"}, {harness.OwnerP, adminActor, "platform-admin"},
	} {
		// Asked again until it lands, as an operator would: a cluster just back from a stop
		// may still be electing its stream leaders.
		testkit.CheckFor(t, 90*time.Second, 100*time.Millisecond, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := admin.Grant(ctx, tg.keys, tg.url, g.owner, g.actor, []string{g.scope}); err != nil {
				return fmt.Errorf("grant %s: %w", g.scope, err)
			}
			return nil
		})
		principal := g.owner + "." + g.actor
		a.ack(kindScope, map[string]any{"principal": principal, "scope": []string{g.scope}}, func() {
			a.scopes[principal] = &scopeAck{Scope: []string{g.scope}}
		})
	}
}

// waitToCut waits a load time drawn from s, and until the trial has s.minAcks
// acknowledgements; it returns how long the load ran.
func waitToCut(t *testing.T, a *acks, rng *mrand.Rand, s settings) time.Duration {
	t.Helper()
	start := time.Now()
	loadFor := s.minLoad + time.Duration(rng.Int64N(int64(s.maxLoad-s.minLoad)))
	testkit.CheckFor(t, loadFor+60*time.Second, 10*time.Millisecond, func() error {
		acked, refused := a.summary()
		if took := time.Since(start); took < loadFor || a.acked() < s.minAcks {
			return fmt.Errorf("%s of load, acknowledged %s, want %s and %d acknowledgements (refused: %s)", took.Round(time.Millisecond), acked, loadFor, s.minAcks, refused)
		}
		return nil
	})
	return time.Since(start)
}

// firstLosses lists the first n losses, for a trial's log line.
func firstLosses(losses []loss, n int) string {
	if len(losses) == 0 {
		return ""
	}
	var lines []string
	for i, l := range losses {
		if i == n {
			lines = append(lines, fmt.Sprintf("… and %d more", len(losses)-n))
			break
		}
		lines = append(lines, l.String())
	}
	return ":\n  " + strings.Join(lines, "\n  ")
}

// report appends a summary of the trials to the test report and returns the losses by kind.
func report(t *testing.T, what string, trials []trial) (lost map[string]int) {
	t.Helper()
	lost = map[string]int{}
	cutsWithLoss, probes := 0, 0
	acked := map[string]int{}
	for _, tr := range trials {
		for _, l := range tr.losses {
			lost[l.kind]++
		}
		if len(tr.losses) > 0 {
			cutsWithLoss++
		}
		probes += tr.probes
		for _, part := range strings.Split(tr.acked, ", ") {
			if kind, n, ok := strings.Cut(part, " ×"); ok {
				c, _ := strconv.Atoi(n)
				acked[kind] += c
			}
		}
	}
	harness.Report(t, "%s: %d cuts under load; acknowledged before them %s; %d cuts took back something acknowledged, lost by kind: %s; %d connects of ended credentials tried during the restarts",
		what, len(trials), counted(acked), cutsWithLoss, counted(lost), probes)
	return lost
}

// wantNoLoss fails the test with every loss, at most maxShown of them written out.
func wantNoLoss(t *testing.T, trials []trial) {
	t.Helper()
	const maxShown = 40
	shown := 0
	for _, tr := range trials {
		for _, l := range tr.losses {
			if shown++; shown <= maxShown {
				t.Errorf("cut %d (life %d): lost %s", tr.n, tr.life, l)
			}
		}
	}
	if shown > maxShown {
		t.Errorf("… and %d more losses", shown-maxShown)
	}
}
