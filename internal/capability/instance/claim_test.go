package instance

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/subjects"
)

func TestClaimCreatesOnceAndEveryLaterOrConcurrentClaimAdoptsTheRecord(t *testing.T) {
	kv := testkit.NewKV()
	const n = 16
	got := make([]Identity, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { got[i], errs[i] = Claim(ctx(t), kv, t.TempDir(), "default", "plane1") })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("claim %d: %v", i, errs[i])
		}
		if got[i].InstanceID != got[0].InstanceID || !subjects.ValidUID(got[i].InstanceID) || got[i].Space != "default" {
			t.Fatalf("claim %d: got %+v, want claim 0's instance %s", i, got[i], got[0].InstanceID)
		}
	}
	if kv.Revision() != 1 {
		t.Errorf("got %d writes to the bucket, want the one record", kv.Revision())
	}
	for i, id := range got {
		if !id.Fresh {
			t.Errorf("claim %d: not fresh, want every claim fresh: none has registered the gate, and a replica racing the claimer may find it absent", i)
		}
	}
	if again, err := Claim(ctx(t), kv, t.TempDir(), "default", "plane1"); err != nil || !again.Fresh {
		t.Errorf("a later claim before any registration: got %+v %v, want fresh", again, err)
	}
	if err := MarkRegistered(ctx(t), kv, got[0], "plane1"); err != nil {
		t.Fatal(err)
	}
	if err := MarkRegistered(ctx(t), kv, got[1], "plane1"); err != nil || kv.Revision() != 2 {
		t.Errorf("a second mark: got %v and %d writes, want nil and no write", err, kv.Revision())
	}
	again, err := Claim(ctx(t), kv, t.TempDir(), "default", "plane1")
	if err != nil || again.InstanceID != got[0].InstanceID || again.Fresh {
		t.Errorf("a claim once marked: got %+v %v, want instance %s, not fresh (it registered before)", again, err, got[0].InstanceID)
	}
	other, err := Claim(ctx(t), kv, t.TempDir(), "default", "plane2")
	if err != nil || other.InstanceID == got[0].InstanceID {
		t.Errorf("another name: got %+v %v, want a fresh instance", other, err)
	}
}

func TestClaimSettlesAWriteOfUnknownOutcome(t *testing.T) {
	kv := testkit.NewKV()
	kv.Fault = testkit.FailOnce(true)
	id, err := Claim(ctx(t), kv, t.TempDir(), "default", "plane1")
	if err != nil || kv.Revision() != 1 {
		t.Fatalf("got %+v %v after %d writes, want the record that landed", id, err, kv.Revision())
	}
	again, err := Claim(ctx(t), kv, t.TempDir(), "default", "plane1")
	if err != nil || again.InstanceID != id.InstanceID {
		t.Errorf("the next claim: got %+v %v, want %s", again, err, id.InstanceID)
	}
}

func TestClaimRefusesARecordItCannotReadOrParseSayingWhich(t *testing.T) {
	key := subjects.IdentityKey("plane1")
	tests := []struct {
		name    string
		fault   func(*testkit.KV)
		want    error
		mention string
	}{
		{"not JSON", func(kv *testkit.KV) { kv.Put(key, []byte("garbage")) }, ErrMalformed, "malformed"},
		{"another space's record", func(kv *testkit.KV) {
			kv.Put(key, []byte(`{"ver":1,"space":"other","name":"plane1","instanceId":"abcdefghijklmnopqrstuvwxyz"}`))
		}, ErrMalformed, "malformed"},
		{"another name's record", func(kv *testkit.KV) {
			kv.Put(key, []byte(`{"ver":1,"space":"default","name":"plane2","instanceId":"abcdefghijklmnopqrstuvwxyz"}`))
		}, ErrMalformed, "malformed"},
		{"a bad instance id", func(kv *testkit.KV) {
			kv.Put(key, []byte(`{"ver":1,"space":"default","name":"plane1","instanceId":"NOT-AN-ID"}`))
		}, ErrMalformed, "malformed"},
		{"a seed beside the id", func(kv *testkit.KV) {
			kv.Put(key, []byte(`{"ver":1,"space":"default","name":"plane1","instanceId":"abcdefghijklmnopqrstuvwxyz","seed":"SU…"}`))
		}, ErrMalformed, "malformed"},
		{"a delete marker", func(kv *testkit.KV) { kv.Delete(key) }, ErrUnreadable, "unreadable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kv := testkit.NewKV()
			tt.fault(kv)
			before := kv.Revision()
			_, err := Claim(ctx(t), kv, t.TempDir(), "default", "plane1")
			if !errors.Is(err, tt.want) {
				t.Fatalf("got %v, want %v", err, tt.want)
			}
			if msg := err.Error(); !strings.Contains(msg, tt.mention) || !strings.Contains(msg, key) {
				t.Errorf("got %q, want it to say %q and name %s", msg, tt.mention, key)
			}
			if kv.Revision() != before {
				t.Errorf("the refused claim wrote to the bucket")
			}
		})
	}
}

