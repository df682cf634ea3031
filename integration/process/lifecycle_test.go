package process

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/capability/instance"
	"github.com/cotal-ai/authplane/internal/core/store"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

func TestRestartOnTheSameDirReusesMaterialAndIdentityAndAdvancesTheEpoch(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	onDir := func(c *service.Config) { c.Dir = dir }

	first := harness.StartPlane(t, onDir)
	if !first.CreatedMaterial() {
		t.Errorf("first start: got CreatedMaterial false, want true")
	}
	if got := first.Epoch(); got != 0 {
		t.Errorf("first start: got epoch %d, want 0", got)
	}
	if !subjects.ValidUID(first.InstanceID()) {
		t.Errorf("first start: got instance id %q, want [a-z0-9]{26,32}", first.InstanceID())
	}
	dataKey, iid := first.Keys().Data.Public(), first.InstanceID()
	checkPrivateFiles(t, dir)
	harness.ClosePlane(t, first.Plane)
	if _, err := os.Stat(filepath.Join(dir, admin.ServiceInfoFile)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after Close: got stat %s error %v, want it removed", admin.ServiceInfoFile, err)
	}

	for wantEpoch := uint64(1); wantEpoch <= 2; wantEpoch++ {
		// A readiness file left by a crash must not survive the start.
		stale := []byte(`{"ver":1,"url":"http://127.0.0.1:1","natsUrl":"nats://127.0.0.1:1","pid":1,"cap":"00"}`)
		if err := os.WriteFile(filepath.Join(dir, admin.ServiceInfoFile), stale, 0o600); err != nil {
			t.Fatal(err)
		}
		p := harness.StartPlane(t, onDir)
		if info := harness.ReadServiceInfo(t, dir, time.Second); info.PID != os.Getpid() || info.URL != p.HTTPURL() || info.NATSURL != p.NATSURL() {
			t.Errorf("restart %d: got auth-service.json %+v, want this plane's pid %d, %s and %s", wantEpoch, info, os.Getpid(), p.HTTPURL(), p.NATSURL())
		}
		if p.CreatedMaterial() {
			t.Errorf("restart %d: got CreatedMaterial true, want false", wantEpoch)
		}
		if got := p.Keys().Data.Public(); got != dataKey {
			t.Errorf("restart %d: got data account %s, want %s (the material of the first start)", wantEpoch, got, dataKey)
		}
		if got := p.InstanceID(); got != iid {
			t.Errorf("restart %d: got instance id %s, want %s", wantEpoch, got, iid)
		}
		if got := p.Epoch(); got != wantEpoch {
			t.Errorf("restart %d: got epoch %d, want %d", wantEpoch, got, wantEpoch)
		}
		info := harness.ServiceInfo(t, harness.OpsConn(t, p, harness.OwnerA, "ops"))
		wantMeta := map[string]string{
			"space": harness.TestSpace, "issuer": subjects.Issuer(harness.TestSpace), "instance": iid,
			"epoch": strconv.FormatUint(wantEpoch, 10), "protocol": subjects.Protocol,
		}
		for k, want := range wantMeta {
			if got := info.Metadata[k]; got != want {
				t.Errorf("restart %d: got metadata %s=%q, want %q", wantEpoch, k, got, want)
			}
		}
		harness.ClosePlane(t, p.Plane)
	}
}

