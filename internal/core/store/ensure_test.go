package store

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// racingJS is a JetStream where another start creates the stream at the moment this one does:
// its create fails as the server answers a creation it lost the race to, and the stream exists
// afterwards (or, with exists false, not yet).
type racingJS struct {
	jetstream.JetStream
	spec    Spec
	exists  bool
	reads   int
	creates int
	refusal *jetstream.APIError // what a create answers; nil: a lost race's
}

func (r *racingJS) Stream(context.Context, string) (jetstream.Stream, error) {
	r.reads++
	if r.reads == 1 || !r.exists {
		return nil, jetstream.ErrStreamNotFound
	}
	return existing{info: &jetstream.StreamInfo{Config: r.spec.Config}}, nil
}

func (r *racingJS) CreateStream(context.Context, jetstream.StreamConfig) (jetstream.Stream, error) {
	r.creates++
	if r.refusal != nil {
		return nil, r.refusal
	}
	return nil, &jetstream.APIError{Code: 500, ErrorCode: codeCreateStoreFailed, Description: "error creating store for stream"}
}

// existing is a stream as read: its info.
type existing struct {
	jetstream.Stream
	info *jetstream.StreamInfo
}

func (e existing) CachedInfo() *jetstream.StreamInfo { return e.info }

func TestEnsureChecksAStreamAnotherStartCreatedFirst(t *testing.T) {
	spec := specNamed(t, "KV_cotal_auth_default", Options{})
	log := slog.New(slog.DiscardHandler)

	js := &racingJS{spec: spec, exists: true}
	if err := ensureOne(context.Background(), js, spec, log); err != nil {
		t.Fatalf("a creation lost to another start: got %v, want the stream it made checked and accepted", err)
	}

	js = &racingJS{spec: spec}
	err := ensureOne(context.Background(), js, spec, log)
	if err == nil || !transient(err) {
		t.Fatalf("a creation that failed with no stream to show for it: got %v, want an error to retry", err)
	}
	if !errors.Is(err, errCreateRaced) || js.creates != 1 {
		t.Errorf("got %v after %d creates, want one create, marked raced", err, js.creates)
	}
}

// A cluster that has just formed refuses a creation with "no suitable peers for placement, peer
// offline" until its meta leader has heard from every server: that is retried. The same code
// for any other reason is the cluster's answer, and so is not.
func TestEnsureRetriesACreationWhileAPeerIsNotYetOnline(t *testing.T) {
	spec := specNamed(t, "KV_cotal_auth_default", Options{Replicas: 3})
	log := slog.New(slog.DiscardHandler)
	for _, tt := range []struct {
		description string
		transient   bool
	}{
		{"no suitable peers for placement, peer offline", true},
		{"no suitable peers for placement, peer offline, insufficient storage", false},
		{"no suitable peers for placement, insufficient storage", false},
		{"no suitable peers for placement", false},
	} {
		js := &racingJS{spec: spec, refusal: &jetstream.APIError{Code: 400, ErrorCode: codeNoPeers, Description: tt.description}}
		err := ensureOne(context.Background(), js, spec, log)
		if err == nil || transient(err) != tt.transient {
			t.Errorf("a creation refused %q: got %v (transient %v), want transient %v", tt.description, err, transient(err), tt.transient)
		}
	}
}

// storesJS is a JetStream holding the streams named in it, each with its configuration.
type storesJS struct {
	jetstream.JetStream
	streams map[string]jetstream.StreamConfig
}

func (s storesJS) Stream(_ context.Context, name string) (jetstream.Stream, error) {
	c, ok := s.streams[name]
	if !ok {
		return nil, jetstream.ErrStreamNotFound
	}
	return existing{info: &jetstream.StreamInfo{Config: c}}, nil
}

// A stream that is gone is refused (ErrLost, naming each) once the stores existed: the caller
// says so, or the fence bucket, which a first start makes last, is there. Before that a gone
// stream is a first start's to make, half-way or not. A misconfigured stream is refused beside.
func TestAStreamGoneFromStoresThatExistedIsRefusedNamingIt(t *testing.T) {
	specs := Specs("default", Options{})
	marker, ledger, minted := "KV_cotal_auth_default", "KV_cotal_actors_default", "cotal_minted_default"
	every := map[string]jetstream.StreamConfig{}
	for _, s := range specs {
		every[s.Config.Name] = s.Config
	}
	without := func(names ...string) map[string]jetstream.StreamConfig {
		m := map[string]jetstream.StreamConfig{}
		for k, v := range every {
			m[k] = v
		}
		for _, n := range names {
			delete(m, n)
		}
		return m
	}
	misconfigured := without(ledger)
	c := misconfigured[marker]
	c.DenyPurge = false
	misconfigured[marker] = c
	tests := []struct {
		name          string
		streams       map[string]jetstream.StreamConfig
		existed       bool
		gone          []string
		misconfigured bool
	}{
		{"a first start: nothing there", nil, false, nil, false},
		{"a first start cut short: all but the fence bucket", without(marker), false, nil, false},
		{"every stream there", every, true, nil, false},
		{"the identity says they existed, and all are gone", nil, true, []string{marker, ledger, minted}, false},
		{"the fence bucket says they existed", without(ledger, minted), false, []string{ledger, minted}, false},
		{"the fence bucket misconfigured, the ledger gone", misconfigured, false, []string{ledger}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := refuseLost(context.Background(), storesJS{streams: tt.streams}, specs, marker, tt.existed, slog.New(slog.DiscardHandler))
			if errors.Is(err, ErrLost) != (len(tt.gone) > 0) || errors.Is(err, ErrMisconfigured) != tt.misconfigured {
				t.Fatalf("got %v, want lost %v, misconfigured %v", err, tt.gone, tt.misconfigured)
			}
			for _, name := range tt.gone {
				if !strings.Contains(err.Error(), name+",") && !strings.Contains(err.Error(), name+" gone") {
					t.Errorf("got %q, want it to name %s", err, name)
				}
			}
		})
	}
}
