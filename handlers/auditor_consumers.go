package handlers

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotal-ai/authplane/internal/metrics"
	"github.com/cotal-ai/authplane/subjects"
)

// AuditorConsumers takes an auditor's consumer creations for the minted and audit streams
// (subjects.AuditorCreate, imported from the plane account) and passes each that makes a pull
// consumer on to JetStream as the auditor's own consumer of the stream (subjects.AuditorConsumer:
// named after the auditor, whatever name it asked for, which the plane account's mappings make
// every later request of the auditor's use), answering with JetStream's answer. So each auditor
// holds one reader of each stream, and no auditor can use, change or delete another's: a
// creation of a consumer the auditor already holds replaces it. A push consumer is refused
// before JetStream sees it: it would deliver in the plane account, to whatever deliver_subject
// its creator named, and broker permissions cannot see that field. What reaches JetStream is the
// request as decoded here, encoded again, so nothing passes that was not checked. The streams
// bound the rest: max_consumers (one per auditor), and consumer_limits (an hour's inactivity at
// most).
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

// apiError is JetStream's answer to a refused request.
type apiError struct {
	Type  string             `json:"type"`
	Error jetstream.APIError `json:"error"`
}

const (
	consumerCreateResponse = "io.nats.jetstream.api.v1.consumer_create_response"
	// errMaximumConsumers is JetStream's err_code for a stream at its max_consumers;
	// errConsumerCreate, errConsumerNameExists and errConsumerExists its err_codes for a
	// consumer that exists and cannot become the one asked for.
	errMaximumConsumers   = 10026
	errConsumerCreate     = 10012
	errConsumerNameExists = 10013
	errConsumerExists     = 10148
)

// exists reports whether e says the consumer exists and cannot become the one asked for.
func (e apiError) exists() bool {
	switch e.Error.ErrorCode {
	case errConsumerNameExists, errConsumerExists:
		return true
	case errConsumerCreate:
		return strings.Contains(e.Error.Description, "can not be updated")
	}
	return false
}

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
	name, st, subject, ok := subjects.AuditorCreate(a.Space, msg.Subject)
	var req consumerCreate
	if !ok || json.Unmarshal(msg.Data, &req) != nil {
		return refusal(400, "an auditor's consumer creation: not a consumer-create request of the minted or audit stream"), metrics.AuditorConsumerMalformed
	}
	c := &req.Config
	if c.DeliverSubject != "" || c.DeliverGroup != "" || c.FlowControl || c.IdleHeartbeat != 0 {
		return refusal(403, "an auditor's consumer is a pull consumer: deliver_subject, deliver_group, flow_control and idle_heartbeat are not allowed"), metrics.AuditorConsumerPush
	}
	own := subjects.AuditorConsumer(name)
	c.Name = own
	if c.Durable != "" {
		c.Durable = own
	}
	req.Stream = st
	body, err := json.Marshal(req)
	if err != nil {
		return refusal(500, "an auditor's consumer creation could not be passed on"), metrics.AuditorConsumerMalformed
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.Timeout)
	defer cancel()
	answer, got, err := a.send(ctx, subject, body)
	if err == nil && got.exists() {
		// The auditor's consumer exists with a config that cannot change into this one: a new
		// creation replaces the auditor's own reader.
		if _, _, derr := a.send(ctx, "$JS.API.CONSUMER.DELETE."+st+"."+own, nil); derr == nil {
			answer, got, err = a.send(ctx, subject, body)
		}
	}
	if err != nil {
		a.Log.Warn("auditor consumer creation not answered by JetStream", "err", err)
		return refusal(503, "JetStream did not answer the consumer creation; retry shortly"), ""
	}
	if got.Error.ErrorCode == errMaximumConsumers {
		return answer, metrics.AuditorConsumerLimit
	}
	return answer, ""
}

// send sends one request to JetStream and returns its answer, and the error it carries.
func (a *AuditorConsumers) send(ctx context.Context, subject string, body []byte) ([]byte, apiError, error) {
	answer, err := a.JetStream.RequestWithContext(ctx, subject, body)
	if err != nil {
		return nil, apiError{}, err
	}
	var got apiError
	if json.Unmarshal(answer.Data, &got) != nil {
		got = apiError{}
	}
	return answer.Data, got, nil
}

// refusal is JetStream's form of a refused consumer creation, so a client shows its reason.
func refusal(code int, description string) []byte {
	data, err := json.Marshal(apiError{Type: consumerCreateResponse, Error: jetstream.APIError{Code: code, Description: description}})
	if err != nil {
		return []byte(`{"type":"` + consumerCreateResponse + `","error":{"code":500,"description":"internal error"}}`)
	}
	return data
}
