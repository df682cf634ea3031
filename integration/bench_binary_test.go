package integration

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestBinaryBenchPrintsEveryFigureAsTheLastLine: `authplane bench --json` starts its own plane,
// drives each operation and both ceilings, and prints one JSON object as the last line of
// stdout with every figure issue 10 names, each measured (not zero); progress goes to stderr.
// Nothing here is timed: the figures only have to exist. It loads both CPUs for a moment, so
// it runs alone, before the package's parallel tests.
func TestBinaryBenchPrintsEveryFigureAsTheLastLine(t *testing.T) {
	s := startStandalone(t, "bench")
	for name, extra := range map[string][]string{
		"each requester its own instance": nil,
		"one instance shared":             {"--one-instance", "--ops", "renew"},
		"against --nats-url":              {"--nats-url", s.URL(), "--space-dir", s.spaceDir, "--space", "bench", "--ops", "renew"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel() // with each other, before the rest of the package
			args := append([]string{"bench", "--duration", "1s", "--requesters", "2", "--workers", "2", "--json"}, extra...)
			code, stdout, stderr := runAuthplane(t, 2*time.Minute, args...)
			if code != 0 {
				t.Fatalf("authplane %v: exit %d\nstderr:\n%s", args, code, stderr)
			}
			lines := strings.Split(strings.TrimSpace(stdout), "\n")
			var report map[string]any
			if err := json.Unmarshal([]byte(lines[len(lines)-1]), &report); err != nil {
				t.Fatalf("last line of stdout %q: %v", lines[len(lines)-1], err)
			}
			for _, key := range []string{"requesters", "requests_per_s", "credentials_per_s", "p50_ms", "p99_ms",
				"ceiling_echo_per_s", "ratio_to_echo", "ceiling_mint_per_s", "ratio_to_mint"} {
				if v, ok := report[key].(float64); !ok || v <= 0 {
					t.Errorf("%s: got %v, want a figure above 0", key, report[key])
				}
			}
			ops, _ := report["operations"].([]any)
			want := 3
			if extra != nil {
				want = 1 // renew only
			}
			if len(ops) != want {
				t.Fatalf("operations: got %d, want %d", len(ops), want)
			}
			for _, o := range ops {
				op := o.(map[string]any)
				if op["requests"].(float64) <= 0 {
					t.Errorf("%v: no request succeeded", op["op"])
				}
				if refused, ok := op["refused"]; ok && op["op"] != "prepare" {
					t.Errorf("%v: got refusals %v, want none", op["op"], refused)
				}
			}
			if !strings.Contains(stderr, "echo ceiling") || !strings.Contains(stderr, "mint ceiling") {
				t.Errorf("stderr: got %q, want progress naming both ceilings", stderr)
			}
		})
	}
}
