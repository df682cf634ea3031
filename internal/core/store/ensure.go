package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrMisconfigured means a stream exists with a configuration its rule forbids; the plane
// refuses to serve on it.
var ErrMisconfigured = errors.New("stream misconfigured")

// Ensure creates every stream of specs that does not exist and checks every one that does.
// A stream whose configuration breaks its rule is reported, all of them at once, wrapping
// ErrMisconfigured; the size and age limits of record streams follow the flags and are
// updated in place (and so are their message counts: an owner's witness bounds them). On a
// fresh cluster it retries until a meta leader answers or ctx ends.
func Ensure(ctx context.Context, js jetstream.JetStream, specs []Spec, log *slog.Logger) error {
	var problems []error
	for _, spec := range specs {
		err := retry(ctx, log, func(ctx context.Context) error { return ensureOne(ctx, js, spec, log) })
		if err != nil {
			problems = append(problems, err)
		}
	}
	return errors.Join(problems...)
}

func ensureOne(ctx context.Context, js jetstream.JetStream, spec Spec, log *slog.Logger) error {
	name := spec.Config.Name
	s, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		_, cerr := js.CreateStream(ctx, spec.Config)
		if cerr == nil {
			log.Debug("created stream", "stream", name)
			return nil
		}
		// Another start may be creating it at this moment (replicas started at once): what
		// exists now is checked like any stream that existed; a server that failed to create
		// its store mid-race is asked again.
		if s, err = js.Stream(ctx, name); err != nil {
			var apiErr *jetstream.APIError
			switch {
			case errors.As(cerr, &apiErr) && apiErr.ErrorCode == codeCreateStoreFailed:
				cerr = fmt.Errorf("%w: %w", errCreateRaced, cerr)
			case errors.As(cerr, &apiErr) && apiErr.ErrorCode == codeNoPeers && apiErr.Description == peersOffline:
				cerr = fmt.Errorf("%w: %w", errPeersOffline, cerr)
			}
			return fmt.Errorf("create stream %s: %w", name, cerr)
		}
	}
	if err != nil {
		return fmt.Errorf("read stream %s: %w", name, err)
	}
	got := s.CachedInfo().Config
	if err := refuse(spec, got); err != nil {
		return err
	}
	if spec.Readers {
		if err := sweepReaders(ctx, s, spec.Config.ConsumerLimits.InactiveThreshold, log); err != nil {
			return err
		}
	}
	return tune(ctx, js, spec, got, log)
}

// ErrLost means the stores of a space that existed lost what the plane wrote there: a stream
// or bucket is gone, or the plane's own gate is (instance.Register). The plane refuses to serve
// on them and re-creates nothing.
var ErrLost = errors.New("the space's stores lost state")

// refuseLost reads every stream of specs: when some are gone although the space's stores
// existed (existed, or the stream marker, which a first start creates last, is there), it is
// ErrLost naming each; every stream that exists with a configuration its rule forbids is
// ErrMisconfigured.
func refuseLost(ctx context.Context, js jetstream.JetStream, specs []Spec, marker string, existed bool, log *slog.Logger) error {
	var gone []string
	var problems []error
	why := "the plane's identity file says it registered there"
	for _, spec := range specs {
		name := spec.Config.Name
		var got jetstream.StreamConfig
		err := retry(ctx, log, func(ctx context.Context) error {
			s, err := js.Stream(ctx, name)
			if err == nil {
				got = s.CachedInfo().Config
			}
			return err
		})
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			gone = append(gone, name)
		case err != nil:
			return fmt.Errorf("read stream %s: %w", name, err)
		default:
			if name == marker && !existed {
				existed, why = true, name+", which a first start creates last, exists"
			}
			if err := refuse(spec, got); err != nil {
				problems = append(problems, err)
			}
		}
	}
	if len(gone) > 0 && existed {
		problems = append(problems, fmt.Errorf("%w: %s gone, although %s; every fence, grant, claim and record they held is lost, "+
			"and the plane re-creates none of them empty: restore them, or start over with --recreate-stores", ErrLost, strings.Join(gone, ", "), why))
	}
	return errors.Join(problems...)
}

// check refuses a stream whose configuration got breaks spec's rule, and gives a tunable one
// spec's limits: for a stream without readers (an owner's witness), read from a listing.
func check(ctx context.Context, js jetstream.JetStream, spec Spec, got jetstream.StreamConfig, log *slog.Logger) error {
	if err := refuse(spec, got); err != nil {
		return err
	}
	return tune(ctx, js, spec, got, log)
}

