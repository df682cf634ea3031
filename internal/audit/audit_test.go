package audit

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/internal/fault"
	"github.com/cotal-ai/authplane/internal/store/storetest"
)

const (
	ownerA = "u_aaaaaaaaaaaaaaaaaaaaaaaaaa"
	ownerB = "u_bbbbbbbbbbbbbbbbbbbbbbbbbb"
)

// clock is a time a test moves by hand.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newWriter() (*Writer, *storetest.Stream, *clock) {
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	out := storetest.NewStream()
	return New("default", out, slog.New(slog.DiscardHandler), c.now), out, c
}

// bySubject counts the records on each subject prefix of interest.
func records(out *storetest.Stream, decision, owner string) []storetest.Msg {
	var got []storetest.Msg
	for _, m := range out.Msgs() {
		if strings.HasPrefix(m.Subject, "cotal.default.audit."+decision+"."+owner+".") {
			got = append(got, m)
		}
	}
	return got
}

func TestAnOwnersRefusalsPastItsBudgetAreCountedInOneSummaryAMinute(t *testing.T) {
	w, out, c := newWriter()
	ctx := context.Background()
	for i := range RefusedPerMinute + 15 {
		code := fault.BadRequest
		if i%3 == 0 {
			code = fault.PermissionDenied
		}
		w.Refused(ctx, Request{Endpoint: "manager-authority", Caller: ownerA + ".cli"}, fault.New(code, "no"))
	}
	w.Refused(ctx, Request{Endpoint: "manager-authority", Caller: ownerB + ".cli"}, fault.New(fault.BadRequest, "no"))
	if got := len(records(out, Refused, ownerA)); got != RefusedPerMinute {
		t.Fatalf("owner A: got %d full records, want %d", got, RefusedPerMinute)
	}
	if got := len(records(out, Refused, ownerB)); got != 1 {
		t.Fatalf("owner B: got %d full records, want its own budget untouched", got)
	}
	w.Flush(ctx)
	if got := len(records(out, RefusedSummary, ownerA)); got != 0 {
		t.Fatalf("within the minute: got %d summaries, want none yet", got)
	}
	c.t = c.t.Add(time.Minute)
	w.Flush(ctx)
	sums := records(out, RefusedSummary, ownerA)
	if len(sums) != 1 {
		t.Fatalf("after the minute: got %d summaries, want one", len(sums))
	}
	var s Summary
	if err := json.Unmarshal(sums[0].Data, &s); err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, n := range s.Counts {
		total += n
	}
	if s.Owner != ownerA || total != 15 || s.Counts["bad-request"] == 0 || s.Counts["permission-denied"] == 0 {
		t.Fatalf("got summary %+v, want owner A's 15 refusals past the budget counted by code", s)
	}
	if len(records(out, RefusedSummary, ownerB)) != 0 {
		t.Fatal("owner B, within its budget, got a summary")
	}
	// A new minute: a new budget, and the old window is forgotten.
	w.Refused(ctx, Request{Endpoint: "manager-authority", Caller: ownerA + ".cli"}, fault.New(fault.BadRequest, "no"))
	if got := len(records(out, Refused, ownerA)); got != RefusedPerMinute+1 {
		t.Fatalf("the next minute: got %d full records, want one more", got)
	}
}

func TestAWindowThatRollsOverIsSummarizedByTheNextRefusal(t *testing.T) {
	w, out, c := newWriter()
	ctx := context.Background()
	for range RefusedPerMinute + 1 {
		w.Refused(ctx, Request{Caller: ownerA + ".cli"}, fault.New(fault.BadRequest, "no"))
	}
	c.t = c.t.Add(2 * time.Minute)
	w.Refused(ctx, Request{Caller: ownerA + ".cli"}, fault.New(fault.BadRequest, "no"))
	if got := len(records(out, RefusedSummary, ownerA)); got != 1 {
		t.Fatalf("got %d summaries, want the ended window's", got)
	}
}

func TestARefusedRecordIsAtMostOneKiB(t *testing.T) {
	w, out, _ := newWriter()
	// Control characters escape to six bytes each in JSON: a full-length message of them.
	msg := strings.Repeat("\x01", fault.MaxMessage)
	w.Refused(context.Background(), Request{Endpoint: "manager-authority", Caller: ownerA + ".cli",
		Kind: "manager-service-authority", Operation: "renewStandingBundle", InstanceID: strings.Repeat("i", 32),
		RequestID: strings.Repeat("r", 64), RunID: "run-" + strings.Repeat("0", 32)}, &fault.Error{Code: fault.BadRequest, Message: msg})
	got := records(out, Refused, ownerA)
	if len(got) != 1 || len(got[0].Data) > MaxRefusedRecord {
		t.Fatalf("got %d records, the first %d bytes; want one of at most %d", len(got), len(got[0].Data), MaxRefusedRecord)
	}
	// And a `<` stays one byte.
	w.Refused(context.Background(), Request{Caller: ownerA + ".cli"}, fault.New(fault.BadRequest, "%s", strings.Repeat("<", 100)))
	last := records(out, Refused, ownerA)[1]
	if strings.Contains(string(last.Data), `\u003c`) {
		t.Fatalf("got %s, want < written as itself", last.Data)
	}
}