func TestClaimRefusesAFileIdentityTheStoreDoesNotHold(t *testing.T) {
	dir := t.TempDir()
	file := identityFile(t, dir)

	t.Run("the store has no record: migrate first", func(t *testing.T) {
		kv := testkit.NewKV()
		_, err := Claim(ctx(t), kv, dir, "default", "plane1")
		if !errors.Is(err, ErrDisagree) || !strings.Contains(err.Error(), "authplane identity migrate") {
			t.Fatalf("got %v, want ErrDisagree pointing at 'authplane identity migrate'", err)
		}
		if kv.Revision() != 0 {
			t.Errorf("the refused claim wrote a record")
		}
	})
	t.Run("the store holds another instance", func(t *testing.T) {
		kv := testkit.NewKV()
		stored, err := Claim(ctx(t), kv, t.TempDir(), "default", "plane1")
		if err != nil {
			t.Fatal(err)
		}
		_, err = Claim(ctx(t), kv, dir, "default", "plane1")
		if !errors.Is(err, ErrDisagree) || !strings.Contains(err.Error(), file.InstanceID) || !strings.Contains(err.Error(), stored.InstanceID) {
			t.Fatalf("got %v, want ErrDisagree naming both %s and %s", err, file.InstanceID, stored.InstanceID)
		}
	})
	t.Run("the store holds the same instance", func(t *testing.T) {
		kv := testkit.NewKV()
		if _, err := Migrate(ctx(t), kv, copyDir(t, dir), "default", "plane1"); err != nil {
			t.Fatal(err)
		}
		got, err := Claim(ctx(t), kv, dir, "default", "plane1")
		if err != nil || got.InstanceID != file.InstanceID {
			t.Fatalf("got %+v %v, want %s", got, err, file.InstanceID)
		}
	})
}

func TestMigrateMovesTheFileIntoTheStoreThenRemovesIt(t *testing.T) {
	kv := testkit.NewKV()
	dir := t.TempDir()
	file := identityFile(t, dir)
	// A migration whose removal did not happen is completed by a repeat.
	keep := copyDir(t, dir)
	for _, d := range []string{keep, dir} {
		got, err := Migrate(ctx(t), kv, d, "default", "plane1")
		if err != nil || got.InstanceID != file.InstanceID {
			t.Fatalf("migrate %s: got %+v %v, want %s", d, got, err, file.InstanceID)
		}
		if _, err := os.Stat(filepath.Join(d, IdentityFile)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("after migrate: stat %s: %v, want it removed", IdentityFile, err)
		}
	}
	claimed, err := Claim(ctx(t), kv, t.TempDir(), "default", "plane1")
	if err != nil || claimed.InstanceID != file.InstanceID {
		t.Fatalf("claim after migrate: got %+v %v, want %s", claimed, err, file.InstanceID)
	}
	if _, err := Migrate(ctx(t), kv, dir, "default", "plane1"); err == nil || !strings.Contains(err.Error(), "no identity to migrate") {
		t.Errorf("migrate without a file: got %v, want a refusal saying there is none", err)
	}

	other := t.TempDir()
	identityFile(t, other)
	if _, err := Migrate(ctx(t), kv, other, "default", "plane1"); !errors.Is(err, ErrDisagree) {
		t.Fatalf("migrate onto another instance's record: got %v, want ErrDisagree", err)
	}
	if _, err := os.Stat(filepath.Join(other, IdentityFile)); err != nil {
		t.Errorf("after a refused migrate: %v, want the file kept", err)
	}
}

// copyDir copies dir's identity file into a new directory.
func copyDir(t *testing.T, dir string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, IdentityFile))
	if err != nil {
		t.Fatal(err)
	}
	to := t.TempDir()
	if err := os.WriteFile(filepath.Join(to, IdentityFile), raw, 0o600); err != nil {
		t.Fatal(err)
	}
	return to
}

// identityFile writes a fresh identity file into dir, as a plane's first start does once it has
// registered, and returns it.
func identityFile(t *testing.T, dir string) Identity {
	t.Helper()
	id, err := LoadIdentity(dir, "default")
	if err != nil || !id.Fresh {
		t.Fatalf("a directory without an identity: got %+v %v, want a fresh one", id, err)
	}
	if err := SaveIdentity(dir, id); err != nil {
		t.Fatal(err)
	}
	id.Fresh = false
	return id
}
