package store

import (
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotal-ai/authplane/subjects"
)

// Options size the stores.
type Options struct {
	// Replicas of every stream (1, or 3 on a cluster).
	Replicas int
	// WitnessBytes and WitnessRuns bound each owner's witness stream, in bytes and in
	// run-starts; past either, that owner's oldest are dropped.
	WitnessBytes int64
	WitnessRuns  int64
	// MintedBytes bounds the minted stream; when it is full, mints fail closed.
	MintedBytes int64
	// AuditBytes bounds the audit stream; the oldest records are dropped.
	AuditBytes int64
	// ReaderConsumers bounds the consumers each of the minted and audit streams holds: its
	// auditors' readers (the plane itself reads them with no consumer).
	ReaderConsumers int
	// DirectReads lets the buckets allow direct gets when they have one replica: for a server
	// of the plane's own that is no cluster (see directReads).
	DirectReads bool
	// Existed says the space's stores existed before this start (the plane's identity file
	// says it registered there): Open then refuses, naming each, a stream or bucket that is
	// gone (ErrLost), rather than create it empty. Without it, the fence bucket says so (Open).
	Existed bool
	// Recreate creates what is gone anyway: the operator starts over (`--recreate-stores`).
	Recreate bool
}

// Defaults for Options.
const (
	DefaultWitnessBytes = 16 << 20
	DefaultWitnessRuns  = 1024
	DefaultMintedBytes  = 1 << 30
	DefaultAuditBytes   = 256 << 20
	AuditMaxAge         = 30 * 24 * time.Hour
	WitnessMaxAge       = 5 * time.Minute
	// MintedMaxAge keeps a minted record twice the longest credential lifetime (24 h) after
	// the last mint of its set of keys, so an end finds every live nkey whatever --standing-ttl was.
	MintedMaxAge = 48 * time.Hour
	// DefaultReaderConsumers bounds the consumers of the minted and audit streams, each.
	DefaultReaderConsumers = 32
	// ReaderInactiveMax is the longest a consumer of the minted and audit streams outlives its
	// last use: the stream's consumer_limits, its default and its ceiling (the stock CLI's
	// `stream view` asks for exactly this).
	ReaderInactiveMax = time.Hour
)

// Family names the rule a stream is made for.
type Family int

// The families docs/OPERATIONS.md lists ("What it runs": the stores).
const (
	// CAS: a bucket whose rows change only by compare-and-set; history 1.
	CAS Family = iota
	// WriteOnce: a bucket where each key is written once: one message per subject, and a
	// second write is refused by the server (discard new per subject).
	WriteOnce
	// Log: a plain stream of records.
	Log
)

// Spec is one stream with the configuration its rule needs.
type Spec struct {
	// Bucket is the KV bucket name, or "" for a plain stream.
	Bucket string
	Family Family
	// Rule says in a few words why the configuration is what it is, for refusals.
	Rule   string
	Config jetstream.StreamConfig
	// Tunable says a start may change the stream's size and age limits in place (they follow
	// flags), and its consumer limits; every other field must match.
	Tunable bool
	// Readers says auditors read the stream through consumers of their own: a start removes
	// every consumer of it that breaks its consumer limits (a push consumer, one that never
	// goes inactive), which a release before the limits let anyone with the read API make.
	Readers bool
}

// withDefaults fills what o leaves zero.
func (o Options) withDefaults() Options {
	if o.Replicas < 1 {
		o.Replicas = 1
	}
	if o.WitnessBytes == 0 {
		o.WitnessBytes = DefaultWitnessBytes
	}
	if o.WitnessRuns == 0 {
		o.WitnessRuns = DefaultWitnessRuns
	}
	if o.MintedBytes == 0 {
		o.MintedBytes = DefaultMintedBytes
	}
	if o.AuditBytes == 0 {
		o.AuditBytes = DefaultAuditBytes
	}
	if o.ReaderConsumers == 0 {
		o.ReaderConsumers = DefaultReaderConsumers
	}
	return o
}

