package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// TestAMintWithoutAKVLeaderIsUnavailableAndMintsNothing: two of three servers stop, so no
// stream of the plane can commit a write (R3 needs two): a renewal is refused `unavailable`
// within the request's deadline, with no credential. Once the servers are back, no fence has
// moved, the only records are the refused request's own, and the plane serves again.
func TestAMintWithoutAKVLeaderIsUnavailableAndMintsNothing(t *testing.T) {
	harness.Long(t, "a three-node cluster")
	t.Parallel()
	const deadline = 2 * time.Second
	c := startCluster(t, harness.TestSpace, 3)
	// The plane and its callers are on server 0, which stays up.
	p := harness.StartPlane(t, func(cfg *service.Config) {
		againstCluster(c)(cfg)
		cfg.NATSURL = c.URL(0)
		cfg.RequestTimeout = deadline
	})
	r := harness.NewRegisteredManager(t, p)

	before := harness.StoreSeqs(t, p)
	auth := subjects.AuthBucket(harness.TestSpace)
	rows := lastOfEach(t, p, "KV_"+auth)
	refused := r.Renewal(t, "renew")

	c.stop(t, 1)
	c.stop(t, 2)
	sent := time.Now()
	o := harness.AskWithin(3*deadline, r.Cli, harness.OwnerA, "cli", subjects.EndpointManagerAuthority, refused)
	took := time.Since(sent)
	if o.Code != "unavailable" || o.Numeric != 503 || len(o.Material.Credentials) != 0 {
		t.Errorf("a renewal with no KV leader: got %q (%d) %q with %d credentials, want unavailable and none", o.Code, o.Numeric, o.Message, len(o.Material.Credentials))
	}
	if took > deadline+time.Second {
		t.Errorf("the refusal took %s, want it within the request's deadline (%s)", took.Round(time.Millisecond), deadline)
	}
	t.Logf("no KV leader: %s %q after %s", o.Code, o.Message, took.Round(time.Millisecond))

	c.start(t, 1)
	c.start(t, 2)
	c.waitFormed(t)
	c.waitCurrent(t, 30*time.Second)
	// No fence moved. What the refused mint sent may land once a quorum is back (a stream
	// leader that had not yet noticed it was alone took it, and could not commit it): its
	// `minted` record, which a refusal may leave (docs/PROTOCOL.md, "Conventions"), for
	// credentials never sent; and, when a standing record spared the renewal its write, its
	// commit, which rewrites its gate with the very bytes the gate held.
	minted := subjects.MintedStream(harness.TestSpace)
	harness.WantUnwritten(t, p, "a renewal with no KV leader", before.Except(minted, auth))
	if moved := rewritesSince(t, p, auth, before[auth], rows); moved != "" {
		t.Errorf("a renewal with no KV leader: %s; a refusal changes no fence", moved)
	}
	for _, rec := range mintedSince(t, p, before[minted]) {
		if rec.RequestID != refused["requestId"] {
			t.Errorf("a minted record of request %s appeared, want none but the refused request's own", rec.RequestID)
		}
	}
	testkit.CheckFor(t, 20*time.Second, 100*time.Millisecond, func() error {
		o := harness.AskWithin(3*deadline, r.Cli, harness.OwnerA, "cli", subjects.EndpointManagerAuthority, r.Renewal(t, "renew"))
		if o.Code != "" || len(o.Material.Credentials) != 2 {
			return fmt.Errorf("a renewal once the servers are back: got %q %q, want two credentials", o.Code, o.Message)
		}
		return nil
	})
}

// openStream opens stream for a check of at most 10 s.
func openStream(t testing.TB, p *harness.TestPlane, stream string) (jetstream.Stream, context.Context, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	st, err := p.JS(t).Stream(ctx, stream)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	return st, ctx, cancel
}

// lastOfEach reads the last message of every subject of stream.
func lastOfEach(t testing.TB, p *harness.TestPlane, stream string) map[string][]byte {
	t.Helper()
	st, ctx, cancel := openStream(t, p, stream)
	defer cancel()
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(">"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for subject := range info.State.Subjects {
		m, err := st.GetLastMsgForSubject(ctx, subject)
		if err != nil {
			t.Fatalf("last message on %s: %v", subject, err)
		}
		out[subject] = m.Data
	}
	return out
}

// rewritesSince names the first message of bucket's stream after sequence seq that is not a rewrite
// of a row with the bytes it held in rows (nor a budget or signers row, which
// harness.WantUnwritten lets a refusal write), or "" when there is none.
func rewritesSince(t testing.TB, p *harness.TestPlane, bucket string, seq uint64, rows map[string][]byte) string {
	t.Helper()
	stream := "KV_" + bucket
	st, ctx, cancel := openStream(t, p, stream)
	defer cancel()
	for last := harness.LastSeq(t, p, bucket); seq < last; {
		seq++
		m, err := st.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatalf("%s message %d: %v", stream, seq, err)
		}
		if strings.HasPrefix(m.Subject, "$KV."+bucket+".budget.") || strings.HasPrefix(m.Subject, "$KV."+bucket+".signers.") {
			continue // what harness.WantUnwritten lets a refusal spend
		}
		if old, ok := rows[m.Subject]; !ok || !bytes.Equal(old, m.Data) {
			return fmt.Sprintf("%s message %d on %s changed its row", stream, seq, m.Subject)
		}
	}
	return ""
}

