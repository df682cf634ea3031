package handlers

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotal-ai/authplane/internal/platform/metrics"
	"github.com/cotal-ai/authplane/subjects"
)

// AuditorConsumers takes an auditor's consumer creations and deletions for the minted and audit
// streams (subjects.AuditorCreate, AuditorDelete, imported from the plane account). It passes
// each creation that makes a pull consumer on to JetStream as the auditor's own consumer of the
// stream (subjects.AuditorConsumer: named after the auditor, whatever name it asked for, which
// the plane account's mappings make every info and pull of the auditor's use), answering with
// JetStream's answer under the name asked for. So each auditor holds one reader of each stream,
// and no auditor can use, change or delete another's. A creation under another name than the
// auditor's reader was made under replaces it with a new one; one under the same name is
// JetStream's create or update of it. A deletion deletes the reader only when it names the name
// the reader was made under (kept in its metadata, AskedName): a client that makes its next
// consumer and deletes its last one at once (nats.go's ordered consumer, at every fetch) would
// otherwise delete the reader it had just made. A push consumer is refused before JetStream sees
// it: it would deliver in the plane account, to whatever deliver_subject its creator named, and
// broker permissions cannot see that field. What reaches JetStream is the request as decoded
// here, encoded again, so nothing passes that was not checked. The streams bound the rest:
// max_consumers (one per auditor), and consumer_limits (an hour's inactivity at most).
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

// AskedName is the key of an auditor's consumer's metadata that holds the name its creation
// asked for.
const AskedName = "cotal.asked_name"