// Specs returns every stream of a space but the owners' witness streams (WitnessSpec), which
// are made as owners come.
func Specs(space string, o Options) []Spec {
	o = o.withDefaults()
	bucket := func(name string, f Family, rule string) Spec {
		c := jetstream.StreamConfig{
			Name:              "KV_" + name,
			Subjects:          []string{"$KV." + name + ".>"},
			Retention:         jetstream.LimitsPolicy,
			Storage:           jetstream.FileStorage,
			Replicas:          o.Replicas,
			MaxMsgsPerSubject: 1,
			MaxMsgs:           -1,
			MaxBytes:          -1,
			MaxMsgSize:        -1,
			Discard:           jetstream.DiscardOld,
			Duplicates:        2 * time.Minute,
		}
		if f == WriteOnce {
			c.Discard = jetstream.DiscardNew
			c.DiscardNewPerSubject = true
		}
		c = seal(c)
		c.AllowDirect = directReads(o, c.Replicas)
		return Spec{Bucket: name, Family: f, Rule: rule, Config: c}
	}
	stream := func(c jetstream.StreamConfig, rule string) Spec { return logSpec(c, rule, o) }
	// read bounds a record stream's readers: at most ReaderConsumers consumers, each gone an
	// hour after its last use at most.
	read := func(s Spec) Spec {
		s.Config.MaxConsumers = o.ReaderConsumers
		s.Config.ConsumerLimits = jetstream.StreamConsumerLimits{InactiveThreshold: ReaderInactiveMax}
		s.Readers = true
		return s
	}
	return []Spec{
		bucket(subjects.AuthBucket(space), CAS, "fences: leader reads, every change by CAS, never deleted"),
		bucket(subjects.ActorsBucket(space), CAS, "ledger: leader reads, CAS"),
		bucket(subjects.IssuedBucket(space), CAS, "issued evidence: CAS, history 1"),
		bucket(subjects.AcceptedBucket(space), WriteOnce, "write-once per key"),
		bucket(subjects.AdmissionBucket(space), WriteOnce, "create-only"),
		bucket(subjects.RecordsBucket(space), CAS, "run records: leader reads, CAS"),
		bucket(subjects.PlatformBucket(space), CAS, "assignments: leader reads, CAS"),
		bucket(subjects.KeysBucket(space), CAS, "bearer keys: CAS"),
		bucket(subjects.SecretsBucket(space), WriteOnce, "create-only"),
		read(stream(jetstream.StreamConfig{
			Name:              subjects.MintedStream(space),
			Subjects:          []string{subjects.MintedStreamSubjects(space)},
			MaxMsgsPerSubject: 1,
			MaxAge:            MintedMaxAge,
			MaxBytes:          o.MintedBytes,
			Discard:           jetstream.DiscardNew,
		}, "minted: one record per set of keys, kept past every credential's life, full means mints fail closed")),
		read(stream(jetstream.StreamConfig{
			Name:     subjects.AuditStream(space),
			Subjects: []string{subjects.AuditStreamSubjects(space)},
			MaxAge:   AuditMaxAge,
			MaxBytes: o.AuditBytes,
			Discard:  jetstream.DiscardOld,
		}, "audit: 30 days, bounded (--audit-bytes), oldest dropped")),
	}
}

// logSpec is the spec of a plain stream of records: limits retention, file storage, no
// message size bound, at most a two-minute duplicate window; its limits follow the flags.
func logSpec(c jetstream.StreamConfig, rule string, o Options) Spec {
	c.Retention = jetstream.LimitsPolicy
	c.Storage = jetstream.FileStorage
	c.Replicas = o.Replicas
	if c.MaxMsgs == 0 {
		c.MaxMsgs = -1
	}
	c.MaxMsgSize = -1
	c.Duplicates = min(2*time.Minute, c.MaxAge) // the server refuses a window longer than the age
	return Spec{Family: Log, Rule: rule, Config: seal(c), Tunable: true}
}

// WitnessSpec is owner's witness stream (docs/PROTOCOL.md, "manager-run-admission"): it captures, without acks, the
// run-starts owner's callers publish and nobody else's, for five minutes, at most
// o.WitnessRuns of them in o.WitnessBytes, its oldest dropped first. Each owner has its own, so
// no owner's run-starts can evict another's: JetStream bounds a stream, not a publisher within
// one, and a run-start subject ends in a nonce, so no per-subject limit would.
func WitnessSpec(space, owner string, o Options) Spec {
	o = o.withDefaults()
	return logSpec(jetstream.StreamConfig{
		Name:     subjects.WitnessStream(space, owner),
		Subjects: subjects.OwnerRunStarts(space, owner),
		NoAck:    true,
		MaxAge:   WitnessMaxAge,
		MaxBytes: o.WitnessBytes,
		MaxMsgs:  o.WitnessRuns,
		Discard:  jetstream.DiscardOld,
	}, "an owner's witness: no acks (callers publish here), 5 minutes, bounded per owner (--witness-runs, --witness-bytes), oldest dropped", o)
}

// directReads says whether a bucket of so many replicas allows direct gets: only with one, on
// a server that is no cluster (o.DirectReads: the plane's embedded one). A direct get is
// answered by any replica that holds the stream, a follower too, which may not yet have the
// write the leader acknowledged. A stream of one replica on a lone server has only the server
// that acknowledged it; in a cluster, even a stream of one replica gains a follower for a while
// when it is moved (a placement change, a peer removed). A bucket is read for a fence before
// every mint, and a direct get costs about a third of what the JetStream API's message get
// does (no JSON request, no client information decoded by every server, no base64 answer).
func directReads(o Options, replicas int) bool { return o.DirectReads && replicas == 1 }

// seal applies what every stream of the plane has: leader reads, no rollups, no deletes, no
// purges. (A bucket of one replica on a lone server then allows direct gets: directReads.)
func seal(c jetstream.StreamConfig) jetstream.StreamConfig {
	c.AllowDirect = false
	c.MirrorDirect = false
	c.AllowRollup = false
	c.DenyDelete = true
	c.DenyPurge = true
	if c.MaxMsgsPerSubject == 0 {
		c.MaxMsgsPerSubject = -1
	}
	return c
}
