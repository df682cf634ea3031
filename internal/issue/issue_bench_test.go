package issue_test

import (
	"testing"

	"github.com/cotal-ai/authplane/internal/fence"
	"github.com/cotal-ai/authplane/internal/gate"
	"github.com/cotal-ai/authplane/internal/issue"
	"github.com/cotal-ai/authplane/subjects"
)

// BenchmarkIssue runs the pipeline on the in-memory stores for a renew's plan (supervisor and
// executor, committing on the instance's gate): sign, validate, record minted, commit.
// "serial" issues one plan at a time; "one-gate-parallel" issues from every CPU at once on the
// same gate, whose commits group:
//
//	go test -run '^$' -bench Issue ./internal/issue
func BenchmarkIssue(b *testing.B) {
	b.Run("serial", func(b *testing.B) {
		e := newEnv(b)
		plan := e.plan(b)
		plan.Steps = plan.Steps[:1]
		b.ReportAllocs()
		for b.Loop() {
			if _, err := e.p.Issue(ctx(b), plan); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("one-gate-parallel", func(b *testing.B) {
		e := newEnv(b)
		g, err := gate.Of(fence.Group(e.fences), subjects.GateEndpointManager, e.iid).Observe(ctx(b))
		if err != nil {
			b.Fatal(err)
		}
		plan := e.plan(b)
		plan.Steps = []issue.Step{issue.Unchanged(g)}
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := e.p.Issue(ctx(b), plan); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}
