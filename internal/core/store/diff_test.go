package store

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotal-ai/authplane/subjects"
)

// witnessOwner is the owner whose witness stream the tests check.
const witnessOwner = "u_aaaaaaaaaaaaaaaaaaaaaaaaaa"

// allSpecs are Specs("default", o) and witnessOwner's witness.
func allSpecs(o Options) []Spec {
	return append(Specs("default", o), WitnessSpec("default", witnessOwner, o))
}

// specNamed returns the spec of stream name among allSpecs(o).
func specNamed(t *testing.T, name string, o Options) Spec {
	t.Helper()
	for _, s := range allSpecs(o) {
		if s.Config.Name == name {
			return s
		}
	}
	t.Fatalf("no spec for stream %s", name)
	return Spec{}
}

func TestDiffReportsNothingForTheSpecItself(t *testing.T) {
	for _, s := range allSpecs(Options{}) {
		if d := diffOf(s, s.Config); len(d) != 0 {
			t.Errorf("diffOf(%s, its own config): got %v, want nothing", s.Config.Name, d)
		}
	}
}

func TestDiffReportsEachUnsafeField(t *testing.T) {
	fences := "KV_" + subjects.AuthBucket("default")
	writeOnce := "KV_" + subjects.AcceptedBucket("default")
	witness := subjects.WitnessStream("default", witnessOwner)
	minted := subjects.MintedStream("default")
	tests := []struct {
		field  string
		stream string
		edit   func(*jetstream.StreamConfig)
	}{
		{"subjects", fences, func(c *jetstream.StreamConfig) { c.Subjects = []string{"$KV.other.>"} }},
		{"retention", fences, func(c *jetstream.StreamConfig) { c.Retention = jetstream.WorkQueuePolicy }},
		{"storage", fences, func(c *jetstream.StreamConfig) { c.Storage = jetstream.MemoryStorage }},
		{"replicas", fences, func(c *jetstream.StreamConfig) { c.Replicas = 3 }},
		{"max_msgs_per_subject", fences, func(c *jetstream.StreamConfig) { c.MaxMsgsPerSubject = 5 }},
		{"discard", fences, func(c *jetstream.StreamConfig) { c.Discard = jetstream.DiscardNew }},
		{"discard_new_per_subject", writeOnce, func(c *jetstream.StreamConfig) { c.DiscardNewPerSubject = false }},
		{"allow_direct", minted, func(c *jetstream.StreamConfig) { c.AllowDirect = true }},
		{"mirror_direct", fences, func(c *jetstream.StreamConfig) { c.MirrorDirect = true }},
		{"allow_rollup_hdrs", fences, func(c *jetstream.StreamConfig) { c.AllowRollup = true }},
		{"deny_delete", fences, func(c *jetstream.StreamConfig) { c.DenyDelete = false }},
		{"deny_purge", fences, func(c *jetstream.StreamConfig) { c.DenyPurge = false }},
		{"no_ack", witness, func(c *jetstream.StreamConfig) { c.NoAck = false }},
		{"max_msgs", fences, func(c *jetstream.StreamConfig) { c.MaxMsgs = 10 }},
		{"sealed", fences, func(c *jetstream.StreamConfig) { c.Sealed = true }},
		{"mirror", fences, func(c *jetstream.StreamConfig) { c.Mirror = &jetstream.StreamSource{Name: "X"} }},
		{"sources", fences, func(c *jetstream.StreamConfig) { c.Sources = []*jetstream.StreamSource{{Name: "X"}} }},
		{"subject_transform", fences, func(c *jetstream.StreamConfig) {
			c.SubjectTransform = &jetstream.SubjectTransformConfig{Source: ">", Destination: "x.>"}
		}},
		{"republish", fences, func(c *jetstream.StreamConfig) { c.RePublish = &jetstream.RePublish{Source: ">", Destination: "x.>"} }},
		{"allow_msg_ttl", fences, func(c *jetstream.StreamConfig) { c.AllowMsgTTL = true }},
		{"subject_delete_marker_ttl", fences, func(c *jetstream.StreamConfig) { c.SubjectDeleteMarkerTTL = time.Second }},
		{"allow_msg_counter", fences, func(c *jetstream.StreamConfig) { c.AllowMsgCounter = true }},
		{"allow_atomic", fences, func(c *jetstream.StreamConfig) { c.AllowAtomicPublish = true }},
		{"allow_batched", fences, func(c *jetstream.StreamConfig) { c.AllowBatchPublish = true }},
		{"allow_msg_schedules", fences, func(c *jetstream.StreamConfig) { c.AllowMsgSchedules = true }},
		{"max_age", fences, func(c *jetstream.StreamConfig) { c.MaxAge = time.Hour }},
		{"max_bytes", fences, func(c *jetstream.StreamConfig) { c.MaxBytes = 1 << 20 }},
	}
	for _, tt := range tests {
		t.Run(tt.field+" of "+tt.stream, func(t *testing.T) {
			spec := specNamed(t, tt.stream, Options{})
			got := spec.Config
			tt.edit(&got)
			d := diffOf(spec, got)
			if len(d) != 1 || !strings.HasPrefix(d[0], tt.field+" is ") {
				t.Errorf("diffOf: got %q, want exactly one phrase starting %q", d, tt.field+" is ")
			}
		})
	}
}

