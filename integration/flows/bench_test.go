package flows

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/service"
)

// BenchmarkRenew is the whole request on an embedded broker: renewals through the bus from
// parallel requesters (8 × GOMAXPROCS) over one caller connection, against a plane with 8
// workers (requests an endpoint answers at once) and no rate limit. "16-instances" renews sixteen instances, each
// requester one of them; "one-instance" renews one from every requester, whose commits group:
//
//	go test -run '^$' -bench Renew -benchtime 3s ./integration
//
// It reports renewals per second; ns/op is the wall time per renewal across all requesters.
// authplane bench measures the same against its ceilings.
func BenchmarkRenew(b *testing.B) {
	p := harness.StartPlane(b, func(c *service.Config) { harness.Unbudgeted(c); c.Workers = 8 })
	harness.Grant(b, p, harness.OwnerA, "cli", "supervise")
	cli, err := harness.PrincipalClient(harness.CallerConn(b, p, harness.OwnerA, "cli"), harness.OwnerA, "cli")
	if err != nil {
		b.Fatal(err)
	}
	type registration struct {
		m *harness.ManagerKeys
		r client.Renewal
	}
	var regs []registration
	for range 16 {
		m := harness.NewManagerKeys(b)
		_, act := harness.Registered(b, cli.Conn(), harness.OwnerA, "cli", m)
		regs = append(regs, registration{m, act.Renewal()})
	}
	for _, bc := range []struct {
		name      string
		instances int
	}{{"16-instances", 16}, {"one-instance", 1}} {
		b.Run(bc.name, func(b *testing.B) {
			var next atomic.Int64
			b.SetParallelism(8)
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				reg := regs[int(next.Add(1))%bc.instances]
				for pb.Next() {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					_, err := cli.Renew(ctx, reg.m.Manager, reg.r)
					cancel()
					if err != nil {
						b.Error(fmt.Errorf("renew: %w", err))
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "renew/s")
		})
	}
}
