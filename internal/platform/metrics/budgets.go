package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cotal-ai/authplane/internal/core/issue"
)

// The budgets of the HTTP faces, the label of authplane_http_refused_total.
const (
	// BudgetInFlight is a face's cap on requests in flight: the public face's every peer
	// together, the loopback face's doors.
	BudgetInFlight = "inflight"
	// BudgetPeerInFlight is one public peer's share of the face's requests in flight.
	BudgetPeerInFlight = "peer_inflight"
	// BudgetBodyTimeout is the time a door waits for a body after the headers.
	BudgetBodyTimeout = "body_timeout"
)

func newBudgets() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "authplane_http_refused_total",
		Help: "HTTP requests refused by a face's budget, by face (loopback, public) and budget (inflight, peer_inflight, body_timeout).",
	}, []string{"face", "budget"})
}

// HTTPRefused counts one request that face refused past budget.
func (m *Metrics) HTTPRefused(face, budget string) {
	if m != nil {
		m.budgets.WithLabelValues(face, budget).Inc()
	}
}

// Why an auditor's consumer creation was refused, the label of
// authplane_auditor_consumers_refused_total.
const (
	// AuditorConsumerPush is a push consumer: it would deliver where its creator said.
	AuditorConsumerPush = "push"
	// AuditorConsumerLimit is a stream at its max_consumers (--auditor-consumers).
	AuditorConsumerLimit = "max_consumers"
	// AuditorConsumerMalformed is a request that is not a consumer creation of those streams.
	AuditorConsumerMalformed = "malformed"
)

func newAuditorConsumers() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "authplane_auditor_consumers_refused_total",
		Help: "Auditors' consumer creations on the minted and audit streams refused, by reason (push, max_consumers, malformed).",
	}, []string{"reason"})
}

// AuditorConsumerRefused counts one auditor's consumer creation refused for reason.
func (m *Metrics) AuditorConsumerRefused(reason string) {
	if m != nil {
		m.auditors.WithLabelValues(reason).Inc()
	}
}

func newTenantBudgets() *prometheus.CounterVec {
	v := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "authplane_tenant_budget_refused_total",
		Help: "Requests refused past a tenant's budget, by budget (reregistrations_instance, reregistrations_owner, new_keys_owner, connection_keys_owner, pending_registrations).",
	}, []string{"budget"})
	for _, b := range issue.BudgetNames {
		v.WithLabelValues(b) // every series from the start, at 0
	}
	return v
}

// TenantBudgetRefused counts one request refused past the tenant budget b.
func (m *Metrics) TenantBudgetRefused(b string) {
	if m != nil {
		m.tenantBudgets.WithLabelValues(b).Inc()
	}
}
