package process

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/integration/internal/harness"
)

// TestBinaryBenchPrintsEveryFigureAsTheLastLine: `authplane bench --json` starts its own plane,
// drives each operation and its ceilings (the echo, the mint, and the disk's: synced writes in
// its directory, a synced stream), and prints one JSON object as the last line of stdout with
// every figure of an operation and its ceilings, each measured (not zero); progress
// goes to stderr. Nothing here is timed: the figures only have to exist. It loads both CPUs for
// a moment, so it runs alone, before the package's parallel tests.
func TestBinaryBenchPrintsEveryFigureAsTheLastLine(t *testing.T) {
	s := harness.StartStandalone(t, "bench")
	for name, extra := range map[string][]string{
		"each requester its own instance": nil,
		"one instance shared":             {"--one-instance", "--ops", "renew"},
		"against --nats-url":              {"--nats-url", s.URL(), "--space-dir", s.SpaceDir, "--space", "bench", "--ops", "renew"},
		"unsynced":                        {"--allow-unsynced", "--ops", "renew"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel() // with each other, before the rest of the package
			args := append([]string{"bench", "--duration", "1s", "--requesters", "2", "--workers", "2", "--json"}, extra...)
			code, stdout, stderr := harness.RunAuthplane(t, 2*time.Minute, args...)
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
			if synced := !slices.Contains(extra, "--allow-unsynced"); report["synced"] != synced {
				t.Errorf("synced: got %v, want %v", report["synced"], synced)
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
			disk, _ := report["disk"].(map[string]any)
			for _, key := range []string{"synced_writes_per_s", "synced_write_us", "synced_stream_per_s", "synced_stream_concurrent_per_s", "synced_stream_publishers"} {
				if v, ok := disk[key].(float64); !ok || v <= 0 {
					t.Errorf("disk.%s: got %v, want a figure above 0", key, disk[key])
				}
			}
			for _, o := range ops {
				op := o.(map[string]any)
				for _, key := range []string{"ratio_to_synced_write", "ratio_to_synced_stream"} {
					if v, ok := op[key].(float64); !ok || v <= 0 {
						t.Errorf("%v: %s: got %v, want a figure above 0", op["op"], key, op[key])
					}
				}
			}
			for _, ceiling := range []string{"echo ceiling", "mint ceiling", "synced-write ceiling"} {
				if !strings.Contains(stderr, ceiling) {
					t.Errorf("stderr: got %q, want progress naming the %s", stderr, ceiling)
				}
			}
		})
	}
}

