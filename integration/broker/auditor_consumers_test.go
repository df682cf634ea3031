package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotal-ai/authplane/handlers"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/core/store"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// An auditor's consumers: broker permissions cannot see a consumer's deliver_subject, so the
// plane takes an auditor's consumer creations itself and passes only pull consumers on; the
// minted and audit streams bound how many there are and how long an idle one lives.

// createConsumer sends JetStream's consumer-create request for stream st, consumer name (and
// filter, when not "") with cfg, as auditorName's client does, and returns the answer.
func createConsumer(t testing.TB, nc *nats.Conn, st, name, filter string, cfg map[string]any) jetstream.ConsumerInfo {
	t.Helper()
	return createConsumerAs(t, nc, auditorName, st, name, filter, cfg)
}

// createConsumerAs is createConsumer for auditor's client.
func createConsumerAs(t testing.TB, nc *nats.Conn, auditor, st, name, filter string, cfg map[string]any) jetstream.ConsumerInfo {
	t.Helper()
	subject := subjects.AuditorAPIPrefix(harness.TestSpace, auditor) + ".CONSUMER.CREATE." + st + "." + name
	if filter != "" {
		subject += "." + filter
	}
	body, err := json.Marshal(map[string]any{"stream_name": st, "config": cfg, "action": ""})
	if err != nil {
		t.Fatal(err)
	}
	return createRaw(t, nc, subject, body)
}

// createRaw sends body on subject and decodes JetStream's answer (its error, if any).
func createRaw(t testing.TB, nc *nats.Conn, subject string, body []byte) jetstream.ConsumerInfo {
	t.Helper()
	msg, err := nc.Request(subject, body, 5*time.Second)
	if err != nil {
		t.Fatalf("create a consumer on %s: %v", subject, err)
	}
	var ci struct {
		jetstream.ConsumerInfo
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &ci); err != nil {
		t.Fatalf("create a consumer: %s: %v", msg.Data, err)
	}
	if ci.Error != nil {
		ci.ConsumerInfo.Name = "" // refused: no consumer
		ci.ConsumerInfo.Config.Description = fmt.Sprintf("%d %d %s", ci.Error.Code, ci.Error.ErrorCode, ci.Error.Description)
	}
	return ci.ConsumerInfo
}

// readers are the consumers of stream st as the plane account sees them, each with the name
// its creation asked for.
func readers(t testing.TB, p *harness.TestPlane, st string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, ci := range consumersOf(t, p, st) {
		out[ci.Name] = ci.Config.Metadata[handlers.AskedName]
	}
	return out
}

// deleteConsumer sends JetStream's consumer-delete request for consumer name of stream st
// under api, and returns the error its answer carries.
func deleteConsumer(t testing.TB, nc *nats.Conn, api, st, name string) error {
	t.Helper()
	msg, err := nc.Request(api+".CONSUMER.DELETE."+st+"."+name, nil, 5*time.Second)
	if err != nil {
		t.Fatalf("delete consumer %s of %s: %v", name, st, err)
	}
	var answer struct {
		Success bool                `json:"success"`
		Error   *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &answer); err != nil {
		t.Fatalf("delete consumer %s of %s: %s: %v", name, st, msg.Data, err)
	}
	switch {
	case answer.Error != nil && answer.Error.ErrorCode == jetstream.JSErrCodeConsumerNotFound:
		return jetstream.ErrConsumerNotFound
	case answer.Error != nil:
		return answer.Error
	case !answer.Success:
		return fmt.Errorf("delete consumer %s of %s: %s, want success", name, st, msg.Data)
	}
	return nil
}

