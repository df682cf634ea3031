package service

import (
	"context"
	"time"
)

// WitnessSampleEvery is how often the plane samples the owners' witness streams for
// authplane_witness_owners and authplane_witness_evicted_total: well within the streams' five
// minutes, so what it counts as pushed out is exact to within ten seconds of run-starts.
const WitnessSampleEvery = 10 * time.Second

// watchWitnesses first makes the witness of every owner with instances that has none (after
// an upgrade from the shared witness), then samples the owners' witness streams until the
// plane closes, and registers what it counts with the metrics.
func (p *Plane) watchWitnesses() {
	every := WitnessSampleEvery
	if p.cfg.Hooks != nil && p.cfg.Hooks.WitnessSampleEvery > 0 {
		every = p.cfg.Hooks.WitnessSampleEvery
	}
	p.metrics.Witness(p.stores.WitnessOwners, p.stores.WitnessEvicted)
	p.untilClose("stop sampling the witness streams", func(ctx context.Context) {
		if made, err := p.stores.OpenEveryWitness(ctx); err != nil && ctx.Err() == nil {
			p.log.Warn("the witness streams of the owners with instances were not all made; each is made at its managers' next serve credential", "err", err)
		} else if made > 0 {
			p.log.Info("made the witness streams of owners with instances", "owners", made)
		}
		onEveryTick(ctx, every, true, func() {
			sctx, cancel := context.WithTimeout(ctx, every)
			err := p.stores.SampleWitnesses(sctx, p.cfg.Now())
			cancel()
			if err != nil && ctx.Err() == nil {
				p.log.Warn("witness streams not sampled", "err", err)
			}
		})
	})
}
