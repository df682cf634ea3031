package handlers

import (
	"context"
	"encoding/json"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotal-ai/authplane/internal/metrics"
	"github.com/cotal-ai/authplane/subjects"
)

// AuditorConsumers takes an auditor's consumer creations for the minted and audit streams
// (subjects.AuditorConsumers, imported from the plane account) and passes each that makes a
// pull consumer on to JetStream, answering with JetStream's answer. A push consumer is refused
// before JetStream sees it: it would deliver in the plane account, to whatever deliver_subject
// its creator named, and broker permissions cannot see that field. What reaches JetStream is
// the request as decoded here, encoded again, so nothing passes that was not checked. The
// streams bound the rest: max_consumers, and consumer_limits (an hour's inactivity at most).
//
// Auditors are operators, not tenants, and their requests cross the import without a
// principal: the streams' consumers are one budget for every auditor of the space.
type AuditorConsumers struct {
	Space string
	// JetStream sends the creation on, as the plane's auditors user (its connection).
	JetStream Requester
	Timeout   time.Duration
	Metrics   *metrics.Metrics
	Log       *slog.Logger
}

// Requester sends one request and waits for its answer (a *nats.Conn).
type Requester interface {
	RequestWithContext(ctx context.Context, subject string, data []byte) (*nats.Msg, error)
}

// consumerCreate is JetStream's consumer-create request, as an auditor's client sends it.
type consumerCreate struct {
	Stream   string                   `json:"stream_name"`
	Config   jetstream.ConsumerConfig `json:"config"`
	Action   string                   `json:"action"`
	Pedantic bool                     `json:"pedantic,omitempty"`
}

// apiError is JetStream's answer to a refused consumer creation.
type apiError struct {
	Type  string             `json:"type"`
	Error jetstream.APIError `json:"error"`
}

const (
	consumerCreateResponse = "io.nats.jetstream.api.v1.consumer_create_response"
	// errMaximumConsumers is JetStream's err_code for a stream at its max_consumers.
	errMaximumConsumers = 10026
)

// Handle serves one consumer creation; an answer that cannot be sent is logged.
func (a *AuditorConsumers) Handle(msg *nats.Msg) {
	data, reason := a.create(msg)
	if reason != "" {
		a.Metrics.AuditorConsumerRefused(reason)
	}
	if msg.Reply == "" {
		return
	}
	if err := msg.Respond(data); err != nil {
		a.Log.Warn("auditor consumer answer not sent", "err", err)
	}
}

// create checks and passes one creation on; it returns the answer, and why it was refused
// ("" when JetStream made the consumer or refused it for a reason of its own but the limit).
func (a *AuditorConsumers) create(msg *nats.Msg) ([]byte, string) {
	subject := subjects.JetStreamConsumerCreate(a.Space, msg.Subject)
	var req consumerCreate
	if subject == "" || json.Unmarshal(msg.Data, &req) != nil {
		return refusal(400, "an auditor's consumer creation: not a consumer-create request of the minted or audit stream"), metrics.AuditorConsumerMalformed
	}
	c := req.Config
	if c.DeliverSubject != "" || c.DeliverGroup != "" || c.FlowControl || c.IdleHeartbeat != 0 {
		return refusal(403, "an auditor's consumer is a pull consumer: deliver_subject, deliver_group, flow_control and idle_heartbeat are not allowed"), metrics.AuditorConsumerPush
	}
	body, err := json.Marshal(req)
	if err != nil {
		return refusal(500, "an auditor's consumer creation could not be passed on"), metrics.AuditorConsumerMalformed
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.Timeout)
	defer cancel()
	answer, err := a.JetStream.RequestWithContext(ctx, subject, body)
	if err != nil {
		a.Log.Warn("auditor consumer creation not answered by JetStream", "err", err)
		return refusal(503, "JetStream did not answer the consumer creation; retry shortly"), ""
	}
	var got apiError
	if json.Unmarshal(answer.Data, &got) == nil && got.Error.ErrorCode == errMaximumConsumers {
		return answer.Data, metrics.AuditorConsumerLimit
	}
	return answer.Data, ""
}

// refusal is JetStream's form of a refused consumer creation, so a client shows its reason.
func refusal(code int, description string) []byte {
	data, err := json.Marshal(apiError{Type: consumerCreateResponse, Error: jetstream.APIError{Code: code, Description: description}})
	if err != nil {
		return []byte(`{"type":"` + consumerCreateResponse + `","error":{"code":500,"description":"internal error"}}`)
	}
	return data
}