// consumersOf lists the consumers of stream st as the plane account sees them.
func consumersOf(t testing.TB, p *harness.TestPlane, st string) []*jetstream.ConsumerInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := p.JS(t).Stream(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	var out []*jetstream.ConsumerInfo
	l := s.ListConsumers(ctx)
	for ci := range l.Info() {
		out = append(out, ci)
	}
	if err := l.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// pagerConfig is the consumer the stock CLI's `nats stream view` (v0.5.0, jsm.go's pager)
// asks for: a durable pull consumer in memory, acked explicitly, inactive after an hour.
func pagerConfig(name, filter string) map[string]any {
	return map[string]any{"description": "JSM Stream Pager", "ack_policy": "explicit", "ack_wait": 30 * time.Second,
		"deliver_policy": "all", "durable_name": name, "name": name, "filter_subject": filter, "replay_policy": "instant",
		"inactive_threshold": time.Hour, "num_replicas": 1, "mem_storage": true, "pause_until": "0001-01-01T00:00:00Z"}
}

// Unguarded, an auditor created 300 durable push consumers in the plane account in under a
// second, delivering to `$KV.…` and `$JS.API.STREAM.DELETE.…`, and they stayed. So every push
// consumer is refused before JetStream sees it, whatever the spelling of its deliver_subject,
// durable or not, on either stream; none exists afterwards, nothing was written, and each is
// counted in /metrics.
func TestAnAuditorCannotMakeAPushConsumer(t *testing.T) {
	t.Parallel()
	p, nc, _, errs := auditedPlane(t)
	before := streamStates(t, p)
	deliver := []string{
		"$KV." + subjects.AuthBucket(harness.TestSpace) + ".epgate.auth.evil",
		"$JS.API.STREAM.DELETE.KV_" + subjects.AuthBucket(harness.TestSpace),
		subjects.AuditorInboxPrefix(auditorName) + ".mine",
	}
	const flood = 300
	for i := range flood {
		st := subjects.AuditedStreams(harness.TestSpace)[i%2]
		name := fmt.Sprintf("push%d", i)
		cfg := map[string]any{"deliver_subject": deliver[i%len(deliver)], "deliver_policy": "all", "ack_policy": "none"}
		switch i % 4 {
		case 1:
			cfg["durable_name"] = name
		case 2: // Go's decoder, JetStream's too, matches a key whatever its case
			cfg = map[string]any{"Deliver_Subject": deliver[i%len(deliver)], "durable_name": name, "ack_policy": "none"}
		case 3: // a queue of push consumers, or their flow control, is push too
			cfg = map[string]any{"deliver_group": "q", "flow_control": true, "idle_heartbeat": time.Second, "ack_policy": "explicit"}
		}
		if ci := createConsumer(t, nc, st, name, "", cfg); ci.Name != "" || !strings.HasPrefix(ci.Config.Description, "403 ") {
			t.Fatalf("push consumer %d %v: got %q %q, want refused 403", i, cfg, ci.Name, ci.Config.Description)
		}
	}
	// A duplicate key: the last one counts, for the plane's decoder and for JetStream's.
	dup := `{"stream_name":"` + subjects.AuditStream(harness.TestSpace) + `","config":{"name":"dup","deliver_subject":"","deliver_subject":"` + deliver[0] + `","ack_policy":"none"}}`
	if ci := createRaw(t, nc, subjects.AuditorAPIPrefix(harness.TestSpace, auditorName)+".CONSUMER.CREATE."+subjects.AuditStream(harness.TestSpace)+".dup", []byte(dup)); ci.Name != "" {
		t.Errorf("a push consumer behind a duplicate key: got %q, want refused", ci.Name)
	}
	for _, st := range subjects.AuditedStreams(harness.TestSpace) {
		if cs := consumersOf(t, p, st); len(cs) != 0 {
			t.Errorf("stream %s: got %d consumers, want none", st, len(cs))
		}
	}
	if got := harness.Sample(harness.Scrape(t, p.HTTPURL()), "authplane_auditor_consumers_refused_total", map[string]string{"reason": "push"}); got != flood+1 {
		t.Errorf("authplane_auditor_consumers_refused_total{push}: got %v, want %d", got, flood+1)
	}
	if after := streamStates(t, p); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("the plane's streams changed: got %v, want %v", after, before)
	}
	if all := errs.All(); len(all) != 0 {
		t.Errorf("async errors: %v, want none (the creations were allowed, and refused by the plane)", all)
	}
}

