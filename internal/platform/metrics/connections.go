package metrics

import "github.com/prometheus/client_golang/prometheus"

// The data account's connection budgets (internal/platform/conns): what they refused, and what they
// hold.

// connections are the connection budgets' metrics, registered by Connections.
type connections struct {
	refused  *prometheus.CounterVec
	renewals *prometheus.CounterVec
}

// Connections registers the connection budgets' metrics: held reports the tenants' and the
// plane's own connections of the data account now.
func (m *Metrics) Connections(held func() (tenants, plane int)) {
	if m == nil {
		return
	}
	gauge := func(who string, n func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "authplane_data_connections",
			Help:        "Connections of the data account this plane counts, the tenants' and its own.",
			ConstLabels: prometheus.Labels{"who": who},
		}, n)
	}
	m.connectionMetrics()
	m.reg.MustRegister(
		gauge("tenants", func() float64 { t, _ := held(); return float64(t) }),
		gauge("plane", func() float64 { _, p := held(); return float64(p) }),
	)
}

func (m *Metrics) connectionMetrics() *connections {
	m.connOnce.Do(func() {
		m.conn = &connections{
			refused: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "authplane_connections_refused_total",
				Help: "Connections of the data account refused past a budget (principal: its cap; owner: its principals' cap together; tenants: the account less the plane's reserve), by the auth callout before they connect or by a kick after.",
			}, []string{"budget", "by"}),
			renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "authplane_plane_user_renewals_failed_total",
				Help: "Renewals of the plane's own users that failed (each is retried), by connection role.",
			}, []string{"conn"}),
		}
		m.reg.MustRegister(m.conn.refused, m.conn.renewals)
	})
	return m.conn
}

// ConnectionRefused counts one connection refused past budget (conns.BudgetPrincipal,
// conns.BudgetOwner or conns.BudgetTenants) by "callout" or "kick".
func (m *Metrics) ConnectionRefused(budget, by string) {
	if m != nil {
		m.connectionMetrics().refused.WithLabelValues(budget, by).Inc()
	}
}

// RenewalFailed counts one failed renewal of the plane's user of role conn.
func (m *Metrics) RenewalFailed(conn string) {
	if m != nil {
		m.connectionMetrics().renewals.WithLabelValues(conn).Inc()
	}
}