const (
	consumerCreateResponse = "io.nats.jetstream.api.v1.consumer_create_response"
	consumerDeleteResponse = "io.nats.jetstream.api.v1.consumer_delete_response"
	// errConsumerNotFound is JetStream's err_code for a consumer that does not exist.
	errConsumerNotFound = 10014
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

// Handle serves one consumer creation or deletion; an answer that cannot be sent is logged.
func (a *AuditorConsumers) Handle(msg *nats.Msg) {
	var data []byte
	var reason string
	if name, st, named, ok := subjects.AuditorDelete(a.Space, msg.Subject); ok {
		data = a.delete(name, st, named)
	} else {
		data, reason = a.create(msg)
	}
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
	name, st, asked, subject, ok := subjects.AuditorCreate(a.Space, msg.Subject)
	var req consumerCreate
	if !ok || json.Unmarshal(msg.Data, &req) != nil {
		return refusal(consumerCreateResponse, 400, "an auditor's consumer creation: not a consumer-create request of the minted or audit stream"), metrics.AuditorConsumerMalformed
	}
	c := &req.Config
	if c.DeliverSubject != "" || c.DeliverGroup != "" || c.FlowControl || c.IdleHeartbeat != 0 {
		return refusal(consumerCreateResponse, 403, "an auditor's consumer is a pull consumer: deliver_subject, deliver_group, flow_control and idle_heartbeat are not allowed"), metrics.AuditorConsumerPush
	}
	own := subjects.AuditorConsumer(name)
	c.Name = own
	if c.Durable != "" {
		c.Durable = own
	}
	if c.Metadata == nil {
		c.Metadata = map[string]string{}
	}
	c.Metadata[AskedName] = asked
	req.Stream = st
	body, err := json.Marshal(req)
	if err != nil {
		return refusal(consumerCreateResponse, 500, "an auditor's consumer creation could not be passed on"), metrics.AuditorConsumerMalformed
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.Timeout)
	defer cancel()
	remove := "$JS.API.CONSUMER.DELETE." + st + "." + own
	if held, found, err := a.held(ctx, st, own); err == nil && found && held != asked {
		// A new reader, not the one the auditor holds: it starts where it asks, not where the
		// old one stopped, and a deletion naming the old one no longer reaches it.
		_, _, _ = a.send(ctx, remove, nil)
	}
	answer, got, err := a.send(ctx, subject, body)
	if err == nil && got.exists() {
		// The auditor's consumer exists with a config that cannot change into this one: a new
		// creation replaces the auditor's own reader.
		if _, _, derr := a.send(ctx, remove, nil); derr == nil {
			answer, got, err = a.send(ctx, subject, body)
		}
	}
	if err != nil {
		a.Log.Warn("auditor consumer creation not answered by JetStream", "err", err)
		return refusal(consumerCreateResponse, 503, "JetStream did not answer the consumer creation; retry shortly"), ""
	}
	if got.Error.ErrorCode == errMaximumConsumers {
		return answer, metrics.AuditorConsumerLimit
	}
	return named(answer, asked), ""
}

// delete deletes auditor name's reader of stream st if named is the name it was made under,
// and answers as JetStream does: a consumer of any other name is not found.
func (a *AuditorConsumers) delete(name, st, named string) []byte {
	own := subjects.AuditorConsumer(name)
	ctx, cancel := context.WithTimeout(context.Background(), a.Timeout)
	defer cancel()
	held, found, err := a.held(ctx, st, own)
	if err == nil && found && held == named {
		var answer []byte
		if answer, _, err = a.send(ctx, "$JS.API.CONSUMER.DELETE."+st+"."+own, nil); err == nil {
			return answer
		}
	}
	if err != nil {
		a.Log.Warn("auditor consumer deletion not answered by JetStream", "err", err)
		return refusal(consumerDeleteResponse, 503, "JetStream did not answer the consumer deletion; retry shortly")
	}
	data, err := json.Marshal(apiError{Type: consumerDeleteResponse, Error: jetstream.APIError{Code: 404, ErrorCode: errConsumerNotFound, Description: "consumer not found"}})
	if err != nil {
		return refusal(consumerDeleteResponse, 500, "internal error")
	}
	return data
}

// held reads the name auditor consumer own of stream st was made under (own itself for one made
// before the name was kept), and whether it exists.
func (a *AuditorConsumers) held(ctx context.Context, st, own string) (string, bool, error) {
	answer, err := a.JetStream.RequestWithContext(ctx, "$JS.API.CONSUMER.INFO."+st+"."+own, nil)
	if err != nil {
		return "", false, err
	}
	var info struct {
		Error  *jetstream.APIError `json:"error"`
		Config struct {
			Metadata map[string]string `json:"metadata"`
		} `json:"config"`
	}
	if err := json.Unmarshal(answer.Data, &info); err != nil {
		return "", false, fmt.Errorf("consumer info of %s: %w", own, err)
	}
	if info.Error != nil {
		if info.Error.ErrorCode == errConsumerNotFound {
			return "", false, nil
		}
		return "", false, fmt.Errorf("consumer info of %s: %w", own, info.Error)
	}
	if held := info.Config.Metadata[AskedName]; held != "" {
		return held, true, nil
	}
	return own, true, nil
}

// named is JetStream's answer to a creation, the consumer in it named as its creation asked:
// the client addresses its later requests, and its deletion, by that name.
func named(answer []byte, asked string) []byte {
	var m map[string]json.RawMessage
	if json.Unmarshal(answer, &m) != nil || m["error"] != nil || m["name"] == nil {
		return answer
	}
	name, err := json.Marshal(asked)
	if err != nil {
		return answer
	}
	m["name"] = name
	var cfg map[string]json.RawMessage
	if json.Unmarshal(m["config"], &cfg) == nil && cfg != nil {
		cfg["name"] = name
		if _, ok := cfg["durable_name"]; ok {
			cfg["durable_name"] = name
		}
		if m["config"], err = json.Marshal(cfg); err != nil {
			return answer
		}
	}
	out, err := json.Marshal(m)
	if err != nil {
		return answer
	}
	return out
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

// refusal is JetStream's form of a refused request of type typ, so a client shows its reason.
func refusal(typ string, code int, description string) []byte {
	data, err := json.Marshal(apiError{Type: typ, Error: jetstream.APIError{Code: code, Description: description}})
	if err != nil {
		return []byte(`{"type":"` + typ + `","error":{"code":500,"description":"internal error"}}`)
	}
	return data
}
