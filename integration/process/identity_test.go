package process

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/capability/instance"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// claimedAs points a plane at s with its identity claimed in the store under name, in a state
// directory of its own.
func claimedAs(t testing.TB, s *harness.Standalone, name string) func(*service.Config) {
	return func(c *service.Config) {
		harness.AgainstStandalone(s)(c)
		c.Dir = t.TempDir()
		c.IdentityStore, c.InstanceName = instance.StoreKV, name
	}
}

// identityRecords returns how many messages the secrets bucket holds for name's identity key,
// and the last of them.
func identityRecords(t testing.TB, s *harness.Standalone, name string) (uint64, []byte) {
	t.Helper()
	_, js := harness.PlaneConn(t, s.Material, s.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, "KV_"+subjects.SecretsBucket(harness.TestSpace))
	if err != nil {
		t.Fatal(err)
	}
	subject := "$KV." + subjects.SecretsBucket(harness.TestSpace) + "." + subjects.IdentityKey(name)
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.GetLastMsgForSubject(ctx, subject)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Subjects[subject], m.Data
}

// Two replicas started at once under one instance name claim one identity: one record, epochs
// 0 and 1, and only the later registration serves. A third under another name serves beside
// it in the queue group.
func TestTwoReplicasClaimingOneNameEndWithOneRecordAndOneServing(t *testing.T) {
	t.Parallel()
	s := harness.StartStandalone(t, harness.TestSpace)
	planes := make([]*service.Plane, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range planes {
		cfg := harness.PlaneConfig(t)
		claimedAs(t, s, "plane1")(&cfg)
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			planes[i], errs[i] = service.Start(ctx, cfg)
		})
	}
	wg.Wait()
	for i, p := range planes {
		if errs[i] != nil {
			t.Fatalf("replica %d: %v", i, errs[i])
		}
		t.Cleanup(func() { harness.ClosePlane(t, p) })
	}
	a, b := planes[0].Info(), planes[1].Info()
	if a.InstanceID != b.InstanceID {
		t.Fatalf("replicas claimed %s and %s, want one identity", a.InstanceID, b.InstanceID)
	}
	if a.Epoch+b.Epoch != 1 {
		t.Fatalf("replicas registered epochs %d and %d, want 0 and 1", a.Epoch, b.Epoch)
	}
	n, data := identityRecords(t, s, "plane1")
	if n != 1 {
		t.Fatalf("got %d identity records for plane1, want 1", n)
	}
	var rec map[string]any
	if err := json.Unmarshal(data, &rec); err != nil || rec["instanceId"] != a.InstanceID || rec["name"] != "plane1" {
		t.Errorf("the identity record: got %s, want instance %s named plane1", data, a.InstanceID)
	}
	if len(rec) != 4 {
		t.Errorf("the identity record: got %s, want ver, space, name and instanceId only (no seed)", data)
	}

	older, survivor := planes[0], planes[1]
	if a.Epoch == 1 {
		older, survivor = planes[1], planes[0]
	}
	select {
	case <-older.Done():
		if !errors.Is(older.Err(), service.ErrFenced) {
			t.Errorf("the epoch 0 replica stopped with %v, want service.ErrFenced", older.Err())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the epoch 0 replica still serves 5s after epoch 1 registered")
	}
	if survivor.Err() != nil {
		t.Fatalf("the epoch 1 replica stopped: %v", survivor.Err())
	}

	third := harness.StartPlane(t, claimedAs(t, s, "plane2"))
	if third.InstanceID() == a.InstanceID || third.Epoch() != 0 {
		t.Fatalf("plane2: got instance %s epoch %d, want a fresh instance at epoch 0", third.InstanceID(), third.Epoch())
	}
	var groups map[string][]micro.Info
	testkit.CheckFor(t, 5*time.Second, 50*time.Millisecond, func() error {
		groups = harness.ByInstance(harness.ServiceInstances(t, third.Ops(t)))
		if len(groups) != 2 || len(groups[a.InstanceID]) != 1 || len(groups[third.InstanceID()]) != 1 {
			return fmt.Errorf("service instances by plane: got %d planes %v, want the survivor's one and plane2's", len(groups), harness.Keys(groups))
		}
		return nil
	})
	checkInstances(t, groups[a.InstanceID], a.InstanceID, 1)
	checkInstances(t, groups[third.InstanceID()], third.InstanceID(), 0)
	for range 4 {
		if o := harness.Ask(t, harness.CallerConn(t, third, harness.OwnerA, "cli"), harness.OwnerA, "cli", subjects.EndpointManagerAuthority, "{}"); o.Code != "bad-request" {
			t.Errorf("a request to the queue group: got %q %q, want bad-request from a serving replica", o.Code, o.Message)
		}
	}
}