// TestBinaryBenchPrintsTheClusterEndAndStormPhases: `authplane bench --cluster 3` starts three
// servers of its own and serves them with R3 streams, and each new phase prints its figures
// in the last line: the operations with their echo ceiling over the cluster; the ends at each
// concurrency over a set filled to each size (every end confirmed at the broker, the set at
// least as full as asked); the storm through the callout ceiling, the plane's callout and
// direct JWTs (every connection made, the plane's callout answering each). The same end and
// storm phases run on the embedded broker. Small sizes: nothing here is timed.
func TestBinaryBenchPrintsTheClusterEndAndStormPhases(t *testing.T) {
	const storm = 8
	fills := []float64{0, 20}
	for name, extra := range map[string][]string{
		"a cluster it starts": {"--cluster", "3", "--phases", "ops,ends,storm"},
		"the embedded broker": {"--phases", "ends,storm"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			args := append([]string{"bench", "--json", "--duration", "300ms", "--requesters", "2", "--workers", "2", "--ops", "renew",
				"--end-fill", "0,20", "--end-concurrency", "1,2", "--end-rounds", "1", "--storm", fmt.Sprint(storm)}, extra...)
			code, stdout, stderr := harness.RunAuthplane(t, 3*time.Minute, args...)
			if code != 0 {
				t.Fatalf("authplane %v: exit %d\nstderr:\n%s", args, code, stderr)
			}
			lines := strings.Split(strings.TrimSpace(stdout), "\n")
			var report struct {
				Broker     string           `json:"broker"`
				Replicas   int              `json:"replicas"`
				Operations []map[string]any `json:"operations"`
				Ceiling    float64          `json:"ceiling_echo_per_s"`
				Ends       []map[string]any `json:"ends"`
				Storms     []map[string]any `json:"storms"`
			}
			if err := json.Unmarshal([]byte(lines[len(lines)-1]), &report); err != nil {
				t.Fatalf("last line of stdout %q: %v", lines[len(lines)-1], err)
			}
			if extra[0] == "--cluster" {
				if report.Broker != "cluster of 3" || report.Replicas != 3 {
					t.Errorf("broker %q, replicas %d: want a cluster of 3 with replicas 3", report.Broker, report.Replicas)
				}
				if len(report.Operations) != 1 || report.Ceiling <= 0 {
					t.Fatalf("operations %v, echo ceiling %v: want renew and its ceiling over the cluster", report.Operations, report.Ceiling)
				}
				for _, key := range []string{"requests_per_s", "p99_ms", "ratio_to_echo"} {
					if v, _ := report.Operations[0][key].(float64); v <= 0 {
						t.Errorf("renew %s: got %v, want a figure above 0", key, report.Operations[0][key])
					}
				}
			}

			if len(report.Ends) != 4 {
				t.Fatalf("ends: got %d cells, want 4 (two sizes, two concurrencies)", len(report.Ends))
			}
			for i, cell := range report.Ends {
				fill, at := fills[i/2], float64(1+i%2)
				if cell["fill"] != fill || cell["concurrency"] != at {
					t.Errorf("end cell %d: fill %v at %v at once, want %v at %v", i, cell["fill"], cell["concurrency"], fill, at)
				}
				if cell["ends"] != at || cell["failed"] != nil {
					t.Errorf("end cell %d: %v ends confirmed, failed %v; want %v confirmed, none failed", i, cell["ends"], cell["failed"], at)
				}
				for _, key := range []string{"ends_per_s", "p50_ms", "p99_ms", "account_jwt_bytes"} {
					if v, _ := cell[key].(float64); v <= 0 {
						t.Errorf("end cell %d %s: got %v, want a figure above 0", i, key, cell[key])
					}
				}
				if keys, _ := cell["signers"].(float64); keys < fill || keys <= 0 {
					t.Errorf("end cell %d: the account JWT lists %v signing keys, want at least the %v live instances' and the account's own", i, cell["signers"], fill)
				}
			}

			var vias []any
			for _, s := range report.Storms {
				vias = append(vias, s["via"])
				if s["n"] != float64(storm) || s["connected"] != float64(storm) {
					t.Errorf("storm via %v: %v of %v connected, want all %d", s["via"], s["connected"], s["n"], storm)
				}
				for _, key := range []string{"all_connected_s", "connects_per_s", "p99_ms", "attempts"} {
					if v, _ := s[key].(float64); v <= 0 {
						t.Errorf("storm via %v %s: got %v, want a figure above 0", s["via"], key, s[key])
					}
				}
				if s["via"] == "callout" {
					answers, _ := s["callout_answers"].(map[string]any)
					if ok, _ := answers["ok"].(float64); ok < storm {
						t.Errorf("storm via the callout: the plane answered %v, want at least %d ok", s["callout_answers"], storm)
					}
					if r, _ := s["ratio_to_ceiling"].(float64); r <= 0 {
						t.Errorf("storm via the callout: ratio to the ceiling %v, want a figure above 0", s["ratio_to_ceiling"])
					}
				}
			}
			if want := []any{"callout ceiling", "callout", "jwt"}; !reflect.DeepEqual(vias, want) {
				t.Errorf("storms via %v, want %v", vias, want)
			}
		})
	}
}
