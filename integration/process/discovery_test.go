package process

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go/micro"

	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// checkInstances checks that infos are exactly the one service instance of one plane
// (instance iid at epoch), listing the five endpoints once.
func checkInstances(t testing.TB, infos []micro.Info, iid string, epoch uint64) {
	t.Helper()
	if len(infos) != 1 {
		t.Errorf("$SRV.INFO: got %d service instances, want 1", len(infos))
	}
	for _, info := range infos {
		if info.Metadata["instance"] != iid || info.Metadata["epoch"] != strconv.FormatUint(epoch, 10) {
			t.Errorf("$SRV.INFO %s: got instance %s epoch %s, want %s epoch %d", info.ID, info.Metadata["instance"], info.Metadata["epoch"], iid, epoch)
		}
		checkFiveEndpoints(t, info)
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
