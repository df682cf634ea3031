// Package metrics is what the plane exports to Prometheus on its loopback face (`GET
// /metrics`): every call by endpoint and code with its latency, the credentials issued
// and the mints discarded, the fence writers' CAS retries, the store's errors by class, the
// plane's epoch and fenced state, and its connections' reconnects. Each plane has its own
// registry; every label takes its values from a closed set (endpoints, refusal codes, duties,
// connection roles), never from what a caller sent.
package metrics

import (
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/cotal-ai/authplane/internal/core/store"
)

// CodeOK is the code label of a call that was served.
const CodeOK = "ok"

// Metrics are one plane's. A nil *Metrics counts nothing.
type Metrics struct {
	reg        *prometheus.Registry
	requests   *prometheus.CounterVec
	latency    *prometheus.HistogramVec
	issued     *prometheus.CounterVec
	discarded  *prometheus.CounterVec
	reconnects *prometheus.CounterVec
	summarized *prometheus.CounterVec
	budgets    *prometheus.CounterVec
	auditors   *prometheus.CounterVec
	// tenantBudgets counts the refusals past a tenant's budget of the bus and HTTP doors.
	tenantBudgets *prometheus.CounterVec

	connOnce sync.Once
	conn     *connections
}

// New registers the plane's metrics; epoch and fenced report its process epoch and whether it
// was fenced by a newer instance, retries how many fence writes its stores retried.
func New(epoch func() uint64, fenced func() bool, retries func() int64) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "authplane_requests_total",
			Help: "Calls answered, by endpoint and code (ok, or the refusal's code).",
		}, []string{"endpoint", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "authplane_request_duration_seconds",
			Help:    "Time from a call passing the rate limit to its answer, by endpoint.",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, 1, 5},
		}, []string{"endpoint"}),
		issued: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "authplane_credentials_issued_total",
			Help: "Credentials whose mint committed, by endpoint and duty.",
		}, []string{"endpoint", "duty"}),
		discarded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "authplane_mints_discarded_total",
			Help: "Mints signed and recorded that did not commit, by endpoint and code.",
		}, []string{"endpoint", "code"}),
		reconnects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "authplane_nats_reconnects_total",
			Help: "Reconnections of the plane's own NATS connections, by role.",
		}, []string{"conn"}),
		summarized: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "authplane_audit_summarized_total",
			Help: "Audit records past their owner's budget of the minute (--audit-records), counted in a summary record instead of written, by decision, in this process.",
		}, []string{"decision"}),
	}
	kvErrors := func(class string, n func() int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "authplane_kv_errors_total",
			Help:        "Errors of the store's JetStream calls in this process, by class.",
			ConstLabels: prometheus.Labels{"class": class},
		}, func() float64 { return float64(n()) })
	}
	m.budgets, m.auditors, m.tenantBudgets = newBudgets(), newAuditorConsumers(), newTenantBudgets()
	m.reg.MustRegister(m.requests, m.latency, m.issued, m.discarded, m.reconnects, m.budgets, m.auditors, m.tenantBudgets, m.summarized,
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "authplane_cas_retries_total",
			Help: "Fence writes retried after a lost CAS or an unknown outcome, in this process.",
		}, func() float64 { return float64(retries()) }),
		kvErrors("cas_lost", store.Errors.CASLost.Load),
		kvErrors("full", store.Errors.Full.Load),
		kvErrors("unknown_outcome", store.Errors.UnknownOutcome.Load),
		kvErrors("refused", store.Errors.Refused.Load),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "authplane_process_epoch",
			Help: "The process epoch this plane registered at start.",
		}, func() float64 { return float64(epoch()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "authplane_fenced",
			Help: "1 once a newer registration of this plane's instance fenced it.",
		}, func() float64 {
			if fenced() {
				return 1
			}
			return 0
		}),
		collectors.NewGoCollector(collectors.WithGoCollectorMemStatsMetricsDisabled()),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

// Handler serves the registry in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// Served counts a call answered with code (CodeOK when served) after took.
func (m *Metrics) Served(endpoint, code string, took time.Duration) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(endpoint, code).Inc()
	m.latency.WithLabelValues(endpoint).Observe(took.Seconds())
}

// Refused counts a call refused before it could be timed (throttled, or refused by an HTTP
// door before its caller was known).
func (m *Metrics) Refused(endpoint, code string) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(endpoint, code).Inc()
}

// Issued counts one committed credential of duty.
func (m *Metrics) Issued(endpoint, duty string) {
	if m != nil {
		m.issued.WithLabelValues(endpoint, duty).Inc()
	}
}

// Discarded counts one mint that did not commit.
func (m *Metrics) Discarded(endpoint, code string) {
	if m != nil {
		m.discarded.WithLabelValues(endpoint, code).Inc()
	}
}

// Reconnected counts one reconnection of the plane's connection of role conn.
func (m *Metrics) Reconnected(conn string) {
	if m != nil {
		m.reconnects.WithLabelValues(conn).Inc()
	}
}

// Summarized counts one audit record of decision counted in its owner's summary instead of
// written.
func (m *Metrics) Summarized(decision string) {
	if m != nil {
		m.summarized.WithLabelValues(decision).Inc()
	}
}

// Unsynced registers how many of the broker's servers did not sync every write at the plane's
// last reading of their settings (servers; the plane reads them every 30 s).
func (m *Metrics) Unsynced(servers func() int) {
	if m == nil {
		return
	}
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "authplane_unsynced_servers",
		Help: "Servers of the broker that acknowledge JetStream writes before they are on disk (not sync_interval: always), at the last reading; the plane serves on them only with --allow-unsynced.",
	}, func() float64 { return float64(servers()) }))
}
