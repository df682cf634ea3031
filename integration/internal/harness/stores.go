package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/internal/platform/space"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/subjects"
)

// What a test reads of the plane's stores it reads as an auditor would: as a short-lived user
// of the plane account, from the streams themselves (every read a leader read).

// PlaneConn connects to url as a short-lived plane-account user (where the plane's buckets and
// streams live) and returns the connection and its JetStream context; it closes when the test
// ends.
func PlaneConn(t testing.TB, m *space.Keys, url string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := admin.ConnectPlaneAccount(m, url, "test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// JS is a JetStream context on p's stores, opened on first use.
func (p *TestPlane) JS(t testing.TB) jetstream.JetStream {
	t.Helper()
	p.jsOnce.Do(func() { _, p.js = PlaneConn(p.t, p.Keys(), p.NATSURL()) })
	if p.js == nil {
		t.Fatal("no JetStream context on the plane's stores")
	}
	return p.js
}

// streamOf names the stream that holds name: a bucket's KV_ stream, or the stream itself.
func streamOf(name string) string {
	if strings.HasPrefix(name, "cotal_witness_") || strings.HasPrefix(name, "cotal_minted_") || strings.HasPrefix(name, "cotal_audit_") {
		return name
	}
	return "KV_" + name
}

// LastMsg returns the newest message on subject of the stream that holds name (a bucket or a
// record stream), read from its leader; jetstream.ErrMsgNotFound if there is none.
func LastMsg(t testing.TB, p *TestPlane, name, subject string) (*jetstream.RawStreamMsg, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Stretched(5*time.Second))
	defer cancel()
	st, err := p.JS(t).Stream(ctx, streamOf(name))
	if err != nil {
		t.Fatalf("stream %s: %v", streamOf(name), err)
	}
	return st.GetLastMsgForSubject(ctx, subject)
}

// FenceEntry returns the newest message of key in the fence bucket (a delete marker too).
func FenceEntry(t testing.TB, p *TestPlane, key string) (*jetstream.RawStreamMsg, error) {
	t.Helper()
	bucket := subjects.AuthBucket(TestSpace)
	return LastMsg(t, p, bucket, "$KV."+bucket+"."+key)
}

// ReadRecord decodes the newest message on subject of stream into v.
func ReadRecord(t testing.TB, p *TestPlane, stream, subject string, v any) {
	t.Helper()
	m, err := LastMsg(t, p, stream, subject)
	if err != nil {
		t.Fatalf("read %s from %s: %v", subject, stream, err)
	}
	if err := json.Unmarshal(m.Data, v); err != nil {
		t.Fatalf("decode %s: %v", subject, err)
	}
}

// LastSeq is the last sequence of a stream (KV_<bucket> for a bucket name).
func LastSeq(t testing.TB, p *TestPlane, name string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Stretched(5*time.Second))
	defer cancel()
	s, err := p.JS(t).Stream(ctx, streamOf(name))
	if err != nil {
		t.Fatalf("stream %s: %v", name, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatalf("stream %s: %v", name, err)
	}
	return info.State.LastSeq
}

// MintedRecord is a `minted` record as an auditor reads it: one mint's credentials.
type MintedRecord struct {
	V           int                `json:"v"`
	Endpoint    string             `json:"endpoint"`
	Caller      string             `json:"caller"`
	Kind        string             `json:"kind"`
	Operation   string             `json:"operation"`
	InstanceID  string             `json:"instanceId"`
	RequestID   string             `json:"requestId"`
	RunID       string             `json:"runId"`
	Credentials []MintedCredential `json:"credentials"`
	At          int64              `json:"at"`
}

// MintedCredential is one credential of a `minted` record.
type MintedCredential struct {
	Duty string `json:"duty"`
	NKey string `json:"nkey"`
	Exp  int64  `json:"exp"`
}

// Of returns the credential of rec for nkey.
func (rec MintedRecord) Of(nkey string) (MintedCredential, bool) {
	for _, c := range rec.Credentials {
		if c.NKey == nkey {
			return c, true
		}
	}
	return MintedCredential{}, false
}

// Keys are the keys rec names.
func (rec MintedRecord) Keys() []string {
	out := make([]string, len(rec.Credentials))
	for i, c := range rec.Credentials {
		out[i] = c.NKey
	}
	return out
}

// MintedRecords reads instance iid's `minted` records (iid "" for none), as an auditor would:
// the last message of each subject under the instance, by subject. Each record's subject must
// be its own set of keys.
func MintedRecords(t testing.TB, p *TestPlane, iid string) map[string]MintedRecord {
	t.Helper()
	return MintedRecordsIn(t, p.JS(t), iid)
}

// MintedRecordsIn is MintedRecords over js.
func MintedRecordsIn(t testing.TB, js jetstream.JetStream, iid string) map[string]MintedRecord {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, subjects.MintedStream(TestSpace))
	if err != nil {
		t.Fatal(err)
	}
	if iid == "" {
		iid = subjects.NoInstance
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(subjects.MintedInstanceFilter(TestSpace, iid)))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]MintedRecord{}
	for subject := range info.State.Subjects {
		m, err := st.GetLastMsgForSubject(ctx, subject)
		if err != nil {
			t.Fatalf("read %s: %v", subject, err)
		}
		var rec MintedRecord
		if err := json.Unmarshal(m.Data, &rec); err != nil {
			t.Fatalf("decode %s: %v", subject, err)
		}
		if want := subjects.MintedSubject(TestSpace, iid, rec.Keys()); subject != want {
			t.Errorf("the minted record on %s names keys %v, whose subject is %s", subject, rec.Keys(), want)
		}
		out[subject] = rec
	}
	return out
}