// Each of the minted and audit streams holds at most --auditor-consumers consumers, one per
// auditor (its own, named after it: a second creation replaces it), and none outlives an hour
// without use: a consumer asking for longer is refused, one asking nothing gets the hour. Past
// the count a creation is refused (counted in /metrics) until one is deleted.
func TestAuditorConsumersAreBoundedInCountAndIdleLife(t *testing.T) {
	t.Parallel()
	const max = 3
	p := harness.StartPlane(t, func(c *service.Config) { c.AuditorConsumers = max })
	seedRecords(t, p)
	conn := func(name string) *nats.Conn {
		nc, _ := auditorConn(t, p.NATSURL(), name, writeAuditorCreds(t, p, name), &harness.AsyncErrors{})
		return nc
	}
	audit := subjects.AuditStream(harness.TestSpace)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, st := range subjects.AuditedStreams(harness.TestSpace) {
		s, err := p.JS(t).Stream(ctx, st)
		if err != nil {
			t.Fatal(err)
		}
		if c := s.CachedInfo().Config; c.MaxConsumers != max || c.ConsumerLimits.InactiveThreshold != store.ReaderInactiveMax {
			t.Errorf("stream %s: max_consumers %d, consumer_limits %+v; want %d and an hour", st, c.MaxConsumers, c.ConsumerLimits, max)
		}
	}

	alice := conn("alice")
	if ci := createConsumer(t, alice, audit, "long", "", map[string]any{"durable_name": "long", "ack_policy": "none", "inactive_threshold": 2 * time.Hour}); ci.Name != "" {
		t.Errorf("a consumer idle for 2 h: got %q, want refused", ci.Name)
	}
	ci := createConsumer(t, alice, audit, "forever", "", map[string]any{"durable_name": "forever", "ack_policy": "explicit"})
	if ci.Name != "forever" || ci.Config.InactiveThreshold != store.ReaderInactiveMax {
		t.Errorf("a durable asking no idle life: got %q %s (%s), want it made, gone after an hour idle", ci.Name, ci.Config.InactiveThreshold, ci.Config.Description)
	}
	if got := readers(t, p, audit); !maps.Equal(got, map[string]string{"alice": "forever"}) {
		t.Errorf("the audit stream's readers: got %v, want alice's own, made as forever", got)
	}
	if ci := createConsumer(t, alice, audit, "pager", ">", pagerConfig("pager", ">")); ci.Name != "pager" || ci.Config.Description != "JSM Stream Pager" {
		t.Errorf("alice's second creation: got %q (%s), want it made", ci.Name, ci.Config.Description)
	}
	if got := readers(t, p, audit); !maps.Equal(got, map[string]string{"alice": "pager"}) {
		t.Errorf("the audit stream's readers: got %v, want alice's own, replaced by pager", got)
	}
	for _, name := range []string{"bob", "carol"} {
		if ci := createConsumerAs(t, conn(name), name, audit, "pager", ">", pagerConfig("pager", ">")); ci.Name != "pager" {
			t.Fatalf("%s's consumer: got %q (%s), want it made", name, ci.Name, ci.Config.Description)
		}
	}
	if got := readers(t, p, audit); !maps.Equal(got, map[string]string{"alice": "pager", "bob": "pager", "carol": "pager"}) {
		t.Errorf("the audit stream's readers: got %v, want alice's, bob's and carol's own", got)
	}
	dave := conn("dave")
	if ci := createConsumerAs(t, dave, "dave", audit, "pager", ">", pagerConfig("pager", ">")); ci.Name != "" || !strings.Contains(ci.Config.Description, "maximum consumers limit") {
		t.Errorf("a consumer past %d: got %q %q, want the stream's limit", max, ci.Name, ci.Config.Description)
	}
	if got := harness.Sample(harness.Scrape(t, p.HTTPURL()), "authplane_auditor_consumers_refused_total", map[string]string{"reason": "max_consumers"}); got != 1 {
		t.Errorf("authplane_auditor_consumers_refused_total{max_consumers}: got %v, want 1", got)
	}
	// The other stream's budget is its own; a deleted consumer gives its slot back.
	if ci := createConsumerAs(t, dave, "dave", subjects.MintedStream(harness.TestSpace), "pager", ">", pagerConfig("pager", ">")); ci.Name != "pager" {
		t.Errorf("the minted stream's first consumer: got %q (%s), want it made", ci.Name, ci.Config.Description)
	}
	if _, err := alice.Request(subjects.AuditorAPIPrefix(harness.TestSpace, "alice")+".CONSUMER.DELETE."+audit+".pager", nil, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if ci := createConsumerAs(t, dave, "dave", audit, "pager", ">", pagerConfig("pager", ">")); ci.Name != "pager" {
		t.Errorf("after a delete: got %q (%s), want it made", ci.Name, ci.Config.Description)
	}
	if got := readers(t, p, audit); !maps.Equal(got, map[string]string{"bob": "pager", "carol": "pager", "dave": "pager"}) {
		t.Errorf("the audit stream's readers: got %v, want bob's, carol's and dave's own", got)
	}
}

// `nats stream view` of the stock CLI (v0.5.0) pages through a durable pull consumer it makes
// and deletes (jsm.go's pager): its requests, replayed here as it sends them, still read every
// record, and leave no consumer behind. With the CLI and `script` (a terminal) on PATH, the
// CLI itself runs too.
func TestTheStockCLIsStreamViewStillPages(t *testing.T) {
	t.Parallel()
	p, nc, _, _ := auditedPlane(t)
	api := subjects.AuditorAPIPrefix(harness.TestSpace, auditorName)
	for _, st := range subjects.AuditedStreams(harness.TestSpace) {
		name := "stream_pager_1234" + st
		if ci := createConsumer(t, nc, st, name, ">", pagerConfig(name, ">")); ci.Name != name {
			t.Fatalf("%s: the pager's consumer: got %q (%s), want it made", st, ci.Name, ci.Config.Description)
		}
		if got := readers(t, p, st); !maps.Equal(got, map[string]string{auditorName: name}) {
			t.Fatalf("%s: readers %v, want the auditor's own, made as %s", st, got, name)
		}
		// An inbox of its own, not under the connection's request mux: nats.go hands a message
		// that reaches the mux under a subject it matches to no request to the one request
		// waiting, and the delete below was once answered with one of this page's records.
		inbox := nc.NewInbox()
		sub, err := nc.SubscribeSync(inbox)
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.PublishRequest(api+".CONSUMER.MSG.NEXT."+st+"."+name, inbox, []byte(`{"batch":25,"no_wait":true}`)); err != nil {
			t.Fatal(err)
		}
		records := 0
		for {
			m, err := sub.NextMsg(5 * time.Second)
			if err != nil {
				t.Fatalf("%s: page: %v", st, err)
			}
			if m.Header.Get("Status") == "404" {
				break
			}
			if !json.Valid(m.Data) {
				t.Errorf("%s: record %q is not JSON", st, m.Data)
			}
			records++
			if err := m.Ack(); err != nil {
				t.Fatal(err)
			}
		}
		if records == 0 {
			t.Errorf("%s: the pager read no record", st)
		}
		answer, err := nc.Request(api+".CONSUMER.DELETE."+st+"."+name, nil, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var deleted struct {
			Success bool `json:"success"`
		}
		if json.Unmarshal(answer.Data, &deleted) != nil || !deleted.Success {
			t.Fatalf("%s: deleting the pager's consumer: got %s", st, answer.Data)
		}
		if cs := consumersOf(t, p, st); len(cs) != 0 {
			t.Errorf("%s: %d consumers left, want none", st, len(cs))
		}
	}

	natsPath, err1 := exec.LookPath("nats")
	scriptPath, err2 := exec.LookPath("script")
	if err1 != nil || err2 != nil {
		return
	}
	creds := writeAuditorCreds(t, p, auditorName)
	home := t.TempDir()
	for _, st := range subjects.AuditedStreams(harness.TestSpace) {
		line := fmt.Sprintf("%s --server %s --creds %s --inbox-prefix %s --js-api-prefix %s stream view %s",
			natsPath, p.NATSURL(), creds, subjects.AuditorInboxPrefix(auditorName), api, st)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cmd := exec.CommandContext(ctx, scriptPath, "-qc", line, filepath.Join(home, "typescript"))
		cmd.Env = append(os.Environ(), "HOME="+home, "XDG_CONFIG_HOME="+home)
		out, err := harness.CombinedOutput(cmd)
		cancel()
		if err != nil || !strings.Contains(string(out), "Subject: cotal."+harness.TestSpace+".") {
			t.Errorf("nats stream view %s: %v\n%s", st, err, out)
		}
		if cs := consumersOf(t, p, st); len(cs) != 0 {
			t.Errorf("nats stream view %s left %d consumers", st, len(cs))
		}
	}
}

// A minted or audit stream made by a release before these limits still starts: the start sets
// its max_consumers and consumer_limits in place, and first deletes the consumers those limits
// would not have let be made (push consumers, durables that never go inactive) while keeping
// the ones within them, more than the new maximum included.
func TestAStreamMadeByAnOlderReleaseStartsWithItsReadersBounded(t *testing.T) {
	t.Parallel()
	s := harness.StartStandalone(t, harness.TestSpace)
	nc, js := harness.PlaneConn(t, s.Material, s.URL())
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const max = 2
	kept := []string{"pager_a", "pager_b", "pager_c"} // within the limits: one more than max
	for _, spec := range store.Specs(harness.TestSpace, store.Options{}) {
		if !spec.Readers {
			continue
		}
		old := spec.Config
		old.MaxConsumers, old.ConsumerLimits = 0, jetstream.StreamConsumerLimits{}
		st, err := js.CreateStream(ctx, old)
		if err != nil {
			t.Fatal(err)
		}
		legacy := []jetstream.ConsumerConfig{
			{Durable: "push_kv", DeliverSubject: "$KV." + subjects.AuthBucket(harness.TestSpace) + ".epgate.auth.evil", AckPolicy: jetstream.AckNonePolicy},
			{Durable: "push_delete", DeliverSubject: "$JS.API.STREAM.DELETE.KV_" + subjects.AuthBucket(harness.TestSpace), AckPolicy: jetstream.AckNonePolicy},
			{Durable: "forever", AckPolicy: jetstream.AckExplicitPolicy},
			{Durable: "too_long", AckPolicy: jetstream.AckExplicitPolicy, InactiveThreshold: 2 * time.Hour},
		}
		for _, name := range kept {
			legacy = append(legacy, jetstream.ConsumerConfig{Durable: name, AckPolicy: jetstream.AckExplicitPolicy, InactiveThreshold: 30 * time.Minute})
		}
		for _, c := range legacy {
			if _, err := st.CreateConsumer(ctx, c); err != nil {
				t.Fatalf("legacy consumer %s: %v", c.Durable, err)
			}
		}
	}

	p := harness.StartPlane(t, func(c *service.Config) {
		harness.AgainstStandalone(s)(c)
		c.AuditorConsumers = max
	})
	for _, st := range subjects.AuditedStreams(harness.TestSpace) {
		info, err := p.JS(t).Stream(ctx, st)
		if err != nil {
			t.Fatal(err)
		}
		if c := info.CachedInfo().Config; c.MaxConsumers != max || c.ConsumerLimits.InactiveThreshold != store.ReaderInactiveMax {
			t.Errorf("stream %s after the start: max_consumers %d, consumer_limits %+v; want %d and an hour", st, c.MaxConsumers, c.ConsumerLimits, max)
		}
		var names []string
		for _, ci := range consumersOf(t, p, st) {
			names = append(names, ci.Name)
		}
		slices.Sort(names)
		if !slices.Equal(names, kept) {
			t.Errorf("stream %s's consumers after the start: got %v, want %v (push and never-idle ones deleted)", st, names, kept)
		}
	}
	// Past its maximum, the stream takes no new consumer until enough are gone.
	anc, _ := auditorConn(t, p.NATSURL(), auditorName, writeAuditorCreds(t, p, auditorName), &harness.AsyncErrors{})
	if ci := createConsumer(t, anc, subjects.AuditStream(harness.TestSpace), "new", ">", pagerConfig("new", ">")); ci.Name != "" {
		t.Errorf("a new consumer past the maximum: got %q, want refused", ci.Name)
	}
}

// Each auditor has its own reader of each stream, and no other auditor can delete, drain, ack
// or use it up: whatever consumer an auditor's request names, it reaches its own (the plane
// account maps it there), and its acks may name only its own. Here the streams hold two
// consumers: alice creates five times over and still holds one, so bob's fits; alice's info and
// pull naming bob's consumer reach her own, her ack of bob's is a permissions violation, and her
// delete naming bob's deletes nothing (bob's is not hers, and hers was made under another name);
// naming the name hers was made under, it deletes hers alone. Before, every auditor shared one
// pool of 32 readers, and any could delete any.
func TestAnAuditorCannotDeleteOrUseUpAnothersReaders(t *testing.T) {
	t.Parallel()
	p := harness.StartPlane(t, func(c *service.Config) { c.AuditorConsumers = 2 })
	seedRecords(t, p)
	audit := subjects.AuditStream(harness.TestSpace)
	errs := &harness.AsyncErrors{}
	alice, _ := auditorConn(t, p.NATSURL(), "alice", writeAuditorCreds(t, p, "alice"), errs)
	bob, _ := auditorConn(t, p.NATSURL(), "bob", writeAuditorCreds(t, p, "bob"), &harness.AsyncErrors{})
	for i := range 5 {
		name := fmt.Sprintf("reader%d", i)
		if ci := createConsumerAs(t, alice, "alice", audit, name, ">", pagerConfig(name, ">")); ci.Name != name {
			t.Fatalf("alice's creation %d: got %q (%s), want it made", i, ci.Name, ci.Config.Description)
		}
	}
	if ci := createConsumerAs(t, bob, "bob", audit, "pager", ">", pagerConfig("pager", ">")); ci.Name != "pager" {
		t.Fatalf("bob's consumer beside alice's: got %q (%s), want it made", ci.Name, ci.Config.Description)
	}
	names := func() []string {
		var out []string
		for _, ci := range consumersOf(t, p, audit) {
			out = append(out, ci.Name)
		}
		slices.Sort(out)
		return out
	}
	if got := names(); !slices.Equal(got, []string{"alice", "bob"}) {
		t.Fatalf("the audit stream's consumers: got %v, want alice's and bob's", got)
	}

	api := subjects.AuditorAPIPrefix(harness.TestSpace, "alice")
	info, err := alice.Request(api+".CONSUMER.INFO."+audit+".bob", nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var ci jetstream.ConsumerInfo
	if err := json.Unmarshal(info.Data, &ci); err != nil || ci.Name != "alice" {
		t.Errorf("alice's info of bob's consumer: got %s, want her own", info.Data)
	}
	inbox := alice.NewInbox()
	sub, err := alice.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := alice.PublishRequest(api+".CONSUMER.MSG.NEXT."+audit+".bob", inbox, []byte(`{"batch":1,"no_wait":true}`)); err != nil {
		t.Fatal(err)
	}
	m, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatalf("alice's pull naming bob's consumer: %v", err)
	}
	if meta, err := m.Metadata(); err == nil && meta.Consumer != "alice" {
		t.Errorf("alice's pull naming bob's consumer delivered from %q, want her own", meta.Consumer)
	}
	bobAck := "$JS.ACK." + audit + ".bob.1.1.1.0.0"
	if err := alice.Publish(bobAck, nil); err != nil {
		t.Fatal(err)
	}
	errs.WaitViolation(t, "Publish", bobAck)
	if err := deleteConsumer(t, alice, api, audit, "bob"); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Errorf("alice's delete naming bob's consumer: got %v, want not found", err)
	}
	if got := names(); !slices.Equal(got, []string{"alice", "bob"}) {
		t.Errorf("after alice's delete naming bob's consumer: got %v, want both", got)
	}
	if err := deleteConsumer(t, alice, api, audit, "reader4"); err != nil {
		t.Errorf("alice's delete naming her own reader: %v", err)
	}
	if got := names(); !slices.Equal(got, []string{"bob"}) {
		t.Errorf("after alice's delete naming her own reader: got %v, want bob's alone", got)
	}
	s, err := p.JS(t).Stream(context.Background(), audit)
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.Consumer(context.Background(), "bob")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.CachedInfo().Delivered.Consumer; got != 0 {
		t.Errorf("bob's consumer delivered %d messages, want none (only alice pulled)", got)
	}
}

// A client may make its next consumer and delete its last one at once: nats.go's ordered
// consumer does at every fetch, deleting by the name the creation's answer gave. Each auditor
// holds one reader, so when that answer named the reader after the auditor, the delete, reaching
// the plane after the next creation, deleted the reader just made, and the fetch got "no
// responders", "consumer deleted" or nothing (TestAuditorReadsTheAuditAndMintedStreams failed 4
// runs in 10 under -race). Now the answer names the consumer as asked, a delete naming a reader a
// later creation replaced deletes nothing, and the new reader starts where it asks (here the
// first record), not where the replaced one stopped.
func TestADeleteOfAReplacedReaderLeavesTheNewOne(t *testing.T) {
	t.Parallel()
	_, _, js, _ := auditedPlane(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	audit := subjects.AuditStream(harness.TestSpace)
	st, err := js.Stream(ctx, audit)
	if err != nil {
		t.Fatal(err)
	}
	records := int(st.CachedInfo().State.Msgs)
	reader := func(name string) jetstream.Consumer {
		c, err := js.CreateOrUpdateConsumer(ctx, audit, jetstream.ConsumerConfig{Name: name, AckPolicy: jetstream.AckNonePolicy})
		if err != nil {
			t.Fatalf("create reader %s: %v", name, err)
		}
		if got := c.CachedInfo().Name; got != name {
			t.Fatalf("reader %s: the answer names %q, want %s", name, got, name)
		}
		return c
	}
	read := func(c jetstream.Consumer, batch int) []uint64 {
		b, err := c.FetchNoWait(batch)
		if err != nil {
			t.Fatalf("fetch: %v", err)
		}
		var seqs []uint64
		for m := range b.Messages() {
			meta, err := m.Metadata()
			if err != nil {
				t.Fatal(err)
			}
			seqs = append(seqs, meta.Sequence.Stream)
		}
		if err := b.Error(); err != nil {
			t.Fatalf("fetch: %v", err)
		}
		return seqs
	}
	if got := read(reader("one"), 1); !slices.Equal(got, []uint64{1}) {
		t.Fatalf("reader one: got records %v, want 1", got)
	}
	two := reader("two")
	if err := js.DeleteConsumer(ctx, audit, "one"); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Errorf("the delete of reader one after two was made: got %v, want not found", err)
	}
	if got := read(two, records+1); len(got) != records || got[0] != 1 {
		t.Errorf("reader two: got records %v, want the stream's %d from 1", got, records)
	}
	if err := js.DeleteConsumer(ctx, audit, "two"); err != nil {
		t.Errorf("the delete of reader two: %v", err)
	}
}