// refuse is ErrMisconfigured, naming every field, when got breaks spec's rule.
func refuse(spec Spec, got jetstream.StreamConfig) error {
	if diffs := diffOf(spec, got); len(diffs) > 0 {
		return &permanentError{fmt.Errorf("%w: %s (%s): %s", ErrMisconfigured, spec.Config.Name, spec.Rule, joinDiffs(diffs))}
	}
	return nil
}

// tune updates in place what of got may follow spec: a tunable stream's age, bytes and message
// count and its consumer limits, and direct gets on a bucket of one replica that a release
// before them made without (refuse has turned away direct gets anywhere else).
func tune(ctx context.Context, js jetstream.JetStream, spec Spec, got jetstream.StreamConfig, log *slog.Logger) error {
	want := spec.Config
	if spec.Tunable && (got.MaxAge != want.MaxAge || got.MaxBytes != want.MaxBytes || got.MaxMsgs != want.MaxMsgs ||
		got.MaxConsumers != want.MaxConsumers || got.ConsumerLimits != want.ConsumerLimits) {
		got.MaxAge, got.MaxBytes, got.MaxMsgs = want.MaxAge, want.MaxBytes, want.MaxMsgs
		got.MaxConsumers, got.ConsumerLimits = want.MaxConsumers, want.ConsumerLimits
		if _, err := js.UpdateStream(ctx, got); err != nil {
			return fmt.Errorf("update limits of stream %s: %w", want.Name, err)
		}
		log.Info("updated stream limits", "stream", want.Name, "max_age", got.MaxAge, "max_bytes", got.MaxBytes, "max_msgs", got.MaxMsgs,
			"max_consumers", got.MaxConsumers, "consumer_inactive_threshold", got.ConsumerLimits.InactiveThreshold)
	}
	if want.AllowDirect && !got.AllowDirect {
		got.AllowDirect = true
		if _, err := js.UpdateStream(ctx, got); err != nil {
			return fmt.Errorf("allow direct gets on stream %s: %w", want.Name, err)
		}
		log.Info("allowed direct gets on a bucket of one replica", "stream", want.Name)
	}
	return nil
}

// sweepReaders deletes every consumer of s that its readers' limits forbid: a push consumer
// (it delivers wherever its creator said, in the plane account), or one that never goes
// inactive or outlives inactive. A release before the limits let the read API make them; the
// limits, once set, keep such a consumer but make no new one. A consumer deleted meanwhile is
// no error.
func sweepReaders(ctx context.Context, s jetstream.Stream, inactive time.Duration, log *slog.Logger) error {
	l := s.ListConsumers(ctx)
	var bad []string
	for ci := range l.Info() {
		c := ci.Config
		if c.DeliverSubject != "" || c.InactiveThreshold <= 0 || c.InactiveThreshold > inactive {
			bad = append(bad, ci.Name)
		}
	}
	if err := l.Err(); err != nil {
		return fmt.Errorf("list consumers of stream %s: %w", s.CachedInfo().Config.Name, err)
	}
	for _, name := range bad {
		if err := s.DeleteConsumer(ctx, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return fmt.Errorf("delete consumer %s of stream %s: %w", name, s.CachedInfo().Config.Name, err)
		}
	}
	if len(bad) > 0 {
		log.Warn("deleted consumers that break the stream's reader limits (push, or never inactive)",
			"stream", s.CachedInfo().Config.Name, "consumers", len(bad))
	}
	return nil
}

