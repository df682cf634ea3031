package metrics

import "github.com/prometheus/client_golang/prometheus"

// Witness registers what the plane's sampling of the owners' witness streams counts: how many
// owners have one, and how many run-starts left one pushed out by the same owner's newer ones
// past its budget (--witness-runs, --witness-bytes). Both are the space's, as this replica
// observed them since its start.
func (m *Metrics) Witness(owners func() int64, evicted func() uint64) {
	if m == nil {
		return
	}
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "authplane_witness_owners",
			Help: "Owners with a witness stream of their own, at the last sample.",
		}, func() float64 { return float64(owners()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "authplane_witness_evicted_total",
			Help: "Run-starts pushed out of their owner's witness stream by that owner's newer ones past its budget (--witness-runs, --witness-bytes), sampled; the space's figure as this replica observed it.",
		}, func() float64 { return float64(evicted()) }),
	)
}
