package integration

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/service"
)

// BenchmarkRenew renews through the bus from parallel requesters, each its own manager
// instance on one caller connection, against a plane with 8 workers (service instances):
//
//	go test -run - -bench Renew -benchtime 3s ./integration
//
// It reports renewals per second; ns/op is the wall time per renewal across all requesters.
func BenchmarkRenew(b *testing.B) {
	p := startPlane(b, func(c *service.Config) { c.Rate = 0; c.Workers = 8 })
	grant(b, p, ownerA, "cli", "supervise")
	cli, err := principalClient(callerConn(b, p, ownerA, "cli"), ownerA, "cli")
	if err != nil {
		b.Fatal(err)
	}
	type registration struct {
		m *managerKeys
		r client.Renewal
	}
	var regs []registration
	for range 16 {
		m := newManagerKeys(b)
		_, act := registered(b, cli.Conn(), ownerA, "cli", m)
		regs = append(regs, registration{m, act.Renewal()})
	}
	var next atomic.Int64
	b.SetParallelism(8) // 8 × GOMAXPROCS requesters
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		reg := regs[int(next.Add(1))%len(regs)]
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
}
