package flows

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/core/audit"
	"github.com/cotal-ai/authplane/internal/core/store"
	"github.com/cotal-ai/authplane/subjects"
)

// TestRenewalsOfOneInstanceKeepItsMintedRecordsConstant: the minted stream holds one record
// for each set of keys minted together, not one per mint. A registered instance renewed 40
// times (renew and renewStandingBundle) keeps the three records of its three sets (prepare's
// and renew's supervisor and executor, activate's three, the bundle's five), and the stream
// neither its messages nor its last sequence: a set's record stands for every renewal of it
// within its stay, so a renewal makes no synced write there.
func TestRenewalsOfOneInstanceKeepItsMintedRecordsConstant(t *testing.T) {
	t.Parallel()
	p := harness.StartPlane(t, nil)
	harness.Grant(t, p, harness.OwnerA, "cli", "supervise")
	cli, m := harness.CallerConn(t, p, harness.OwnerA, "cli"), harness.NewManagerKeys(t)
	_, act := harness.Registered(t, cli, harness.OwnerA, "cli", m)
	round := func() {
		t.Helper()
		for _, op := range []string{"renew", "renewStandingBundle"} {
			body := harness.Renewal(m.Body(t, op, "cli"), act.NextRegistrationProof, p.Account(), 0)
			if o := harness.Ask(t, cli, harness.OwnerA, "cli", subjects.EndpointManagerAuthority, body); o.Code != "" {
				t.Fatalf("%s: got %s %q", op, o.Code, o.Message)
			}
		}
	}
	round()
	first, firstMsgs, firstSeq := mintedSubjects(t, p, m.Iid)
	before := lastSequences(t, p)
	for range 40 {
		round()
	}
	last, lastMsgs, lastSeq := mintedSubjects(t, p, m.Iid)
	// On the embedded broker a fence's commit is a read (its buckets are one copy on a lone
	// server), so renewals of keys on record write nothing anywhere: no synced write at all.
	if after := lastSequences(t, p); !mapsEqual(after, before) {
		t.Errorf("the streams' last sequences moved over 40 rounds of renewals: %v, then %v; want no write", before, after)
	}
	keys := func(ds ...subjects.Duty) []string {
		var out []string
		for _, d := range ds {
			out = append(out, m.Pub(t, d))
		}
		return out
	}
	want := map[string]uint64{
		subjects.MintedSubject(harness.TestSpace, m.Iid, keys(subjects.DutySupervisor, subjects.DutyExecutor)):                          1,
		subjects.MintedSubject(harness.TestSpace, m.Iid, keys(subjects.DutyServe, subjects.DutyGoalWriter, subjects.DutySessionLedger)): 1,
		subjects.MintedSubject(harness.TestSpace, m.Iid, keys(subjects.StandingDuties...)):                                              1,
	}
	if !mapsEqual(last, want) || !mapsEqual(first, want) {
		t.Errorf("the instance's minted subjects: after one round %v, after 41 %v; want one record on each of its three sets %v", first, last, want)
	}
	if lastMsgs != firstMsgs || lastSeq != firstSeq {
		t.Errorf("the minted stream: %d messages up to sequence %d after one round of renewals, %d up to %d after 41; want no write: each set's record stands for its renewals", firstMsgs, firstSeq, lastMsgs, lastSeq)
	}
	standing := subjects.MintedSubject(harness.TestSpace, m.Iid, keys(subjects.DutySupervisor, subjects.DutyExecutor))
	if rec := harness.MintedRecords(t, p, m.Iid)[standing]; rec.Operation != "prepare" {
		t.Errorf("the record of the supervisor and executor is the %s's; want the prepare's, which stands for every renewal of them", rec.Operation)
	}
}

// mintedSubjects counts instance iid's minted messages by subject, and the minted stream's
// messages in all and its last sequence.
func mintedSubjects(t testing.TB, p *harness.TestPlane, iid string) (map[string]uint64, uint64, uint64) {
	t.Helper()
	ctx := harness.CallCtx(t)
	st, err := p.JS(t).Stream(ctx, subjects.MintedStream(harness.TestSpace))
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(subjects.MintedInstanceFilter(harness.TestSpace, iid)))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Subjects, info.State.Msgs, info.State.LastSeq
}