// checkPrivateFiles checks that everything the plane wrote under dir is 0600 (files) or 0700
// (directories), except the embedded broker's own store.
func checkPrivateFiles(t *testing.T, dir string) {
	t.Helper()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "nats" && filepath.Dir(path) == dir {
			return filepath.SkipDir // the broker's store: nats-server's own modes
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		want := fs.FileMode(0o600)
		if d.IsDir() {
			want = 0o700
		}
		if path != dir && fi.Mode().Perm() != want {
			t.Errorf("%s: got mode %o, want %o", path, fi.Mode().Perm(), want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestStartRefusesABadConfigurationNamingEveryFlag(t *testing.T) {
	t.Parallel()
	cfg := harness.PlaneConfig(t)
	cfg.Space = "Bad Space"
	cfg.NATSURL = "not a url"
	cfg.Replicas = 2
	cfg.Workers = 0
	cfg.RequestTimeout = time.Millisecond
	cfg.StandingTTL = time.Second
	p, err := harness.TryStart(t, cfg)
	if err == nil {
		harness.ClosePlane(t, p)
		t.Fatal("Start with a bad configuration: got a running plane, want an error")
	}
	for _, flag := range []string{"--space", "--nats-url", "--replicas", "--workers", "--request-timeout", "--standing-ttl"} {
		if !strings.Contains(err.Error(), flag+" ") {
			t.Errorf("Start: got error %q, want it to name %s", err, flag)
		}
	}
	if entries, rerr := os.ReadDir(cfg.Dir); rerr != nil || len(entries) != 0 {
		t.Errorf("after the refused start: state dir holds %v (%v), want nothing written", entries, rerr)
	}
}

func TestSecondStartOnADirInUseFailsNamingTheHolderPid(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := harness.StartPlane(t, func(c *service.Config) { c.Dir = dir })

	cfg := harness.PlaneConfig(t)
	cfg.Dir = dir
	second, err := harness.TryStart(t, cfg)
	if err == nil {
		harness.ClosePlane(t, second)
		t.Fatalf("second Start on %s: got a running plane, want an error", dir)
	}
	want := fmt.Sprintf("in use by pid %d", os.Getpid())
	if !strings.Contains(err.Error(), want) {
		t.Errorf("second Start: got error %q, want it to contain %q", err, want)
	}
	if !errors.Is(err, service.ErrLocked) {
		t.Errorf("second Start: got error %v, want errors.Is service.ErrLocked", err)
	}

	// The refused start left the running plane alone: its readiness file and HTTP face stay.
	if _, err := os.Stat(filepath.Join(dir, admin.ServiceInfoFile)); err != nil {
		t.Errorf("after the refused start: %s: %v, want it kept", admin.ServiceInfoFile, err)
	}
	resp, err := http.Get(p.HTTPURL() + "/health")
	if err != nil {
		t.Fatalf("GET /health after the refused start: %v", err)
	}
	if err := resp.Body.Close(); err != nil {
		t.Error(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /health after the refused start: got %d, want 200", resp.StatusCode)
	}
}

func TestNewerRegistrationOfTheSameIdentityFencesTheOlderPlane(t *testing.T) {
	t.Parallel()
	s := harness.StartStandalone(t, harness.TestSpace)
	dirA, dirB := t.TempDir(), t.TempDir()
	a := harness.StartPlane(t, func(c *service.Config) { harness.AgainstStandalone(s)(c); c.Dir = dirA })
	if got := a.Epoch(); got != 0 {
		t.Fatalf("plane A: got epoch %d, want 0", got)
	}

	harness.CopyIdentity(t, dirA, dirB)
	b := harness.StartPlane(t, func(c *service.Config) { harness.AgainstStandalone(s)(c); c.Dir = dirB })
	registered := time.Now()
	if b.InstanceID() != a.InstanceID() {
		t.Fatalf("plane B: got instance %s, want A's %s (the copied identity)", b.InstanceID(), a.InstanceID())
	}
	if got := b.Epoch(); got != 1 {
		t.Errorf("plane B: got epoch %d, want 1", got)
	}

	select {
	case <-a.Done():
		t.Logf("plane A stopped %s after B registered", time.Since(registered).Round(time.Millisecond))
	case <-time.After(3 * time.Second):
		t.Fatalf("plane A still running 3s after B registered epoch 1, want it stopped within a second")
	}
	if elapsed := time.Since(registered); elapsed > time.Second {
		t.Errorf("plane A stopped %s after B registered, want within 1s", elapsed)
	}
	if err := a.Err(); !errors.Is(err, service.ErrFenced) {
		t.Errorf("plane A: got Err %v, want service.ErrFenced", err)
	}

	// Only B's service instances answer discovery: A's stopped with the fence.
	checkInstances(t, harness.ServiceInstances(t, harness.OpsConn(t, b, harness.OwnerA, "ops")), b.InstanceID(), 1)
	nc := harness.CallerConn(t, b, harness.OwnerA, "cli")

	// B serves: a request reaches it and gets the endpoint's answer, not silence.
	msg, err := nc.Request(subjects.EndpointSubject(harness.TestSpace, subjects.EndpointManagerAuthority, harness.OwnerA, "cli"), []byte("{}"), 5*time.Second)
	if err != nil {
		t.Fatalf("request to B after the fence: %v", err)
	}
	if got := msg.Header.Get("Nats-Service-Error-Code"); got == "503" {
		t.Errorf("request to B after the fence: got 503, want B serving")
	}
}

func TestFencedPlaneAnswersARequestInFlightUnavailable(t *testing.T) {
	t.Parallel()
	s := harness.StartStandalone(t, harness.TestSpace)
	dirA := t.TempDir()
	reached, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	a := harness.StartPlane(t, func(c *service.Config) {
		harness.AgainstStandalone(s)(c)
		c.Dir = dirA
		c.Hooks = &service.Hooks{BeforeCommit: func() {
			once.Do(func() {
				close(reached)
				<-release
			})
		}}
	})
	harness.Grant(t, a, harness.OwnerA, "cli", "supervise")
	cli := harness.CallerConn(t, a, harness.OwnerA, "cli")
	result := make(chan harness.Outcome, 1)
	go func() {
		result <- harness.AskAsync(cli, harness.OwnerA, "cli", subjects.EndpointManagerAuthority, harness.NewManagerKeys(t).Body(t, "prepare", "cli"))
	}()
	select {
	case <-reached:
	case <-time.After(10 * time.Second):
		t.Fatal("the prepare never reached its commit")
	}

	dirB := t.TempDir()
	harness.CopyIdentity(t, dirA, dirB)
	harness.StartPlane(t, func(c *service.Config) { harness.AgainstStandalone(s)(c); c.Dir = dirB })
	select {
	case <-a.Done():
	case <-time.After(3 * time.Second):
		close(release)
		t.Fatal("plane A still running 3s after B registered, want it fenced")
	}
	close(release)

	o := <-result
	if o.Code != "unavailable" || o.Numeric != 503 {
		t.Errorf("the request in flight at the fence: got %q %d %q, want unavailable 503", o.Code, o.Numeric, o.Message)
	}
	if len(o.Material.Credentials) != 0 {
		t.Errorf("the request in flight at the fence: got %d credentials, want none", len(o.Material.Credentials))
	}
}

func TestBucketWithTheWrongConfigurationRefusesTheStart(t *testing.T) {
	t.Parallel()
	auth := "KV_" + subjects.AuthBucket(harness.TestSpace)
	audit := subjects.AuditStream(harness.TestSpace)
	minted := subjects.MintedStream(harness.TestSpace)
	tests := []struct {
		name   string
		stream string
		edit   func(*jetstream.StreamConfig)
		fields []string
	}{
		// The embedded broker's fences allow direct gets (their one server answers them); those
		// of a broker the plane does not run allow none (a bucket moved within a cluster gains a
		// follower for a while), and a record stream allows none (its auditors' import carries
		// the API's message get only).
		{"direct reads on the fences of a broker the plane does not run", auth, func(c *jetstream.StreamConfig) { c.AllowDirect = true }, []string{"allow_direct"}},
		{"direct reads on the audit stream", audit, func(c *jetstream.StreamConfig) { c.AllowDirect = true }, []string{"allow_direct"}},
		{"purge allowed on the fences", auth, func(c *jetstream.StreamConfig) { c.DenyPurge = false }, []string{"deny_purge"}},
		{"direct reads and purge on the minted stream", minted, func(c *jetstream.StreamConfig) { c.AllowDirect, c.DenyPurge = true, false }, []string{"allow_direct", "deny_purge"}},
		{"rollups, deletes and purges on the audit stream", audit, func(c *jetstream.StreamConfig) {
			c.AllowRollup, c.DenyDelete, c.DenyPurge = true, false, false
		}, []string{"allow_rollup_hdrs", "deny_delete", "deny_purge"}},
		{"a write-once bucket that overwrites", "KV_" + subjects.AcceptedBucket(harness.TestSpace), func(c *jetstream.StreamConfig) {
			c.Discard, c.DiscardNewPerSubject = jetstream.DiscardOld, false
		}, []string{"discard", "discard_new_per_subject"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := harness.StartStandalone(t, harness.TestSpace)
			var cfg jetstream.StreamConfig
			for _, spec := range store.Specs(harness.TestSpace, store.Options{}) {
				if spec.Config.Name == tt.stream {
					cfg = spec.Config
				}
			}
			if cfg.Name == "" {
				t.Fatalf("no spec for stream %s", tt.stream)
			}
			tt.edit(&cfg)
			_, js := harness.PlaneConn(t, s.Material, s.URL())
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := js.CreateStream(ctx, cfg); err != nil {
				t.Fatalf("pre-create %s: %v", tt.stream, err)
			}

			start := harness.PlaneConfig(t)
			harness.AgainstStandalone(s)(&start)
			p, err := harness.TryStart(t, start)
			if err == nil {
				harness.ClosePlane(t, p)
				t.Fatalf("Start on a misconfigured %s: got a running plane, want service.ErrMisconfigured", tt.stream)
			}
			if !errors.Is(err, service.ErrMisconfigured) {
				t.Errorf("Start: got error %v, want errors.Is service.ErrMisconfigured", err)
			}
			for _, want := range append([]string{tt.stream}, tt.fields...) {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Start: got error %q, want it to name %q", err, want)
				}
			}
			// The refused start released the state dir and served nothing.
			if _, err := os.Stat(filepath.Join(start.Dir, admin.ServiceInfoFile)); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("after the refused start: stat %s: %v, want no readiness file", admin.ServiceInfoFile, err)
			}
			// Polled: a binary another test forks at this moment holds a copy of every open file
			// until its exec closes them, the lock's too.
			testkit.CheckFor(t, 2*time.Second, 20*time.Millisecond, func() error {
				lock, err := instance.Acquire(start.Dir)
				if err != nil {
					return fmt.Errorf("after the refused start: %w, want the state dir free", err)
				}
				return lock.Release()
			})
		})
	}
}

func TestInitConfigIsAcceptedByNATSServerAndAPlaneServesOnIt(t *testing.T) {
	t.Parallel()
	s := harness.StartStandalone(t, harness.TestSpace)
	if !s.Srv.JetStreamEnabled() {
		t.Errorf("nats-server from init's config: got JetStream off, want on")
	}
	p := harness.StartPlane(t, harness.AgainstStandalone(s))
	if p.CreatedMaterial() {
		t.Errorf("plane on init's material: got CreatedMaterial true, want false")
	}
	if got, want := p.Keys().Data.Public(), s.Material.Data.Public(); got != want {
		t.Errorf("plane on init's material: got data account %s, want %s", got, want)
	}
	checkInstances(t, harness.ServiceInstances(t, harness.OpsConn(t, p, harness.OwnerA, "ops")), p.InstanceID(), 0)
}

// The embedded broker's buckets allow direct gets, as they have one replica on a server of the
// plane's own, which is no cluster; its record streams allow none.
func TestTheEmbeddedBrokersBucketsAllowDirectGets(t *testing.T) {
	t.Parallel()
	p := harness.StartPlane(t, nil)
	_, js := harness.PlaneConn(t, p.Keys(), p.NATSURL())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, spec := range store.Specs(harness.TestSpace, store.Options{}) {
		st, err := js.Stream(ctx, spec.Config.Name)
		if err != nil {
			t.Fatal(err)
		}
		c := st.CachedInfo().Config
		if want := spec.Bucket != ""; c.AllowDirect != want || c.Replicas != 1 {
			t.Errorf("%s: allow_direct %v with %d replicas, want %v with 1", c.Name, c.AllowDirect, c.Replicas, want)
		}
	}
}
