package harness

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

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

// EndpointCounters sums the plane's own counters (data.dropped, data.throttled) and micro's
// request and error counts over every registered copy of endpoint.
type EndpointCounters struct {
	Dropped, Throttled uint64
	Requests, Errors   int
}

// Counters sums endpoint's counters over every service instance of plane p, as an operator
// asks for them.
func Counters(t testing.TB, p *TestPlane, endpoint string) EndpointCounters {
	t.Helper()
	var c EndpointCounters
	answers := CollectN(t, p.Ops(t), "$SRV.STATS."+subjects.ServiceName, nil, p.Workers, 3*time.Second)
	if len(answers) != p.Workers {
		t.Fatalf("$SRV.STATS: got %d answers, want one per worker (%d)", len(answers), p.Workers)
	}
	var endpoints []*micro.EndpointStats
	for _, m := range answers {
		var stats micro.Stats
		if err := json.Unmarshal(m.Data, &stats); err != nil {
			t.Fatalf("decode $SRV.STATS answer %q: %v", m.Data, err)
		}
		endpoints = append(endpoints, stats.Endpoints...)
	}
	copies := 0
	for _, e := range endpoints {
		if e.Name != endpoint {
			continue
		}
		copies++
		var d struct {
			Dropped   uint64 `json:"dropped"`
			Throttled uint64 `json:"throttled"`
		}
		if len(e.Data) > 0 {
			if err := json.Unmarshal(e.Data, &d); err != nil {
				t.Fatalf("decode stats data %q of %s: %v", e.Data, endpoint, err)
			}
		}
		c.Dropped += d.Dropped
		c.Throttled += d.Throttled
		c.Requests += e.NumRequests
		c.Errors += e.NumErrors
	}
	if copies != p.Workers {
		t.Fatalf("got stats of endpoint %s from %d service instances, want %d", endpoint, copies, p.Workers)
	}
	return c
}

// ServiceInstances gathers every answer to `$SRV.INFO.cotal-auth` within half a second: one
// per service instance (worker) of every plane on the broker.
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