// lastSequences is every stream's last sequence on p's broker, by stream.
func lastSequences(t testing.TB, p *harness.TestPlane) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	streams := p.JS(t).ListStreams(harness.CallCtx(t))
	for info := range streams.Info() {
		out[info.Config.Name] = info.State.LastSeq
	}
	if err := streams.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func mapsEqual(a, b map[string]uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestAnEndRevokesTheKeysOfEveryMintedRecordOfItsInstance: an instance whose mints used the
// key sets {A,B}, {A,C} and {D} (beside its registration's) is ended: the end revokes A, B,
// C and D with its own five keys. The record of {A,C} lands on a subject of its own, so B
// (named only by {A,B}) is not lost to it.
func TestAnEndRevokesTheKeysOfEveryMintedRecordOfItsInstance(t *testing.T) {
	t.Parallel()
	p, pa, s := harness.SupervisedPlane(t, nil, time.Now().Add(time.Hour))
	var k []string
	for range 4 {
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		pub, err := kp.PublicKey()
		if err != nil {
			t.Fatal(err)
		}
		k = append(k, pub)
	}
	a, b, c, d := k[0], k[1], k[2], k[3]
	// The plane's own writer, over the plane account, as the pipeline writes them.
	w := audit.New(harness.TestSpace, store.Appender{JS: p.JS(t)}, slog.New(slog.DiscardHandler), time.Now)
	req := audit.Request{Endpoint: subjects.EndpointSupervisorAuthority, Caller: "p_admin.admin", InstanceID: s.M.Iid}
	for _, set := range [][]string{{a, b}, {a, c}, {d}} {
		creds := make([]audit.Credential, len(set))
		for i, key := range set {
			creds[i] = audit.Credential{Duty: string(subjects.DutySupervisor), NKey: key, Exp: time.Now().Add(time.Hour).Unix()}
		}
		if err := w.Minted(harness.CallCtx(t), s.M.Iid, req, creds, subjects.NewSecret(12)); err != nil {
			t.Fatal(err)
		}
	}
	if got := harness.MintedKeys(t, p, s.M.Iid); !slices.Contains(got, b) {
		t.Fatalf("the instance's minted keys: got %v, want B (%s) still named after {A,C} was recorded", got, b)
	}
	report, err := pa.End(s)
	if err != nil {
		t.Fatalf("end: %v", err)
	}
	want := append(harness.IdentityKeys(t, s.M), a, b, c, d)
	slices.Sort(want)
	if !report.Revoked.Done || !slices.Equal(report.Revoked.NKeys, want) {
		t.Errorf("the end revoked %v (done %t), want the instance's five keys and A, B, C, D: %v", report.Revoked.NKeys, report.Revoked.Done, want)
	}
	if harness.Listed(t, p, s.M.Iid) {
		t.Error("the broker still lists the ended instance's signing key, which signed every one of them")
	}
}

// TestMintedKeysReadsTheUnionFromJetStream: the writer's list of an instance's keys, read from
// a real minted stream (every subject's last message, no consumer), is the union of its
// records' keys, and leaves out another instance's.
func TestMintedKeysReadsTheUnionFromJetStream(t *testing.T) {
	t.Parallel()
	p := harness.StartPlane(t, nil)
	w := audit.New(harness.TestSpace, store.Appender{JS: p.JS(t)}, slog.New(slog.DiscardHandler), time.Now)
	var k []string
	for range 5 {
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		pub, _ := kp.PublicKey()
		k = append(k, pub)
	}
	iid, other := subjects.NewUID(), subjects.NewUID()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, rec := range []struct {
		iid  string
		keys []string
	}{{iid, k[:2]}, {iid, []string{k[0], k[2]}}, {iid, k[3:4]}, {iid, k[:2]}, {other, k[4:]}} {
		creds := make([]audit.Credential, len(rec.keys))
		for j, key := range rec.keys {
			creds[j] = audit.Credential{Duty: "supervisor", NKey: key, Exp: int64(i)}
		}
		if err := w.Minted(ctx, rec.iid, audit.Request{Endpoint: "e", Caller: "c"}, creds, subjects.NewSecret(12)); err != nil {
			t.Fatal(err)
		}
	}
	got, err := w.MintedKeys(ctx, iid)
	want := slices.Sorted(slices.Values(k[:4]))
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("got %v, %v; want %v", got, err, want)
	}
	if bySubject, _, _ := mintedSubjects(t, p, iid); len(bySubject) != 3 || slices.ContainsFunc(slices.Collect(maps.Values(bySubject)), func(n uint64) bool { return n != 1 }) {
		t.Errorf("the instance's records: got %v, want one message on each of 3 subjects (the repeat of {A,B} replaced its record)", bySubject)
	}
}
