package faces

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// wireError is a refusal body, decoded strictly.
type wireError struct {
	Error struct {
		Code    string          `json:"code"`
		Message string          `json:"message"`
		Details json.RawMessage `json:"details,omitempty"`
	} `json:"error"`
}

// refusal checks msg is a micro error with code and numeric, in both headers and the body,
// and returns the body's message.
func refusal(t *testing.T, msg *nats.Msg, code string, numeric string) string {
	t.Helper()
	if got := msg.Header.Get("Nats-Service-Error-Code"); got != numeric {
		t.Errorf("Nats-Service-Error-Code: got %q, want %q", got, numeric)
	}
	if got := msg.Header.Get("Nats-Service-Error"); !strings.HasPrefix(got, code+": ") {
		t.Errorf("Nats-Service-Error: got %q, want it to start %q", got, code+": ")
	}
	var w wireError
	dec := json.NewDecoder(bytes.NewReader(msg.Data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&w); err != nil {
		t.Fatalf("refusal body %q: %v", msg.Data, err)
	}
	if w.Error.Code != code {
		t.Errorf("refusal body code: got %q, want %q", w.Error.Code, code)
	}
	if w.Error.Message == "" {
		t.Errorf("refusal body %s: got an empty message, want one", msg.Data)
	}
	if got := msg.Header.Get("Nats-Service-Error"); got != code+": "+w.Error.Message {
		t.Errorf("Nats-Service-Error: got %q, want %q (code and the body's message)", got, code+": "+w.Error.Message)
	}
	return w.Error.Message
}

func TestRateLimitRefusesAFloodingPrincipalWhileOthersAreServed(t *testing.T) {
	t.Parallel()
	p := harness.StartPlane(t, func(c *service.Config) { c.Rate, c.Burst = 1, 2 })
	// Any endpoint: the limit answers before the handler. `{}` is refused by every handler, so
	// each served request leaves exactly one `refused` record.
	endpoint := subjects.EndpointSupervisorEnd
	const actor = "flood"
	ncA := harness.CallerConn(t, p, harness.OwnerA, actor)
	ncB := harness.CallerConn(t, p, harness.OwnerB, "cli")
	request := func(nc *nats.Conn, owner, actor string) *nats.Msg {
		t.Helper()
		msg, err := nc.Request(subjects.EndpointSubject(harness.TestSpace, endpoint, owner, actor), []byte("{}"), 5*time.Second)
		if err != nil {
			t.Fatalf("request as %s: %v", subjects.Principal(owner, actor), err)
		}
		return msg
	}

	served := func(msg *nats.Msg) bool {
		code := msg.Header.Get("Nats-Service-Error-Code")
		return code != "429" && code != "503"
	}
	for i := 1; i <= 2; i++ {
		if msg := request(ncA, harness.OwnerA, actor); !served(msg) {
			t.Errorf("request %d of the burst: got %q, want it served by the endpoint", i, msg.Header.Get("Nats-Service-Error"))
		}
	}
	refusal(t, request(ncA, harness.OwnerA, actor), "resource-exhausted", "429")
	if msg := request(ncB, harness.OwnerB, "cli"); !served(msg) {
		t.Errorf("another principal during the flood: got %q, want it served by the endpoint", msg.Header.Get("Nats-Service-Error"))
	}

	if c := harness.Counters(t, p, endpoint); c.Throttled != 1 {
		t.Errorf("%s data.throttled: got %d, want 1", endpoint, c.Throttled)
	}
	// Throttled requests are counted, not audited: only the two served ones left a record.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	subject := subjects.AuditSubject(harness.TestSpace, "refused", harness.OwnerA, actor)
	st, err := p.JS(t).Stream(ctx, subjects.AuditStream(harness.TestSpace))
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		t.Fatal(err)
	}
	if got := info.State.Subjects[subject]; got != 2 {
		t.Errorf("audit records on %s: got %d, want 2 (the throttled request is not audited)", subject, got)
	}
}
