package audit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/store"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/subjects"
)

const (
	iidA = "aaaaaaaaaaaaaaaaaaaaaaaaaa"
	iidB = "bbbbbbbbbbbbbbbbbbbbbbbbbb"
)

// userKeys returns n fresh public user nkeys.
func userKeys(t *testing.T, n int) []string {
	t.Helper()
	out := make([]string, n)
	for i := range out {
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		if out[i], err = kp.PublicKey(); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// creds is a supervisor credential for each key.
func creds(keys ...string) []Credential {
	out := make([]Credential, len(keys))
	for i, k := range keys {
		out[i] = Credential{Duty: "supervisor", NKey: k, Exp: 1_800_003_600}
	}
	return out
}

// TestAMintIsOneClosedRecordOnItsSetOfKeys: a mint of two credentials writes one record, on
// the subject of its keys under its instance, under the mint's message id; it decodes closed
// (the end's reading) and names both credentials and the request.
func TestAMintIsOneClosedRecordOnItsSetOfKeys(t *testing.T) {
	w, out, _ := newWriter()
	keys := userKeys(t, 2)
	req := Request{Endpoint: "manager-authority", Caller: ownerA + ".cli", Operation: "renew", InstanceID: iidA, RequestID: "rrrrrrrrrrrrrrrrrrrrrrrr"}
	if err := w.Minted(context.Background(), iidA, req, creds(keys...), "mint-1"); err != nil {
		t.Fatal(err)
	}
	msgs := out.Msgs()
	if len(msgs) != 1 || msgs[0].Subject != subjects.MintedSubject("default", iidA, []string{keys[1], keys[0]}) || msgs[0].ID != "mint-1" {
		t.Fatalf("got %d records (the first on %s), want one on the subject of the two keys, message id mint-1", len(msgs), msgs[0].Subject)
	}
	var rec Minted
	if err := fault.DecodeRow(msgs[0].Data, &rec, MaxMintedRecord); err != nil {
		t.Fatal(err)
	}
	if rec.V != 1 || rec.Request != req || !slices.Equal(rec.Credentials, creds(keys...)) || rec.At != 1_800_000_000_000 {
		t.Errorf("got record %+v, want the request and both credentials", rec)
	}
}

// TestAnEndTakesTheUnionOfAnInstancesRecords: mints of {A,B}, {A,C} and {D} on one instance,
// and {A,B} again: the instance's keys are A, B, C and D (the record of {A,C} did not replace
// that of {A,B}, or B would never be revoked), and another instance's record adds nothing.
func TestAnEndTakesTheUnionOfAnInstancesRecords(t *testing.T) {
	w, out, _ := newWriter()
	k := userKeys(t, 5)
	a, b, c, d, e := k[0], k[1], k[2], k[3], k[4]
	ctx := context.Background()
	want := slices.Sorted(slices.Values([]string{a, b, c, d}))
	for i, set := range [][]string{{a, b}, {a, c}, {d}, {b, a}} {
		if err := w.Minted(ctx, iidA, Request{Endpoint: "manager-authority"}, creds(set...), string(rune('a'+i))); err != nil {
			t.Fatal(err)
		}
		if i != 2 {
			continue
		}
		if got, err := w.MintedKeys(ctx, iidA); err != nil || !slices.Equal(got, want) {
			t.Fatalf("instance A's keys after {A,B}, {A,C}, {D}: got %v, %v; want %v", got, err, want)
		}
	}
	if err := w.Minted(ctx, iidB, Request{Endpoint: "manager-authority"}, creds(e), "other"); err != nil {
		t.Fatal(err)
	}
	subjectsOfA := map[string]bool{}
	for _, m := range out.Msgs() {
		if strings.HasPrefix(m.Subject, "cotal.default.minted."+iidA+".") {
			subjectsOfA[m.Subject] = true
		}
	}
	if len(subjectsOfA) != 3 {
		t.Errorf("instance A's records: got subjects %v, want three: one for each set of keys", subjectsOfA)
	}
	if got, err := w.MintedKeys(ctx, iidA); err != nil || !slices.Equal(got, want) {
		t.Fatalf("instance A's keys after {A,B} again: got %v, %v; want %v", got, err, want)
	}
	if got, err := w.MintedKeys(ctx, iidB); err != nil || !slices.Equal(got, []string{e}) {
		t.Fatalf("instance B's keys: got %v, %v; want [%s]", got, err, e)
	}
}

// TestAMintedRecordThatDoesNotDecodeFailsTheList: an end does not report done on a list that
// misses a record's keys: a record that is not closed JSON, or names a key that is no user
// nkey, makes the list an error naming its subject.
func TestAMintedRecordThatDoesNotDecodeFailsTheList(t *testing.T) {
	for name, data := range map[string]string{
		"not JSON":        `{"v":1,`,
		"an unknown key":  `{"v":1,"endpoint":"e","caller":"c","credentials":[],"at":1,"nkeys":["U"]}`,
		"a key no nkey":   `{"v":1,"endpoint":"e","caller":"c","credentials":[{"duty":"d","nkey":"UBAD","exp":1}],"at":1}`,
		"over its bound":  `{"v":1,"endpoint":"` + strings.Repeat("e", MaxMintedRecord) + `","caller":"c","credentials":[],"at":1}`,
		"a duplicate key": `{"v":1,"v":1,"endpoint":"e","caller":"c","credentials":[],"at":1}`,
	} {
		t.Run(name, func(t *testing.T) {
			w, out, _ := newWriter()
			if err := w.Minted(context.Background(), iidA, Request{Endpoint: "e"}, creds(userKeys(t, 1)...), "good"); err != nil {
				t.Fatal(err)
			}
			subject := "cotal.default.minted." + iidA + ".bad"
			if err := out.Append(context.Background(), subject, []byte(data), ""); err != nil {
				t.Fatal(err)
			}
			if got, err := w.MintedKeys(context.Background(), iidA); err == nil || !strings.Contains(err.Error(), subject) {
				t.Fatalf("got %v, %v; want an error naming %s", got, err, subject)
			}
		})
	}
}

// TestAMintedRecordOverItsBoundIsNotWritten: a record larger than MaxMintedRecord is not
// written, and its mint gets an error (so it does not commit).
func TestAMintedRecordOverItsBoundIsNotWritten(t *testing.T) {
	w, out, _ := newWriter()
	err := w.Minted(context.Background(), iidA, Request{Endpoint: "e"}, creds(userKeys(t, 50)...), "big")
	if err == nil || len(out.Msgs()) != 0 {
		t.Fatalf("a record of 50 credentials: got %v with %d records written, want an error and none", err, len(out.Msgs()))
	}
}

// TestAFullMintedStreamIsAnError: a full stream (discard new) is the mint's error, as
// store.ErrFull, so the mint is refused resource-exhausted.
func TestAFullMintedStreamIsAnError(t *testing.T) {
	w, out, _ := newWriter()
	out.Fault = func(subject string) (error, bool) { return store.ErrFull, false }
	err := w.Minted(context.Background(), iidA, Request{Endpoint: "e"}, creds(userKeys(t, 2)...), "full")
	if !errors.Is(err, store.ErrFull) || len(out.Msgs()) != 0 {
		t.Fatalf("got %v with %d records, want store.ErrFull and none", err, len(out.Msgs()))
	}
}

// TestARenewalOfTheSameKeysWritesNoRecordWhileOneStandsForIt: a mint of the duties and keys
// the last record on its subject names, every expiry within the record's stay in the stream
// less RecordMargin, writes nothing (the record stands for it); a mint past that stay, of
// another duty, of a subset of the keys or over a record that does not decode writes its own.
// Each is asked of a writer that remembers nothing, so each reads the record.
func TestARenewalOfTheSameKeysWritesNoRecordWhileOneStandsForIt(t *testing.T) {
	_, out, c := newWriter()
	ctx := context.Background()
	keys := userKeys(t, 2)
	at := func(exp time.Time, duty string, keys ...string) []Credential {
		out := creds(keys...)
		for i := range out {
			out[i].Exp, out[i].Duty = exp.Unix(), duty
		}
		return out
	}
	stays := c.t.Add(store.MintedMaxAge - RecordMargin)
	for i, step := range []struct {
		what  string
		creds []Credential
		write bool
	}{
		{"the first mint", at(c.t.Add(time.Hour), "supervisor", keys...), true},
		{"a renewal of the same keys", at(c.t.Add(24*time.Hour), "supervisor", keys[1], keys[0]), false},
		{"a renewal that ends just inside the record's stay", at(stays.Add(-time.Second), "supervisor", keys...), false},
		{"a renewal that ends past the record's stay", at(stays.Add(time.Second), "supervisor", keys...), true},
		{"the same keys for another duty", at(c.t.Add(time.Hour), "goalWriter", keys...), true},
		{"one of the keys alone", at(c.t.Add(time.Hour), "goalWriter", keys[0]), true},
	} {
		before := len(out.Msgs())
		fresh := New("default", out, slog.New(slog.DiscardHandler), c.now)
		if err := fresh.Minted(ctx, iidA, Request{Endpoint: "manager-authority"}, step.creds, fmt.Sprint("mint-", i)); err != nil {
			t.Fatal(err)
		}
		if wrote := len(out.Msgs()) > before; wrote != step.write {
			t.Errorf("%s: wrote a record %v, want %v", step.what, wrote, step.write)
		}
	}

	// A record that does not decode stands for nothing.
	bad := subjects.MintedSubject("default", iidB, keys)
	if err := out.Append(ctx, bad, []byte(`{"v":1,"credentials":"no"}`), ""); err != nil {
		t.Fatal(err)
	}
	w := New("default", out, slog.New(slog.DiscardHandler), c.now)
	if err := w.Minted(ctx, iidB, Request{Endpoint: "manager-authority"}, at(c.t.Add(time.Hour), "supervisor", keys...), "mint-bad"); err != nil {
		t.Fatal(err)
	}
	if m := out.Msgs(); m[len(m)-1].Subject != bad || m[len(m)-1].ID != "mint-bad" {
		t.Errorf("a mint over a record that does not decode wrote no record of its own (last %s %q)", m[len(m)-1].Subject, m[len(m)-1].ID)
	}
}

// forgetful is a minted stream whose reads find nothing once lost: a stream replaced under
// the writer. It counts its reads.
type forgetful struct {
	*testkit.Stream
	lost  bool
	reads int
}

func (f *forgetful) LastOn(ctx context.Context, stream, subject string) (store.Record, bool, error) {
	f.reads++
	if f.lost {
		return store.Record{}, false, nil
	}
	return f.Stream.LastOn(ctx, stream, subject)
}

// TestAWriterReadsARecordItSawAgainOnlyPastRecheckAfter: a renewal within RecheckAfter of the
// write neither reads nor writes; past it, one read finds the record standing and writes
// nothing; a record lost meanwhile is written again by the first renewal past RecheckAfter.
func TestAWriterReadsARecordItSawAgainOnlyPastRecheckAfter(t *testing.T) {
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	out := &forgetful{Stream: testkit.NewStream()}
	out.Now = c.now
	w := New("default", out, slog.New(slog.DiscardHandler), c.now)
	keys := userKeys(t, 2)
	renew := func(what string, wantReads, wantRecords int) {
		t.Helper()
		cr := creds(keys...)
		for i := range cr {
			cr[i].Exp = c.t.Add(time.Hour).Unix()
		}
		out.reads = 0
		if err := w.Minted(context.Background(), iidA, Request{Endpoint: "manager-authority"}, cr, fmt.Sprint(what, c.t.Unix())); err != nil {
			t.Fatal(err)
		}
		if got := len(out.Msgs()); out.reads != wantReads || got != wantRecords {
			t.Errorf("%s: %d reads and %d records; want %d and %d", what, out.reads, got, wantReads, wantRecords)
		}
	}
	renew("the first mint", 1, 1)
	c.t = c.t.Add(RecheckAfter - time.Second)
	renew("a renewal within RecheckAfter", 0, 1)
	c.t = c.t.Add(2 * time.Second)
	renew("a renewal past RecheckAfter", 1, 1)
	out.lost = true
	c.t = c.t.Add(RecheckAfter - time.Second)
	renew("a renewal after the loss, within RecheckAfter of the read", 0, 1)
	c.t = c.t.Add(2 * time.Second)
	renew("a renewal after the loss, past RecheckAfter", 1, 2)
}

// TestAMintForNoInstanceAlwaysWritesAndReadsNothing: the auth callout's and a creds file's
// mints (iid "") have a fresh key each time, so the writer neither reads nor remembers their
// records: the same keys minted twice are written twice.
func TestAMintForNoInstanceAlwaysWritesAndReadsNothing(t *testing.T) {
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	out := &forgetful{Stream: testkit.NewStream()}
	out.Now = c.now
	w := New("default", out, slog.New(slog.DiscardHandler), c.now)
	cr := creds(userKeys(t, 1)...)
	cr[0].Exp = c.t.Add(time.Hour).Unix()
	for i := range 2 {
		if err := w.Minted(context.Background(), "", Request{Endpoint: "auth-callout"}, cr, fmt.Sprint("callout-", i)); err != nil {
			t.Fatal(err)
		}
	}
	if got := len(out.Msgs()); out.reads != 0 || got != 2 {
		t.Errorf("two mints for no instance: %d reads and %d records; want 0 and 2", out.reads, got)
	}
}