func TestDiffReportsEveryUnsafeFieldAtOnce(t *testing.T) {
	spec := specNamed(t, "KV_"+subjects.AuthBucket("default"), Options{})
	got := spec.Config
	got.AllowDirect, got.DenyPurge, got.AllowRollup = true, false, true
	d := strings.Join(diffOf(spec, got), "; ")
	for _, field := range []string{"allow_direct", "deny_purge", "allow_rollup_hdrs"} {
		if !strings.Contains(d, field) {
			t.Errorf("diffOf: got %q, want it to name %s", d, field)
		}
	}
}

// A bucket of one replica on a lone server (DirectReads) allows direct gets (its one server
// answers them), and one made without them is no fault (Ensure turns them on). A bucket with
// them is refused anywhere else: with three replicas, or on a cluster (a moved bucket gains a
// follower), as is any record stream with them (the auditors' import carries only the API's
// message get).
func TestDirectGetsOnlyOnABucketOfOneReplicaOnALoneServer(t *testing.T) {
	lone := Options{DirectReads: true}
	for _, s := range allSpecs(lone) {
		if want := s.Bucket != ""; s.Config.AllowDirect != want {
			t.Errorf("%s of one replica on a lone server: got allow_direct %v, want %v", s.Config.Name, s.Config.AllowDirect, want)
		}
	}
	fences := "KV_" + subjects.AuthBucket("default")
	one := specNamed(t, fences, lone)
	without := one.Config
	without.AllowDirect = false
	if d := diffOf(one, without); len(d) != 0 {
		t.Errorf("diffOf of a bucket of one replica made without direct gets: got %v, want nothing (Ensure allows them)", d)
	}
	for name, o := range map[string]Options{"three replicas": {Replicas: 3, DirectReads: true}, "one replica in a cluster": {}} {
		spec := specNamed(t, fences, o)
		with := spec.Config
		with.AllowDirect = true
		if d := diffOf(spec, with); len(d) != 1 || d[0] != "allow_direct is true, want false" {
			t.Errorf("diffOf of a bucket of %s with direct gets: got %q, want allow_direct refused", name, d)
		}
	}
}

func TestDiffLetsTheFlagsTuneRecordStreamLimits(t *testing.T) {
	for _, name := range []string{subjects.WitnessStream("default", witnessOwner), subjects.MintedStream("default"), subjects.AuditStream("default")} {
		spec := specNamed(t, name, Options{})
		if !spec.Tunable {
			t.Errorf("%s: got Tunable false, want its limits set by flags", name)
		}
		got := spec.Config
		got.MaxAge, got.MaxBytes, got.MaxMsgs = spec.Config.MaxAge+time.Hour, spec.Config.MaxBytes*2, 7
		if d := diffOf(spec, got); len(d) != 0 {
			t.Errorf("diffOf(%s) with other limits: got %v, want nothing (Ensure updates them)", name, d)
		}
	}
}