// diffOf lists how got breaks spec's rule, one phrase per field.
func diffOf(spec Spec, got jetstream.StreamConfig) []string {
	want := spec.Config
	var d []string
	check := func(field string, bad bool, gotV, wantV any) {
		if bad {
			d = append(d, fmt.Sprintf("%s is %v, want %v", field, gotV, wantV))
		}
	}
	gs, ws := slices.Clone(got.Subjects), slices.Clone(want.Subjects)
	slices.Sort(gs)
	slices.Sort(ws)
	check("subjects", !slices.Equal(gs, ws), got.Subjects, want.Subjects)
	check("retention", got.Retention != want.Retention, got.Retention, want.Retention)
	check("storage", got.Storage != want.Storage, got.Storage, want.Storage)
	check("replicas", got.Replicas != want.Replicas, got.Replicas, want.Replicas)
	check("max_msgs_per_subject", got.MaxMsgsPerSubject != want.MaxMsgsPerSubject, got.MaxMsgsPerSubject, want.MaxMsgsPerSubject)
	check("discard", got.Discard != want.Discard, got.Discard, want.Discard)
	check("discard_new_per_subject", got.DiscardNewPerSubject != want.DiscardNewPerSubject, got.DiscardNewPerSubject, want.DiscardNewPerSubject)
	check("allow_direct", got.AllowDirect && !want.AllowDirect, true, false) // false where want is true is tuned
	check("mirror_direct", got.MirrorDirect, true, false)
	check("allow_rollup_hdrs", got.AllowRollup, true, false)
	check("deny_delete", !got.DenyDelete, false, true)
	check("deny_purge", !got.DenyPurge, false, true)
	check("no_ack", got.NoAck != want.NoAck, got.NoAck, want.NoAck)
	check("sealed", got.Sealed, true, false)
	check("mirror", got.Mirror != nil, "set", "none")
	check("sources", len(got.Sources) > 0, "set", "none")
	check("subject_transform", got.SubjectTransform != nil, "set", "none")
	check("republish", got.RePublish != nil, "set", "none")
	check("allow_msg_ttl", got.AllowMsgTTL, true, false)
	check("subject_delete_marker_ttl", got.SubjectDeleteMarkerTTL != 0, got.SubjectDeleteMarkerTTL, 0)
	check("allow_msg_counter", got.AllowMsgCounter, true, false)
	check("allow_atomic", got.AllowAtomicPublish, true, false)
	check("allow_batched", got.AllowBatchPublish, true, false)
	check("allow_msg_schedules", got.AllowMsgSchedules, true, false)
	check("persist_mode", got.PersistMode != want.PersistMode, got.PersistMode, want.PersistMode)
	if !spec.Tunable {
		check("max_msgs", got.MaxMsgs != want.MaxMsgs, got.MaxMsgs, want.MaxMsgs)
		check("max_age", got.MaxAge != want.MaxAge, got.MaxAge, want.MaxAge)
		check("max_bytes", got.MaxBytes != want.MaxBytes, got.MaxBytes, want.MaxBytes)
	}
	return d
}

func joinDiffs(d []string) string {
	out := d[0]
	for _, s := range d[1:] {
		out += "; " + s
	}
	return out
}

// codeCreateStoreFailed is JetStream's "error creating store for stream", which two creations of
// one stream at the same moment can give.
const codeCreateStoreFailed = 10049

// errCreateRaced marks a creation that may have lost a race with another: retried.
var errCreateRaced = errors.New("stream creation raced")

// codeNoPeers is JetStream's "no suitable peers for placement", with the reasons after it. When
// the only one is "peer offline" (peersOffline), it is what a cluster that has just formed
// answers until its meta leader has heard from every server (routes up and a leader elected are
// not enough): a creation that gets it is retried (errPeersOffline). Any other reason, alone or
// beside it (too little storage, tags, a cluster too small for the replicas), is the cluster's
// answer.
const (
	codeNoPeers  = 10005
	peersOffline = "no suitable peers for placement, peer offline"
)

// errPeersOffline marks a creation that found a replica's server not yet known online: retried.
var errPeersOffline = errors.New("a server of the cluster is not known online yet")

// permanentError stops retry: retrying cannot fix it.
type permanentError struct{ error }

func (p *permanentError) Unwrap() error { return p.error }

// retry runs fn with a short per-attempt timeout until it succeeds, fails permanently, or ctx
// ends. A fresh cluster needs seconds to elect a meta leader; one long call can hang.
func retry(ctx context.Context, log *slog.Logger, fn func(context.Context) error) error {
	var err error
	for attempt := 0; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err = fn(actx)
		cancel()
		var perm *permanentError
		if err == nil || errors.As(err, &perm) || !transient(err) {
			return err
		}
		if attempt == 0 {
			log.Info("JetStream is not ready yet (a new cluster elects its leader first); retrying", "err", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (gave up: %w)", err, ctx.Err())
		case <-time.After(backoff(attempt)):
		}
	}
}

// transient reports whether err may succeed when retried: timeouts, no responders, a
// JetStream that is not ready yet, a leader change.
func transient(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, errCreateRaced) || errors.Is(err, errPeersOffline) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, nats.ErrConnectionReconnecting) {
		return true
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		if apiErr.ErrorCode == codeStoreFailed { // full, or a write-once key: retrying won't help
			return false
		}
		return apiErr.Code == 503 || apiErr.ErrorCode == 10008 || apiErr.ErrorCode == 10163
	}
	return false
}
