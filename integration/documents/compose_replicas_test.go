package documents

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/testkit"
)

// The compose file's replicas, run as it runs them but against one local node (--replicas 1,
// free ports, and a fresh --dir each time, as a recreated container has): each claims its own
// instance, and a replica recreated on a fresh container is the same instance at the next
// epoch. So they need no state volume.
func TestComposeReplicasKeepTheirIdentityWithoutAStateVolume(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(filepath.Join(repoRoot, "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var cf composeFile
	if err := yaml.Unmarshal(raw, &cf); err != nil {
		t.Fatal(err)
	}
	spec := composeFlagSpec(t, harness.AuthplaneBinary(t), "serve")
	s := harness.StartStandalone(t, harness.TestSpace)
	// serveLike runs a replica's command with the local node, one replica per stream, free
	// ports and a fresh state directory in place of the container's.
	serveLike := func(service string) (*harness.Process, string) {
		var args []string
		for name, value := range composeFlags(t, service, cf.Services[service].Command[1:], spec) {
			switch name {
			case "nats-url":
				value = s.URL()
			case "space-dir":
				value = s.SpaceDir
			case "replicas":
				value = "1"
			case "http-port", "public-port":
				value = "0"
			case "dir":
				value = t.TempDir()
			}
			args = append(args, "--"+name, value)
		}
		if !slices.Contains(args, "--identity-store") {
			t.Fatalf("%s: no --identity-store in its command", service)
		}
		proc := harness.StartAuthplane(t, append([]string{"serve"}, args...)...)
		return proc, args[slices.Index(args, "--dir")+1]
	}

	first, dir1 := serveLike("plane1")
	second, dir2 := serveLike("plane2")
	harness.WaitReady(t, first, dir1)
	p := harness.BinaryPlane(t, harness.WaitReady(t, second, dir2))
	iid1, epoch1 := summaryInstance(t, first)
	iid2, epoch2 := summaryInstance(t, second)
	if iid1 == iid2 || epoch1 != 0 || epoch2 != 0 {
		t.Fatalf("plane1 %s epoch %d, plane2 %s epoch %d: want two instances, each at epoch 0", iid1, epoch1, iid2, epoch2)
	}

	// plane1's container is recreated: no disk, the same name.
	if err := first.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := first.Wait(t, 30*time.Second); code != 0 {
		t.Fatalf("plane1 after SIGTERM: exit %d\n%s", code, first.Stderr.String())
	}
	again, dir := serveLike("plane1")
	harness.WaitReady(t, again, dir)
	if iid, epoch := summaryInstance(t, again); iid != iid1 || epoch != 1 || dir == dir1 {
		t.Fatalf("plane1 recreated in %s: got instance %s epoch %d, want %s epoch 1", dir, iid, epoch, iid1)
	}
	testkit.CheckFor(t, 5*time.Second, 50*time.Millisecond, func() error {
		groups := harness.ByInstance(harness.ServiceInstances(t, p.Ops(t)))
		if len(groups) != 2 || len(groups[iid1]) == 0 || len(groups[iid2]) == 0 || groups[iid1][0].Metadata["epoch"] != "1" {
			return fmt.Errorf("service instances by plane: %v, want plane1 (%s, epoch 1) and plane2 (%s)", harness.Keys(groups), iid1, iid2)
		}
		return nil
	})
}

// summaryInstance reads the instance id and epoch a serving binary printed in its summary.
func summaryInstance(t testing.TB, proc *harness.Process) (string, uint64) {
	t.Helper()
	var m []string
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if m = regexp.MustCompile(`(?m)^  instance  (\S+) \(epoch (\d+)\)$`).FindStringSubmatch(proc.Stdout.String()); m == nil {
			return fmt.Errorf("no instance line in the summary yet: %q", proc.Stdout.String())
		}
		return nil
	})
	epoch, err := strconv.ParseUint(m[2], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return m[1], epoch
}
