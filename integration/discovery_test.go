package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// collect publishes a request on subject with nc's own inbox as the reply and gathers every
// reply that arrives within window: several service instances may answer one `$SRV` request.
func collect(t testing.TB, nc *nats.Conn, subject string, data []byte, window time.Duration) []*nats.Msg {
	t.Helper()
	return collectN(t, nc, subject, data, 0, window)
}

// collectN is collect that returns as soon as want replies have arrived (want 0: wait out the
// window).
func collectN(t testing.TB, nc *nats.Conn, subject string, data []byte, want int, window time.Duration) []*nats.Msg {
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

// serviceInfo asks `$SRV.INFO.cotal-auth` and returns the one answer; the test fails on any
// other number of answers than one.
func serviceInfo(t testing.TB, nc *nats.Conn) micro.Info {
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

// endpointCounters sums the plane's own counters (data.dropped, data.throttled) and micro's
// request and error counts over every registered copy of endpoint.
type endpointCounters struct {
	Dropped, Throttled uint64
	Requests, Errors   int
}

// counters sums endpoint's counters over every service instance of plane p, as an operator
// asks for them.
func counters(t testing.TB, p *testPlane, endpoint string) endpointCounters {
	t.Helper()
	var c endpointCounters
	answers := collectN(t, p.Ops(t), "$SRV.STATS."+subjects.ServiceName, nil, p.workers, 3*time.Second)
	if len(answers) != p.workers {
		t.Fatalf("$SRV.STATS: got %d answers, want one per worker (%d)", len(answers), p.workers)
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
	if copies != p.workers {
		t.Fatalf("got stats of endpoint %s from %d service instances, want %d", endpoint, copies, p.workers)
	}
	return c
}

// serviceInstances gathers every answer to `$SRV.INFO.cotal-auth` within half a second: one
// per service instance (worker) of every plane on the broker.
func serviceInstances(t testing.TB, nc *nats.Conn) []micro.Info {
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

// checkInstances checks that infos are exactly the workers service instances of one plane
// (instance iid at epoch): worker 0 to workers-1 once each, distinct ids, each listing the five
// endpoints once.
func checkInstances(t testing.TB, infos []micro.Info, workers int, iid string, epoch uint64) {
	t.Helper()
	if len(infos) != workers {
		t.Errorf("$SRV.INFO: got %d service instances, want %d (one per worker)", len(infos), workers)
	}
	ids, seen := map[string]bool{}, map[string]bool{}
	for _, info := range infos {
		if info.Metadata["instance"] != iid || info.Metadata["epoch"] != strconv.FormatUint(epoch, 10) {
			t.Errorf("$SRV.INFO %s: got instance %s epoch %s, want %s epoch %d", info.ID, info.Metadata["instance"], info.Metadata["epoch"], iid, epoch)
		}
		if w := info.Metadata["worker"]; seen[w] || ids[info.ID] {
			t.Errorf("$SRV.INFO: worker %q or id %s answered twice", w, info.ID)
		} else {
			seen[w], ids[info.ID] = true, true
		}
		checkFiveEndpoints(t, info)
	}
	for w := range workers {
		if !seen[strconv.Itoa(w)] {
			t.Errorf("$SRV.INFO: no service instance is worker %d (got %v)", w, seen)
		}
	}
}

// checkFiveEndpoints checks info lists each of the five endpoints exactly once, on its
// subject, in the plane's queue group: micro's view of one service instance.
func checkFiveEndpoints(t testing.TB, info micro.Info) {
	t.Helper()
	if info.Name != subjects.ServiceName || info.Version != service.Version {
		t.Errorf("$SRV.INFO: got %s %s, want %s %s", info.Name, info.Version, subjects.ServiceName, service.Version)
	}
	count := map[string]int{}
	for _, e := range info.Endpoints {
		count[e.Name]++
		wantSubject := subjects.AuthPrefix(info.Metadata["space"]) + "." + subjects.EndpointPattern(e.Name)
		if e.Subject != wantSubject {
			t.Errorf("endpoint %s: got subject %q, want %q", e.Name, e.Subject, wantSubject)
		}
		if e.QueueGroup != subjects.QueueGroup {
			t.Errorf("endpoint %s: got queue group %q, want %q", e.Name, e.QueueGroup, subjects.QueueGroup)
		}
	}
	want := map[string]int{}
	for _, e := range subjects.Endpoints {
		want[e] = 1
	}
	if fmt.Sprint(count) != fmt.Sprint(want) {
		t.Errorf("$SRV.INFO endpoints: got %v, want each once: %v", count, want)
	}
}
