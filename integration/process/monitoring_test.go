package process

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/handlers"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// statsFrame is how many lines `nats micro stats` (natscli v0.5.0) prints around its rows: a
// title, the borders, the header and the total row.
const statsFrame = 9

// `nats micro stats cotal-auth` prints a row per endpoint of every service instance: for one
// replica it fits a screen (40 lines) on any number of CPUs. A replica registers one instance
// with the five endpoints whatever --workers (16 per CPU by default; 1024 is 64 CPUs'), and
// `nats micro info` shows that one instance: the replica's own figures, micro's count of every
// request, and in each endpoint's data every answer, refusals included.
func TestOneReplicaRegistersOneInstanceOfFiveEndpointsWhateverItsWorkers(t *testing.T) {
	t.Parallel()
	p := harness.StartPlane(t, func(c *service.Config) { c.Workers = 1024 })
	caller := harness.CallerConn(t, p, harness.OwnerA, "cli")
	const asked = 3
	for range asked {
		if o := harness.Ask(t, caller, harness.OwnerA, "cli", subjects.EndpointManagerAuthority, "{}"); o.Code != "bad-request" {
			t.Fatalf("an empty body: got %q, want bad-request", o.Code)
		}
	}

	answers := harness.CollectN(t, p.Ops(t), "$SRV.STATS."+subjects.ServiceName, nil, 0, time.Second)
	rows := 0
	for _, m := range answers {
		var stats micro.Stats
		if err := json.Unmarshal(m.Data, &stats); err != nil {
			t.Fatalf("decode $SRV.STATS answer %q: %v", m.Data, err)
		}
		rows += len(stats.Endpoints)
	}
	if len(answers) != 1 || rows != len(subjects.Endpoints) {
		t.Fatalf("$SRV.STATS: got %d service instances listing %d endpoints, want 1 listing %d", len(answers), rows, len(subjects.Endpoints))
	}
	if lines := rows + statsFrame; lines > 40 {
		t.Errorf("nats micro stats would print %d lines for one replica, want at most 40", lines)
	}
	infos := harness.ServiceInstances(t, p.Ops(t))
	checkInstances(t, infos, p.InstanceID(), 0)
	got := harness.Counters(t, p, subjects.EndpointManagerAuthority)
	if got.Requests != asked || got.Answered != asked || got.Errors != asked || got.LastError != "400:bad-request" || got.InFlight != 0 {
		t.Errorf("manager-authority: got %+v, want %d requests, answered and errors (400:bad-request), none in flight", got, asked)
	}

	natsCLI, err := exec.LookPath("nats")
	if err != nil {
		t.Log("the nats CLI is not on PATH: its output is not checked")
		return
	}
	creds := harness.WriteCreds(t, p.Keys(), admin.RoleOps, harness.OwnerA, "ops")
	cli := func(args ...string) string {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, natsCLI, append([]string{"--server", p.NATSURL(), "--creds", creds,
			"--inbox-prefix", subjects.InboxPrefix(harness.OwnerA, "ops"), "micro"}, args...)...)
		cmd.Env = append(os.Environ(), "HOME="+t.TempDir(), "XDG_CONFIG_HOME="+t.TempDir()) // no saved contexts
		out, err := harness.CombinedOutput(cmd)
		if err != nil {
			t.Fatalf("nats micro %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	if out := cli("stats", subjects.ServiceName); strings.Count(out, "\n") > 40 || !strings.Contains(out, subjects.EndpointSupervisorEnd) {
		t.Errorf("nats micro stats: got %d lines, want at most 40 listing the endpoints:\n%s", strings.Count(out, "\n"), out)
	}
	out := cli("info", subjects.ServiceName)
	for _, want := range []string{`Requests: 3 in group "` + subjects.QueueGroup + `"`, `"answered": 3`, `"errors": 3`, handlers.CountsNote} {
		if !strings.Contains(strings.Join(strings.Fields(out), " "), strings.Join(strings.Fields(want), " ")) {
			t.Errorf("nats micro info: want %q in\n%s", want, out)
		}
	}
}
