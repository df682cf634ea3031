package harness

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/cotal-ai/authplane/handlers"
	"github.com/cotal-ai/authplane/subjects"
)

// collect publishes a request on subject with nc's own inbox as the reply and gathers every
// reply that arrives within window: several service instances may answer one `$SRV` request.
func collect(t testing.TB, nc *nats.Conn, subject string, data []byte, window time.Duration) []*nats.Msg {
	t.Helper()
	return CollectN(t, nc, subject, data, 0, window)
}

// CollectN is collect that returns as soon as want replies have arrived (want 0: wait out the
// window).
func CollectN(t testing.TB, nc *nats.Conn, subject string, data []byte, want int, window time.Duration) []*nats.Msg {
	t.Helper()
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatalf("subscribe %s: %v", inbox, err)
	}
	defer func() {
		if err := sub.Unsubscribe(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			t.Errorf("unsubscribe %s: %v", inbox, err)
		}
	}()
	if err := nc.PublishRequest(subject, inbox, data); err != nil {
		t.Fatalf("request %s: %v", subject, err)
	}
	var out []*nats.Msg
	deadline := time.Now().Add(window)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return out
		}
		m, err := sub.NextMsg(left)
		if errors.Is(err, nats.ErrTimeout) {
			return out
		}
		if err != nil {
			t.Fatalf("reply to %s: %v", subject, err)
		}
		out = append(out, m)
		if len(out) == want {
			return out
		}
	}
}

// ServiceInfo asks `$SRV.INFO.cotal-auth` and returns the one answer; the test fails on any
// other number of answers than one.
func ServiceInfo(t testing.TB, nc *nats.Conn) micro.Info {
	t.Helper()
	msg, err := nc.Request("$SRV.INFO."+subjects.ServiceName, nil, 5*time.Second)
	if err != nil {
		t.Fatalf("$SRV.INFO.%s: %v", subjects.ServiceName, err)
	}
	var info micro.Info
	if err := json.Unmarshal(msg.Data, &info); err != nil {
		t.Fatalf("decode $SRV.INFO answer %q: %v", msg.Data, err)
	}
	return info
}

// EndpointCounters are an endpoint's figures as an operator reads them: micro's count of the
// requests it took, and the plane's own counts in the endpoint's data.
type EndpointCounters struct {
	handlers.Counters
	Requests int
}

// PlaneStats asks `$SRV.STATS.cotal-auth` on the broker of plane p, which serves alone there,
// and returns the first answer, which must be p's.
func PlaneStats(t testing.TB, p *TestPlane) micro.Stats {
	t.Helper()
	answers := CollectN(t, p.Ops(t), "$SRV.STATS."+subjects.ServiceName, nil, 1, 3*time.Second)
	if len(answers) != 1 {
		t.Fatalf("$SRV.STATS: got no answer")
	}
	var stats micro.Stats
	if err := json.Unmarshal(answers[0].Data, &stats); err != nil {
		t.Fatalf("decode $SRV.STATS answer %q: %v", answers[0].Data, err)
	}
	if stats.Metadata["instance"] != p.InstanceID() {
		t.Fatalf("$SRV.STATS: got an instance of plane %q, want %s's", stats.Metadata["instance"], p.InstanceID())
	}
	return stats
}

// Counters reads endpoint's figures from plane p's service instance, as an operator asks for
// them.
func Counters(t testing.TB, p *TestPlane, endpoint string) EndpointCounters {
	t.Helper()
	for _, e := range PlaneStats(t, p).Endpoints {
		if e.Name != endpoint {
			continue
		}
		c := EndpointCounters{Requests: e.NumRequests}
		if err := json.Unmarshal(e.Data, &c.Counters); err != nil {
			t.Fatalf("decode stats data %q of %s: %v", e.Data, endpoint, err)
		}
		return c
	}
	t.Fatalf("$SRV.STATS lists no endpoint %s", endpoint)
	return EndpointCounters{}
}

// ServiceInstances gathers every answer to `$SRV.INFO.cotal-auth` within half a second: one
// per service instance, of every plane on the broker.
func ServiceInstances(t testing.TB, nc *nats.Conn) []micro.Info {
	t.Helper()
	var out []micro.Info
	for _, m := range collect(t, nc, "$SRV.INFO."+subjects.ServiceName, nil, 500*time.Millisecond) {
		var info micro.Info
		if err := json.Unmarshal(m.Data, &info); err != nil {
			t.Fatalf("decode $SRV.INFO answer %q: %v", m.Data, err)
		}
		out = append(out, info)
	}
	return out
}

// ByInstance groups service instances by the plane instance they belong to.
func ByInstance(infos []micro.Info) map[string][]micro.Info {
	out := map[string][]micro.Info{}
	for _, info := range infos {
		out[info.Metadata["instance"]] = append(out[info.Metadata["instance"]], info)
	}
	return out
}
