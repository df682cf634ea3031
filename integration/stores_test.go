package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/internal/space"
	"github.com/cotal-ai/authplane/subjects"
)

// What a test reads of the plane's stores it reads as an auditor would: as a short-lived user
// of the plane account, from the streams themselves (every read a leader read).

// planeConn connects to url as a short-lived plane-account user (where the plane's buckets and
// streams live) and returns the connection and its JetStream context; it closes when the test
// ends.
func planeConn(t testing.TB, m *space.Keys, url string) (*nats.Conn, jetstream.JetStream) {
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
func (p *testPlane) JS(t testing.TB) jetstream.JetStream {
	t.Helper()
	p.jsOnce.Do(func() { _, p.js = planeConn(p.t, p.Keys(), p.NATSURL()) })
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

// lastMsg returns the newest message on subject of the stream that holds name (a bucket or a
// record stream), read from its leader; jetstream.ErrMsgNotFound if there is none.
func lastMsg(t testing.TB, p *testPlane, name, subject string) (*jetstream.RawStreamMsg, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := p.JS(t).Stream(ctx, streamOf(name))
	if err != nil {
		t.Fatalf("stream %s: %v", streamOf(name), err)
	}
	return st.GetLastMsgForSubject(ctx, subject)
}

// fenceEntry returns the newest message of key in the fence bucket (a delete marker too).
func fenceEntry(t testing.TB, p *testPlane, key string) (*jetstream.RawStreamMsg, error) {
	t.Helper()
	bucket := subjects.AuthBucket(testSpace)
	return lastMsg(t, p, bucket, "$KV."+bucket+"."+key)
}

// readRecord decodes the newest message on subject of stream into v.
func readRecord(t testing.TB, p *testPlane, stream, subject string, v any) {
	t.Helper()
	m, err := lastMsg(t, p, stream, subject)
	if err != nil {
		t.Fatalf("read %s from %s: %v", subject, stream, err)
	}
	if err := json.Unmarshal(m.Data, v); err != nil {
		t.Fatalf("decode %s: %v", subject, err)
	}
}

// gateRevision is the KV revision of the manager gate of iid.
func gateRevision(t testing.TB, p *testPlane, iid string) uint64 {
	t.Helper()
	m, err := fenceEntry(t, p, subjects.GateKey(subjects.GateEndpointManager, iid))
	if err != nil {
		t.Fatalf("read gate of %s: %v", iid, err)
	}
	return m.Sequence
}

// lastSeq is the last sequence of a stream (KV_<bucket> for a bucket name).
func lastSeq(t testing.TB, p *testPlane, name string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
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

// mintedRecord is a `minted` record as an auditor reads it.
type mintedRecord struct {
	V          int    `json:"v"`
	Endpoint   string `json:"endpoint"`
	Caller     string `json:"caller"`
	Kind       string `json:"kind"`
	Operation  string `json:"operation"`
	InstanceID string `json:"instanceId"`
	RequestID  string `json:"requestId"`
	Duty       string `json:"duty"`
	NKey       string `json:"nkey"`
	Exp        int64  `json:"exp"`
	At         int64  `json:"at"`
}

// decisionRecord is an audit record (refused, discarded, …) as an auditor reads it.
type decisionRecord struct {
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

// lastDecision is the newest audit record of decision from owner.actor, waited for.
func lastDecision(t testing.TB, p *testPlane, decision, owner, actor string) decisionRecord {
	t.Helper()
	var d decisionRecord
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		m, err := lastMsg(t, p, subjects.AuditStream(testSpace), subjects.AuditSubject(testSpace, decision, owner, actor))
		if err != nil {
			return fmt.Errorf("no %s record for %s: %w", decision, subjects.Principal(owner, actor), err)
		}
		return json.Unmarshal(m.Data, &d)
	})
	return d
}

// writeGate rewrites the manager gate of iid in the store, as another writer would: edit
// changes the row as decoded (nil rewrites the bytes as they are, as a mint's commit does). It
// is how a test injects a fence write at a moment the bus cannot reach.
func writeGate(t testing.TB, p *testPlane, iid string, edit func(row map[string]any)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := p.JS(t).KeyValue(ctx, subjects.AuthBucket(testSpace))
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

// copyIdentity copies the plane identity in dir from into dir to, as an operator copying a
// state directory to a second host would.
func copyIdentity(t testing.TB, from, to string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(from, "identity.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(to, "identity.json"), raw, 0o600); err != nil {
		t.Fatal(err)
	}
}