func TestDiffIgnoresSubjectOrder(t *testing.T) {
	spec := specNamed(t, subjects.WitnessStream("default", witnessOwner), Options{})
	got := spec.Config
	got.Subjects = append([]string(nil), got.Subjects...)
	for i, j := 0, len(got.Subjects)-1; i < j; i, j = i+1, j-1 {
		got.Subjects[i], got.Subjects[j] = got.Subjects[j], got.Subjects[i]
	}
	if d := diffOf(spec, got); len(d) != 0 {
		t.Errorf("diffOf with reordered subjects: got %v, want nothing", d)
	}
}

// Every stream keeps the rules docs/OPERATIONS.md gives ("What it runs": the stores) in its spec,
// so Ensure creates them right: leader reads only, on three replicas.
func TestSpecsSealEveryStream(t *testing.T) {
	for _, s := range allSpecs(Options{Replicas: 3}) {
		c := s.Config
		if c.AllowDirect || c.MirrorDirect || c.AllowRollup || !c.DenyDelete || !c.DenyPurge {
			t.Errorf("%s: got allow_direct %v mirror_direct %v rollup %v deny_delete %v deny_purge %v, want false false false true true",
				c.Name, c.AllowDirect, c.MirrorDirect, c.AllowRollup, c.DenyDelete, c.DenyPurge)
		}
		if c.Replicas != 3 {
			t.Errorf("%s: got %d replicas, want 3", c.Name, c.Replicas)
		}
		if c.MaxMsgsPerSubject == 0 {
			t.Errorf("%s: got max_msgs_per_subject 0, want at least one message per subject kept", c.Name)
		}
		if c.Duplicates > 0 && c.MaxAge > 0 && c.Duplicates > c.MaxAge {
			t.Errorf("%s: got a duplicates window %s longer than max_age %s (the server refuses it)", c.Name, c.Duplicates, c.MaxAge)
		}
		switch s.Family {
		case CAS:
			if c.MaxMsgsPerSubject != 1 || c.Discard != jetstream.DiscardOld {
				t.Errorf("%s (CAS): got history %d discard %v, want 1 and old", c.Name, c.MaxMsgsPerSubject, c.Discard)
			}
		case WriteOnce:
			if c.MaxMsgsPerSubject != 1 || c.Discard != jetstream.DiscardNew || !c.DiscardNewPerSubject {
				t.Errorf("%s (write-once): got history %d discard %v per subject %v, want 1, new, true", c.Name, c.MaxMsgsPerSubject, c.Discard, c.DiscardNewPerSubject)
			}
		}
		if s.Bucket != "" && (c.Name != "KV_"+s.Bucket || len(c.Subjects) != 1 || c.Subjects[0] != "$KV."+s.Bucket+".>") {
			t.Errorf("bucket %s: got stream %s on %v, want KV_%s on $KV.%s.>", s.Bucket, c.Name, c.Subjects, s.Bucket, s.Bucket)
		}
	}
	witness := specNamed(t, subjects.WitnessStream("default", witnessOwner), Options{WitnessBytes: 3 << 20, WitnessRuns: 9})
	if c := witness.Config; !c.NoAck || c.MaxAge != WitnessMaxAge || c.MaxBytes != 3<<20 || c.MaxMsgs != 9 || c.Discard != jetstream.DiscardOld ||
		!slices.Equal(c.Subjects, subjects.OwnerRunStarts("default", witnessOwner)) {
		t.Errorf("witness: got no_ack %v max_age %s max_bytes %d max_msgs %d discard %v subjects %v, want true, %s, %d, 9, old and the owner's run-starts",
			c.NoAck, c.MaxAge, c.MaxBytes, c.MaxMsgs, c.Discard, c.Subjects, WitnessMaxAge, 3<<20)
	}
	for _, s := range Specs("default", Options{}) {
		if strings.HasPrefix(s.Config.Name, subjects.SharedWitnessStream("default")) {
			t.Errorf("Specs has %s: want no shared witness, only owners'", s.Config.Name)
		}
	}
	minted := specNamed(t, subjects.MintedStream("default"), Options{MintedBytes: 5 << 20})
	if minted.Config.Discard != jetstream.DiscardNew || minted.Config.MaxMsgsPerSubject != 1 || minted.Config.MaxBytes != 5<<20 {
		t.Errorf("minted: got discard %v history %d max_bytes %d, want new, 1, %d", minted.Config.Discard, minted.Config.MaxMsgsPerSubject, minted.Config.MaxBytes, 5<<20)
	}
}