// mintedSince reads every `minted` record after sequence seq.
func mintedSince(t testing.TB, p *harness.TestPlane, seq uint64) []harness.MintedRecord {
	t.Helper()
	st, ctx, cancel := openStream(t, p, subjects.MintedStream(harness.TestSpace))
	defer cancel()
	var out []harness.MintedRecord
	for last := harness.LastSeq(t, p, subjects.MintedStream(harness.TestSpace)); seq < last; {
		seq++
		m, err := st.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // replaced by a later record of its set of keys
		}
		if err != nil {
			t.Fatalf("minted record %d: %v", seq, err)
		}
		var rec harness.MintedRecord
		if err := json.Unmarshal(m.Data, &rec); err != nil {
			t.Fatalf("minted record %d: %v", seq, err)
		}
		out = append(out, rec)
	}
	return out
}

// TestAFullMintedStreamRefusesTheMintAndReturnsNothing: the `minted` stream filled to its
// size bound (--minted-bytes, discard new) takes no record, so every mint fails closed: a
// renewal (whose records would replace its nkeys' own) and a first registration (new nkeys) are
// each refused `resource-exhausted` with no credential, no fence moves, the stream takes
// nothing, and the mint is recorded `discarded`.
func TestAFullMintedStreamRefusesTheMintAndReturnsNothing(t *testing.T) {
	t.Parallel()
	p := harness.StartPlane(t, func(c *service.Config) { c.MintedBytes = 1 << 20 })
	r := harness.NewRegisteredManager(t, p)
	fillMinted(t, p)

	fresh := harness.NewManagerKeys(t)
	for _, tt := range []struct {
		name  string
		body  map[string]any
		creds int
	}{
		{"a renewal", r.Renewal(t, "renewStandingBundle"), 5},
		{"a first registration", fresh.Body(t, "prepare", "cli"), 2},
	} {
		before := harness.StoreSeqs(t, p)
		o := harness.Ask(t, r.Cli, harness.OwnerA, "cli", subjects.EndpointManagerAuthority, tt.body)
		if o.Code != "resource-exhausted" || o.Numeric != 429 || len(o.Material.Credentials) != 0 {
			t.Errorf("%s with the minted stream full: got %q (%d) %q with %d credentials, want resource-exhausted and none",
				tt.name, o.Code, o.Numeric, o.Message, len(o.Material.Credentials))
		}
		harness.WantUnwritten(t, p, tt.name+" with the minted stream full", before)
		if d := harness.LastDecision(t, p, "discarded", harness.OwnerA, "cli"); d.RequestID != tt.body["requestId"] || d.Code != "resource-exhausted" || len(d.Credentials) != tt.creds {
			t.Errorf("%s: got discarded record %+v, want request %s discarded resource-exhausted with its %d credentials", tt.name, d, tt.body["requestId"], tt.creds)
		}
	}
	if _, err := harness.FenceEntry(t, p, subjects.GateKey(subjects.GateEndpointManager, fresh.Iid)); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("the refused registration's gate: got %v, want none", err)
	}
}

// fillMinted fills p's `minted` stream to its size bound with records of no instance, as a
// writer with the plane's rights could, in smaller pieces until not even one byte more fits.
func fillMinted(t testing.TB, p *harness.TestPlane) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n := 0
	for size := 64 << 10; size > 0; size /= 2 {
		for {
			n++
			_, err := p.JS(t).Publish(ctx, subjects.MintedSubject(harness.TestSpace, "filler", []string{fmt.Sprint(n)}), make([]byte, size))
			var apiErr *jetstream.APIError
			if errors.As(err, &apiErr) && strings.Contains(apiErr.Description, "maximum bytes") {
				break
			}
			if err != nil {
				t.Fatalf("fill the minted stream: %v", err)
			}
			if n > 10000 {
				t.Fatal("the minted stream took 10,000 fillers; want it bounded at 1 MiB")
			}
		}
	}
}