// A record the plane cannot read or parse refuses the start, saying which, and leaves nothing
// behind.
func TestAClaimedIdentityThatCannotBeReadOrParsedRefusesTheStart(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		inject  func(nc *nats.Conn, subject string) error
		want    error
		mention string
	}{
		{"malformed", func(nc *nats.Conn, subject string) error {
			_, err := nc.Request(subject, []byte(`{"ver":1,"instanceId":"not an id"}`), 5*time.Second)
			return err
		}, instance.ErrMalformed, "malformed"},
		{"a delete marker", func(nc *nats.Conn, subject string) error {
			m := nats.NewMsg(subject)
			m.Header.Set("KV-Operation", "DEL")
			_, err := nc.RequestMsg(m, 5*time.Second)
			return err
		}, instance.ErrUnreadable, "delete marker"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := harness.StartStandalone(t, harness.TestSpace)
			harness.StartPlane(t, harness.AgainstStandalone(s)) // creates the buckets
			nc, _ := harness.PlaneConn(t, s.Material, s.URL())
			key := subjects.IdentityKey("plane1")
			if err := tt.inject(nc, "$KV."+subjects.SecretsBucket(harness.TestSpace)+"."+key); err != nil {
				t.Fatal(err)
			}
			cfg := harness.PlaneConfig(t)
			claimedAs(t, s, "plane1")(&cfg)
			p, err := harness.TryStart(t, cfg)
			if err == nil {
				harness.ClosePlane(t, p)
				t.Fatal("start on a bad identity record: got a running plane, want a refusal")
			}
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.mention) || !strings.Contains(err.Error(), key) {
				t.Errorf("start: got %q, want %v saying %q and naming %s", err, tt.want, tt.mention, key)
			}
			if _, err := os.Stat(filepath.Join(cfg.Dir, admin.ServiceInfoFile)); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("after the refused start: stat %s: %v, want none", admin.ServiceInfoFile, err)
			}
		})
	}
}

// A file identity moves into the store with `authplane identity migrate`; until it does, a
// kv start beside it refuses, and a file that disagrees with the store always does.
func TestAFileIdentityMigratesIntoTheStoreAndOneThatDisagreesRefusesTheStart(t *testing.T) {
	t.Parallel()
	s := harness.StartStandalone(t, harness.TestSpace)
	dir := t.TempDir()
	first := harness.StartPlane(t, func(c *service.Config) { harness.AgainstStandalone(s)(c); c.Dir = dir })
	iid := first.InstanceID()
	harness.ClosePlane(t, first.Plane)

	kvOnDir := func(c *service.Config) { claimedAs(t, s, "plane1")(c); c.Dir = dir }
	cfg := harness.PlaneConfig(t)
	kvOnDir(&cfg)
	if p, err := harness.TryStart(t, cfg); err == nil {
		harness.ClosePlane(t, p)
		t.Fatal("kv start beside an unmigrated identity.json: got a running plane, want a refusal")
	} else if !errors.Is(err, instance.ErrDisagree) || !strings.Contains(err.Error(), "authplane identity migrate") {
		t.Fatalf("kv start beside an unmigrated identity.json: got %v, want ErrDisagree pointing at the migration", err)
	}

	code, stdout, stderr := harness.RunAuthplane(t, 30*time.Second, "identity", "migrate", "--dir", dir, "--instance-name", "plane1",
		"--nats-url", s.URL(), "--space-dir", s.SpaceDir)
	if code != 0 || !strings.Contains(stdout, iid) {
		t.Fatalf("authplane identity migrate: exit %d, stdout %q, stderr %q; want 0 naming %s", code, stdout, stderr, iid)
	}
	if _, err := os.Stat(filepath.Join(dir, instance.IdentityFile)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after migrate: stat %s: %v, want it removed", instance.IdentityFile, err)
	}
	again := harness.StartPlane(t, kvOnDir)
	if again.InstanceID() != iid || again.Epoch() != 1 {
		t.Errorf("kv start after migrate: got instance %s epoch %d, want %s epoch 1", again.InstanceID(), again.Epoch(), iid)
	}

	other := t.TempDir()
	if id, err := instance.LoadIdentity(other, harness.TestSpace); err != nil {
		t.Fatal(err)
	} else if err := instance.SaveIdentity(other, id); err != nil {
		t.Fatal(err)
	}
	cfg = harness.PlaneConfig(t)
	claimedAs(t, s, "plane1")(&cfg)
	cfg.Dir = other
	if p, err := harness.TryStart(t, cfg); err == nil {
		harness.ClosePlane(t, p)
		t.Fatal("kv start beside a disagreeing identity.json: got a running plane, want a refusal")
	} else if !errors.Is(err, instance.ErrDisagree) || !strings.Contains(err.Error(), iid) {
		t.Errorf("kv start beside a disagreeing identity.json: got %v, want ErrDisagree naming the stored %s", err, iid)
	}
	if again.Err() != nil {
		t.Errorf("the serving plane stopped: %v", again.Err())
	}
}