// MintedKeys lists the keys named by instance iid's `minted` records, sorted, each once: the
// keys an end of it must revoke.
func MintedKeys(t testing.TB, p *TestPlane, iid string) []string {
	t.Helper()
	var keys []string
	for _, rec := range MintedRecords(t, p, iid) {
		keys = append(keys, rec.Keys()...)
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}

// DecisionRecord is an audit record (refused, discarded, …) as an auditor reads it.
type DecisionRecord struct {
	V           int    `json:"v"`
	Decision    string `json:"decision"`
	Endpoint    string `json:"endpoint"`
	Caller      string `json:"caller"`
	Kind        string `json:"kind"`
	Operation   string `json:"operation"`
	InstanceID  string `json:"instanceId"`
	RequestID   string `json:"requestId"`
	Code        string `json:"code"`
	Message     string `json:"message"`
	Credentials []struct {
		Duty string `json:"duty"`
		NKey string `json:"nkey"`
		Exp  int64  `json:"exp"`
	} `json:"credentials"`
	At int64 `json:"at"`
}

// LastDecision is the newest audit record of decision from owner.actor, waited for.
func LastDecision(t testing.TB, p *TestPlane, decision, owner, actor string) DecisionRecord {
	t.Helper()
	var d DecisionRecord
	testkit.CheckFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		m, err := LastMsg(t, p, subjects.AuditStream(TestSpace), subjects.AuditSubject(TestSpace, decision, owner, actor))
		if err != nil {
			return fmt.Errorf("no %s record for %s: %w", decision, subjects.Principal(owner, actor), err)
		}
		return json.Unmarshal(m.Data, &d)
	})
	return d
}

// WriteGate rewrites the manager gate of iid in the store, as another writer would: edit
// changes the row as decoded (nil rewrites the bytes as they are, as a mint's commit does). It
// is how a test injects a fence write at a moment the bus cannot reach.
func WriteGate(t testing.TB, p *TestPlane, iid string, edit func(row map[string]any)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := p.JS(t).KeyValue(ctx, subjects.AuthBucket(TestSpace))
	if err != nil {
		t.Fatal(err)
	}
	key := subjects.GateKey(subjects.GateEndpointManager, iid)
	e, err := kv.Get(ctx, key)
	if err != nil {
		t.Fatalf("read gate %s: %v", key, err)
	}
	value := e.Value()
	if edit != nil {
		var row map[string]any
		if err := json.Unmarshal(value, &row); err != nil {
			t.Fatal(err)
		}
		edit(row)
		if value, err = json.Marshal(row); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := kv.Update(ctx, key, value, e.Revision()); err != nil {
		t.Fatalf("write gate %s: %v", key, err)
	}
}

// CopyIdentity copies the plane identity in dir from into dir to, as an operator copying a
// state directory to a second host would.
func CopyIdentity(t testing.TB, from, to string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(from, "identity.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(to, "identity.json"), raw, 0o600); err != nil {
		t.Fatal(err)
	}
}

// StreamInfo is the state of a stream, with its subjects.
func StreamInfo(t testing.TB, p *TestPlane, name string) (*jetstream.StreamInfo, error) {
	t.Helper()
	st, err := p.JS(t).Stream(t.Context(), streamOf(name))
	if err != nil {
		return nil, err
	}
	return st.Info(t.Context(), jetstream.WithSubjectFilter(">"))
}

// ReadAll reads every message of stream whose subject matches filter with an ordered consumer.
func ReadAll(t testing.TB, js jetstream.JetStream, stream, filter string) []jetstream.Msg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		t.Fatalf("ordered consumer on %s: %v", stream, err)
	}
	var out []jetstream.Msg
	for {
		batch, err := c.FetchNoWait(100)
		if err != nil {
			t.Fatalf("fetch from %s: %v", stream, err)
		}
		n := 0
		for m := range batch.Messages() {
			out = append(out, m)
			n++
		}
		if err := batch.Error(); err != nil {
			t.Fatalf("fetch from %s: %v", stream, err)
		}
		if n == 0 {
			return out
		}
	}
}

// WitnessStream names the stream that holds owner's run-starts.
func WitnessStream(owner string) string { return subjects.WitnessStream(TestSpace, owner) }
