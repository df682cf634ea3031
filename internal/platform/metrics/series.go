package metrics

// EndpointHTTP is the endpoint label of a refusal the HTTP face makes before any door has the
// request: a wrong method, path, origin, content type or capability, a body too large or not
// JSON, a face that is busy.
const EndpointHTTP = "http"

// Series are the label values a plane's series take. Declare makes each series exist from
// the start, at 0: an alert on a counter that has never moved still has something to read. A
// call's series of another code appears with its first such answer, and an endpoint's latency
// with its first call, so that /metrics stays short.
type Series struct {
	// Codes are the codes of each endpoint's calls declared from the start.
	Codes map[string][]string
	// Duties are the duties each minting endpoint issues.
	Duties map[string][]string
	// DiscardCodes are the codes a mint that did not commit is refused with.
	DiscardCodes []string
	// Conns are the roles of the plane's own NATS connections.
	Conns []string
	// ConnectionBudgets are the data account's connection budgets (refused by the callout, or
	// kicked).
	ConnectionBudgets []string
	// Decisions are the audit stream's decisions, each with its owners' budget.
	Decisions []string
}

// Declare creates every series s names, at 0.
func (m *Metrics) Declare(s Series) {
	if m == nil {
		return
	}
	for endpoint, codes := range s.Codes {
		for _, code := range codes {
			m.requests.WithLabelValues(endpoint, code)
		}
	}
	for endpoint, duties := range s.Duties {
		for _, duty := range duties {
			m.issued.WithLabelValues(endpoint, duty)
		}
		for _, code := range s.DiscardCodes {
			m.discarded.WithLabelValues(endpoint, code)
		}
	}
	c := m.connectionMetrics()
	for _, conn := range s.Conns {
		m.reconnects.WithLabelValues(conn)
		c.renewals.WithLabelValues(conn)
	}
	for _, budget := range s.ConnectionBudgets {
		for _, by := range []string{"callout", "kick"} {
			c.refused.WithLabelValues(budget, by)
		}
	}
	for _, b := range [][2]string{{"public", BudgetInFlight}, {"public", BudgetPeerInFlight}, {"public", BudgetBodyTimeout},
		{"loopback", BudgetInFlight}, {"loopback", BudgetBodyTimeout}} {
		m.budgets.WithLabelValues(b[0], b[1])
	}
	for _, d := range s.Decisions {
		m.summarized.WithLabelValues(d)
	}
	for _, reason := range []string{AuditorConsumerPush, AuditorConsumerLimit, AuditorConsumerMalformed} {
		m.auditors.WithLabelValues(reason)
	}
}
