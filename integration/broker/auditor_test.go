package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/subjects"
)

// auditorName names the auditor of the tests that need one.
const auditorName = "alice"

// auditorConn connects to p's broker with auditor name's credential (`authplane creds --role
// auditor --actor <name>`) as the README says to use it: its inbox prefix, and JetStream through
// its API prefix. errs collects the connection's asynchronous errors.
func auditorConn(t testing.TB, url, name, creds string, errs *harness.AsyncErrors) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, nats.UserCredentials(creds), nats.CustomInboxPrefix(subjects.AuditorInboxPrefix(name)),
		nats.MaxReconnects(0), errs.Option())
	if err != nil {
		t.Fatalf("connect as an auditor: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.NewWithAPIPrefix(nc, subjects.AuditorAPIPrefix(harness.TestSpace, name))
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// seedRecords leaves a refused record (a prepare without scope, by ownerB) and minted records
// (a prepare with scope, by ownerA) in p's streams, and returns the prepared instance.
func seedRecords(t testing.TB, p *harness.TestPlane) string {
	t.Helper()
	m := harness.NewManagerKeys(t)
	if o := harness.Ask(t, harness.CallerConn(t, p, harness.OwnerB, "cli"), harness.OwnerB, "cli", subjects.EndpointManagerAuthority, m.Body(t, "prepare", "cli")); o.Code != "permission-denied" {
		t.Fatalf("a prepare without scope: got %q %q, want permission-denied", o.Code, o.Message)
	}
	harness.Grant(t, p, harness.OwnerA, "cli", "supervise")
	harness.MustMint(t, harness.CallerConn(t, p, harness.OwnerA, "cli"), harness.OwnerA, "cli", m.Body(t, "prepare", "cli"))
	return m.Iid
}

func TestAuditorReadsTheAuditAndMintedStreams(t *testing.T) {
	t.Parallel()
	p := harness.StartPlane(t, nil)
	iid := seedRecords(t, p)
	_, js := auditorConn(t, p.NATSURL(), auditorName, writeAuditorCreds(t, p, auditorName), &harness.AsyncErrors{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	audit, err := js.Stream(ctx, subjects.AuditStream(harness.TestSpace))
	if err != nil {
		t.Fatalf("stream info of the audit stream: %v", err)
	}
	if n := audit.CachedInfo().State.Msgs; n == 0 {
		t.Fatalf("the audit stream: got %d records, want the refusal", n)
	}
	first, err := audit.GetMsg(ctx, 1)
	if err != nil {
		t.Fatalf("get audit record 1: %v", err)
	}
	refused := harness.ReadAll(t, js, subjects.AuditStream(harness.TestSpace), subjects.AuditSubject(harness.TestSpace, "refused", harness.OwnerB, "cli"))
	if len(refused) != 1 || !strings.Contains(string(refused[0].Data()), `"code":"permission-denied"`) {
		t.Fatalf("ownerB's refused records: got %d, want the one permission-denied", len(refused))
	}
	if string(first.Data) != string(refused[0].Data()) {
		t.Errorf("record 1 by get: %s; by the consumer: %s; want the same record", first.Data, refused[0].Data())
	}

	minted, err := js.Stream(ctx, subjects.MintedStream(harness.TestSpace))
	if err != nil {
		t.Fatalf("stream info of the minted stream: %v", err)
	}
	mints := harness.ReadAll(t, js, subjects.MintedStream(harness.TestSpace), subjects.MintedStreamSubjects(harness.TestSpace))
	if len(mints) != 1 {
		t.Fatalf("minted records: got %d, want the prepare's one, of its supervisor and executor", len(mints))
	}
	last, err := minted.GetLastMsgForSubject(ctx, mints[0].Subject())
	if err != nil {
		t.Fatalf("get the last mint of %s: %v", mints[0].Subject(), err)
	}
	var rec harness.MintedRecord
	if err := json.Unmarshal(last.Data, &rec); err != nil || last.Subject != subjects.MintedSubject(harness.TestSpace, iid, rec.Keys()) ||
		rec.Caller != subjects.Principal(harness.OwnerA, "cli") || len(rec.Credentials) != 2 || rec.Credentials[0].Duty != "supervisor" || rec.Credentials[1].Duty != "executor" {
		t.Errorf("the last mint: %s %s, want the record of instance %s's supervisor and executor for %s, on the subject of its keys", last.Subject, last.Data, iid, subjects.Principal(harness.OwnerA, "cli"))
	}
}

// writeAuditorCreds writes auditor name's credential for p's space, valid for an hour.
func writeAuditorCreds(t testing.TB, p *harness.TestPlane, name string) string {
	t.Helper()
	return harness.WriteCreds(t, p.Keys(), admin.RoleAuditor, "", name)
}

// auditedPlane starts a plane with records in both streams and connects an auditor to it.
func auditedPlane(t *testing.T) (*harness.TestPlane, *nats.Conn, jetstream.JetStream, *harness.AsyncErrors) {
	t.Helper()
	p := harness.StartPlane(t, nil)
	seedRecords(t, p)
	errs := &harness.AsyncErrors{}
	nc, js := auditorConn(t, p.NATSURL(), auditorName, writeAuditorCreds(t, p, auditorName), errs)
	return p, nc, js, errs
}

func TestAuditorGetsAPermissionsViolationForAnythingButReading(t *testing.T) {
	t.Parallel()
	p, nc, js, errs := auditedPlane(t)
	audit, minted := subjects.AuditStream(harness.TestSpace), subjects.MintedStream(harness.TestSpace)
	api := subjects.AuditorAPIPrefix(harness.TestSpace, auditorName)
	secrets, fences := "KV_"+subjects.SecretsBucket(harness.TestSpace), "KV_"+subjects.AuthBucket(harness.TestSpace)
	before := streamStates(t, p)

	var forbidden []string
	for _, st := range []string{audit, minted} {
		for _, verb := range []string{"STREAM.MSG.DELETE.", "STREAM.PURGE.", "STREAM.DELETE.", "STREAM.UPDATE.", "DIRECT.GET."} {
			forbidden = append(forbidden, api+"."+verb+st, "$JS.API."+verb+st)
		}
	}
	forbidden = append(forbidden,
		"cotal.default.audit.refused."+harness.OwnerA+".cli", "cotal.default.minted.x.y", // a publish into either stream
		api+".STREAM.INFO."+secrets, api+".STREAM.MSG.GET."+secrets, api+".CONSUMER.CREATE."+secrets+".x", api+".STREAM.MSG.GET."+fences,
		"$JS.API.STREAM.MSG.GET."+secrets, "$JS.API.DIRECT.GET."+secrets, "$JS.API.STREAM.INFO."+fences,
		"$KV."+subjects.SecretsBucket(harness.TestSpace)+"."+subjects.IdentityKey("x"), "$KV."+subjects.AuthBucket(harness.TestSpace)+".epgate.auth.x",
		api+".STREAM.CREATE.EVIL", api+".STREAM.NAMES", api+".INFO", "$JS.API.INFO",
	)
	for _, subject := range forbidden {
		t.Run(subject, func(t *testing.T) {
			if err := nc.Publish(subject, []byte("{}")); err != nil {
				t.Fatal(err)
			}
			errs.WaitViolation(t, "Publish", subject)
		})
	}
	t.Run("a subscription outside its inbox", func(t *testing.T) {
		for _, subject := range []string{"_INBOX.>", subjects.InboxPrefix(harness.OwnerA, "cli") + ".>", "cotal.default.audit.>"} {
			if _, err := nc.SubscribeSync(subject); err != nil {
				t.Fatal(err)
			}
			errs.WaitViolation(t, "Subscription", subject)
		}
	})
	t.Run("the client's delete and purge calls fail", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		st, err := js.Stream(ctx, audit)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.DeleteMsg(ctx, 1); err == nil {
			t.Error("DeleteMsg: got success, want a refusal")
		}
		if err := st.Purge(ctx); err == nil {
			t.Error("Purge: got success, want a refusal")
		}
	})
	if after := streamStates(t, p); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("the plane's streams changed: got %v, want %v", after, before)
	}
}

// streamStates is the message count and last sequence of every stream of p's plane account.
func streamStates(t testing.TB, p *harness.TestPlane) map[string][2]uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out := map[string][2]uint64{}
	l := p.JS(t).ListStreams(ctx)
	for info := range l.Info() {
		out[info.Config.Name] = [2]uint64{info.State.Msgs, info.State.LastSeq}
	}
	if err := l.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// NATS does not check a request's reply subject, and a JetStream API answer is published with
// the rights of the account that serves it. An auditor's answers cross back through the data
// account's imports, where no stream can store them: aimed at a bucket's key, an answer writes
// nothing. A push consumer, which would deliver in the plane account where its creator said,
// is refused by the plane before JetStream sees it (TestAnAuditorCannotMakeAPushConsumer).
func TestAuditorCannotWriteThroughAReplySubjectOrAPushConsumer(t *testing.T) {
	t.Parallel()
	p, nc, _, errs := auditedPlane(t)
	audit := subjects.AuditStream(harness.TestSpace)
	api := subjects.AuditorAPIPrefix(harness.TestSpace, auditorName)
	key := "$KV." + subjects.AuthBucket(harness.TestSpace) + ".epgate.auth.evil"
	before := streamStates(t, p)

	if err := nc.PublishRequest(api+".STREAM.INFO."+audit, key, nil); err != nil {
		t.Fatal(err)
	}
	// A consumer creation whose answer is aimed at the key, and which asks for a push consumer
	// delivering there.
	push, err := json.Marshal(map[string]any{"stream_name": audit, "config": map[string]any{
		"name": "evil", "deliver_subject": key, "deliver_policy": "all", "ack_policy": "none"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishRequest(api+".CONSUMER.CREATE."+audit+".evil", key, push); err != nil {
		t.Fatal(err)
	}
	reply, err := nc.Request(api+".CONSUMER.CREATE."+audit+".evil", push, 5*time.Second)
	if err != nil {
		t.Fatalf("create a push consumer: %v", err)
	}
	if !strings.Contains(string(reply.Data), `"error"`) || strings.Contains(string(reply.Data), `"deliver_subject"`) {
		t.Fatalf("create a push consumer: got %s, want it refused", reply.Data)
	}
	// A round trip through the same imports after both: the answers aimed at the key have been
	// published by now.
	for range 3 {
		if _, err := nc.Request(api+".STREAM.INFO."+audit, nil, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if cs := consumersOf(t, p, audit); len(cs) != 0 {
		t.Errorf("the audit stream: got %d consumers, want none", len(cs))
	}
	if _, err := harness.FenceEntry(t, p, "epgate.auth.evil"); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("the fence bucket's epgate.auth.evil: got %v, want nothing written there", err)
	}
	if after := streamStates(t, p); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("the plane's streams changed: got %v, want %v", after, before)
	}
	if all := errs.All(); len(all) != 0 {
		t.Errorf("async errors: %v, want none (everything here was allowed, and wrote nothing)", all)
	}
}

// Why the auditor is not a plane-account user: there, a user that may publish only one stream's
// info request writes a fence through the reply subject it chooses. If a broker upgrade makes
// this fail, the auditor could live in the plane account after all.
func TestAPlaneAccountUserThatMayOnlyReadStreamInfoWritesAFenceThroughItsReply(t *testing.T) {
	t.Parallel()
	p := harness.StartPlane(t, nil)
	m := p.Keys()
	iss, err := issue.NewIssuer(m.Plane.Public(), m.Plane.Signer, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	kp := harness.MustKey(t)
	pub := harness.PubOf(t, kp)
	info := "$JS.API.STREAM.INFO." + subjects.AuditStream(harness.TestSpace)
	token, err := iss.Sign(issue.User{Name: "test.reader", Key: pub, Expires: time.Now().Add(time.Hour),
		Permissions: subjects.Permissions{Pub: []string{info}, Sub: []string{"_INBOX.reader.>"}}})
	if err != nil {
		t.Fatal(err)
	}
	seed, err := kp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(p.NATSURL(), nats.UserJWTAndSeed(token, string(seed)), nats.MaxReconnects(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if err := nc.PublishRequest(info, "$KV."+subjects.AuthBucket(harness.TestSpace)+".epgate.auth.evil", nil); err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		m, err := harness.FenceEntry(t, p, "epgate.auth.evil")
		if err != nil {
			return fmt.Errorf("epgate.auth.evil: %w, want the stream info answer written there", err)
		}
		if !strings.Contains(string(m.Data), "stream_info_response") {
			return fmt.Errorf("epgate.auth.evil holds %s, want the stream info answer", m.Data)
		}
		return nil
	})
}
