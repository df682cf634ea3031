package fence_test

import (
	"errors"
	"testing"

	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/internal/testkit"
)

// soleKV is a bucket whose reads cannot be stale, as the embedded broker's buckets of one
// replica are.
type soleKV struct{ *testkit.KV }

func (soleKV) Sole() bool { return true }

// soleSetup returns a sole bucket holding r at "k", wrapped by wrap, and the fence there,
// observed.
func soleSetup(t *testing.T, r row, wrap func(fence.KV) fence.KV) (*testkit.KV, *fence.Observed[row]) {
	t.Helper()
	kv := testkit.NewKV()
	put(t, kv, r)
	o, err := fence.New(wrap(soleKV{kv}), "k", parse, nil).Observe(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	return kv, o
}

// The wrappers a sole bucket may sit in: none, the gates' grouped commits, the shared reads.
var soleWraps = map[string]func(fence.KV) fence.KV{
	"plain":   func(kv fence.KV) fence.KV { return kv },
	"grouped": func(kv fence.KV) fence.KV { return fence.Group(kv) },
	"shared":  func(kv fence.KV) fence.KV { return fence.Share(kv) },
}

func TestACommitOnASoleBucketIsAReadThatWritesNothing(t *testing.T) {
	for name, wrap := range soleWraps {
		t.Run(name, func(t *testing.T) {
			kv, o := soleSetup(t, fresh("open", 0), wrap)
			before := kv.Revision()
			c, err := o.Commit(ctx(t))
			if err != nil {
				t.Fatalf("got %v, want the commit to hold", err)
			}
			if kv.Revision() != before {
				t.Fatalf("the bucket moved from revision %d to %d: a commit on a sole bucket writes nothing", before, kv.Revision())
			}
			if c.Revision != o.Revision || string(c.Raw) != string(o.Raw) {
				t.Fatalf("committed at revision %d with %s, want the row as observed at %d", c.Revision, c.Raw, o.Revision)
			}
		})
	}
}

func TestACommitOnASoleBucketIsRefusedOnceAFenceWriterChangedTheRow(t *testing.T) {
	for name, wrap := range soleWraps {
		t.Run(name, func(t *testing.T) {
			kv, o := soleSetup(t, fresh("open", 0), wrap)
			put(t, kv, fresh("frozen", 0)) // an end's freeze, from another plane
			before := kv.Revision()
			if _, err := o.Commit(ctx(t)); !errors.Is(err, fence.ErrMoved) {
				t.Fatalf("got %v, want ErrMoved", err)
			}
			if kv.Revision() != before {
				t.Fatalf("the refused commit wrote: revision %d, want %d", kv.Revision(), before)
			}
		})
	}
}

func TestACommitOnASoleBucketHoldsOnTheSameBytesAtALaterRevision(t *testing.T) {
	kv, o := soleSetup(t, fresh("open", 0), soleWraps["plain"])
	kv.Put("k", o.Raw) // another mint's commit by CAS, as a replicated bucket's would be
	c, err := o.Commit(ctx(t))
	if err != nil {
		t.Fatalf("got %v, want the commit to hold: the bytes are unchanged", err)
	}
	if c.Revision != kv.Revision() {
		t.Fatalf("committed at revision %d, want the row's latest, %d", c.Revision, kv.Revision())
	}
}

func TestACommitOnASoleBucketIsRefusedOnAMarker(t *testing.T) {
	kv, o := soleSetup(t, fresh("open", 0), soleWraps["plain"])
	kv.Delete("k")
	if _, err := o.Commit(ctx(t)); !errors.Is(err, fence.ErrGone) {
		t.Fatalf("got %v, want ErrGone", err)
	}
}

func TestACommitOnABucketThatIsNotSoleIsACAS(t *testing.T) {
	kv := testkit.NewKV()
	put(t, kv, fresh("open", 0))
	o, err := fence.New(fence.Group(kv), "k", parse, nil).Observe(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	before := kv.Revision()
	if _, err := o.Commit(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if kv.Revision() == before {
		t.Fatal("the bucket did not move: a bucket that does not say it is sole commits by CAS")
	}
}
