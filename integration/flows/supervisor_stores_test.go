package flows

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/capability/supervisor"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// TestTheAcceptedRowStreamRefusesASecondWriteEvenFromAWriterThatBypassesThePlane: a writer
// with the plane account's own rights, not going through the plane's code, can neither
// replace, delete nor purge an accepted row the plane wrote, nor write a fresh key twice: the
// stream's configuration refuses it, not the plane.
func TestTheAcceptedRowStreamRefusesASecondWriteEvenFromAWriterThatBypassesThePlane(t *testing.T) {
	t.Parallel()
	p, _, s := harness.SupervisedPlane(t, nil, time.Now().Add(time.Hour))

	ctx := harness.CallCtx(t)
	bucket := subjects.AcceptedBucket(harness.TestSpace)
	kv, err := p.JS(t).KeyValue(ctx, bucket)
	if err != nil {
		t.Fatal(err)
	}
	key := subjects.AcceptedKey(supervisor.AcceptedToken(s.Owner, s.M.Iid, s.M.Uid, subjects.DutySupervisor))
	orig, err := kv.Get(ctx, key)
	if err != nil {
		t.Fatalf("the plane's accepted row of the supervisor generation: %v", err)
	}
	forged := []byte(`{"version":1,"ref":{"space":"default","owner":"` + s.Owner + `","actor":"x","uid":"y","generation":"forged"}}`)
	if _, err := kv.Put(ctx, key, forged); err == nil {
		t.Error("a KV put over the plane's row: got success, want the stream to refuse it")
	}
	if _, err := p.JS(t).Publish(ctx, "$KV."+bucket+"."+key, forged); err == nil {
		t.Error("a raw publish over the plane's row: got success, want the stream to refuse it")
	}
	if err := kv.Delete(ctx, key); err == nil {
		t.Error("a KV delete of the plane's row: got success, want the stream to refuse it")
	}
	if err := kv.Purge(ctx, key); err == nil {
		t.Error("a KV purge of the plane's row: got success, want the stream to refuse it")
	}
	now, err := kv.Get(ctx, key)
	if err != nil || !bytes.Equal(now.Value(), orig.Value()) || now.Revision() != orig.Revision() {
		t.Fatalf("the plane's row after the attempts: got %q at %d (%v), want %q at %d", now.Value(), now.Revision(), err, orig.Value(), orig.Revision())
	}

	fresh := subjects.AcceptedKey("00000000000000000000000000000000")
	if _, err := kv.Put(ctx, fresh, []byte(`{"first":true}`)); err != nil {
		t.Fatalf("a first write of a fresh key: %v", err)
	}
	if _, err := kv.Put(ctx, fresh, []byte(`{"second":true}`)); err == nil {
		t.Error("a second write of a fresh key: got success, want the stream to refuse it")
	}
	if got, err := kv.Get(ctx, fresh); err != nil || string(got.Value()) != `{"first":true}` {
		t.Errorf("the fresh key: got %q (%v), want the first write", got.Value(), err)
	}
}

// TestTheLiveSigningKeysAreReappliedAtEveryStart: a broker that lost the data account's JWT
// (its resolver's store is gone) starts again from the space material, which lists no
// instance's key; the plane's next start signs and pushes the live keys again, and the ended
// supervisor's credential is refused (its key is not among them).
func TestTheLiveSigningKeysAreReappliedAtEveryStart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	onDir := func(c *service.Config) { c.Dir = dir }
	p, pa, s := harness.SupervisedPlane(t, onDir, time.Now().Add(time.Hour))
	if _, err := pa.End(s); err != nil {
		t.Fatalf("end: %v", err)
	}
	harness.WantRefusedToConnect(t, p.NATSURL(), s, subjects.DutySupervisor, s.Prep.Credentials["supervisor"].JWT)
	harness.ClosePlane(t, p.Plane)

	if err := os.RemoveAll(filepath.Join(dir, "nats", "resolver")); err != nil {
		t.Fatal(err)
	}
	again := harness.StartPlane(t, onDir)
	harness.WantRefusedToConnect(t, again.NATSURL(), s, subjects.DutySupervisor, s.Prep.Credentials["supervisor"].JWT)
	harness.WantRefusedToConnect(t, again.NATSURL(), s, subjects.DutyExecutor, s.Prep.Credentials["executor"].JWT)
}

// TestWithoutTheOperatorSigningKeyAnEndSaysItDidNotRevoke: an operator that keeps its signing
// key elsewhere gets an end that retires everything the plane holds and says revoked:false with
// the reason (every credential was signed with the data account's own key, which no end can
// take off); the expiry clamp still bounds the credentials.
func TestWithoutTheOperatorSigningKeyAnEndSaysItDidNotRevoke(t *testing.T) {
	t.Parallel()
	sa := harness.StartStandalone(t, harness.TestSpace)
	if err := os.Remove(filepath.Join(sa.SpaceDir, "operator-signing.nk")); err != nil {
		t.Fatal(err)
	}
	_, pa, s := harness.SupervisedPlane(t, harness.AgainstStandalone(sa), time.Now().Add(time.Hour))
	r, err := pa.End(s)
	if err != nil {
		t.Fatalf("end: %v", err)
	}
	if r.Revoked.Done || !strings.Contains(r.Revoked.Reason, "operator signing key") || r.Evicted.Complete ||
		r.Retired.Gate != "retired" || r.Assignment.State != client.StateEnded || len(r.Revoked.NKeys) != 5 {
		t.Fatalf("end report: got %+v, want everything retired, the keys listed, and revoked:false saying why", r)
	}
	_, err = pa.Authority(s, client.OpRenew)
	harness.WantRefusalOf(t, "supervisor-authority after the end", err, "permission-denied", endedText(s.Owner))
}
