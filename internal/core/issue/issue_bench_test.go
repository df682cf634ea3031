package issue_test

import (
	"testing"

	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/subjects"
)

// BenchmarkIssue runs the pipeline on the in-memory stores for a renew's plan (supervisor and
// executor, committing on the instance's gate), each from a fresh observation of the gate as a
// request makes it: observe, sign, validate, record minted, commit. "serial" issues one plan at
// a time; "one-gate-parallel" issues from every CPU at once on the same gate, whose commits
// group:
//
//	go test -run '^$' -bench Issue ./internal/core/issue
func BenchmarkIssue(b *testing.B) {
	for _, bc := range []struct {
		name     string
		parallel bool
	}{{"serial", false}, {"one-gate-parallel", true}} {
		b.Run(bc.name, func(b *testing.B) {
			e := newEnv(b)
			gates := fence.Group(e.fences)
			plan := e.plan(b)
			issue1 := func() error {
				g, err := issue.GateOf(gates, subjects.GateEndpointManager, e.iid).Observe(ctx(b))
				if err != nil {
					return err
				}
				p := plan
				p.Steps = []issue.Step{issue.Unchanged(g)}
				_, err = e.p.Issue(ctx(b), p)
				return err
			}
			b.ReportAllocs()
			if !bc.parallel {
				for b.Loop() {
					if err := issue1(); err != nil {
						b.Fatal(err)
					}
				}
				return
			}
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := issue1(); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
