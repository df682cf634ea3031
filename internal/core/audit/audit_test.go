package audit

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/testkit"
)

const (
	ownerA = "u_aaaaaaaaaaaaaaaaaaaaaaaaaa"
	ownerB = "u_bbbbbbbbbbbbbbbbbbbbbbbbbb"
)

// clock is a time a test moves by hand.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newWriter() (*Writer, *testkit.Stream, *clock) {
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	out := testkit.NewStream()
	out.Now = c.now
	return New("default", out, slog.New(slog.DiscardHandler), c.now), out, c
}

// bySubject counts the records on each subject prefix of interest.
func records(out *testkit.Stream, decision, owner string) []testkit.Msg {
	var got []testkit.Msg
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
	for i := range DefaultPerMinute + 15 {
		code := fault.BadRequest
		if i%3 == 0 {
			code = fault.PermissionDenied
		}
		w.Refused(ctx, Request{Endpoint: "manager-authority", Caller: ownerA + ".cli"}, fault.New(code, "no"))
	}
	w.Refused(ctx, Request{Endpoint: "manager-authority", Caller: ownerB + ".cli"}, fault.New(fault.BadRequest, "no"))
	if got := len(records(out, Refused, ownerA)); got != DefaultPerMinute {
		t.Fatalf("owner A: got %d full records, want %d", got, DefaultPerMinute)
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
	if got := len(records(out, Refused, ownerA)); got != DefaultPerMinute+1 {
		t.Fatalf("the next minute: got %d full records, want one more", got)
	}
}

func TestAWindowThatRollsOverIsSummarizedByTheNextRefusal(t *testing.T) {
	w, out, c := newWriter()
	ctx := context.Background()
	for range DefaultPerMinute + 1 {
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

// Every decision has its own budget per owner and minute, successes included: past it, the
// owner's records of that decision are counted in one `<decision>-summary` record, by code or
// under the decision's name, and the writer is told of each one counted.
func TestEveryDecisionPastItsOwnersBudgetIsCountedInItsSummary(t *testing.T) {
	refusal := fault.New(fault.Conflict, "moved")
	a := Assignment{Owner: ownerB, State: "assigned", Revision: 1}
	for _, tc := range []struct {
		decision string
		write    func(w *Writer, req Request)
		key      string
	}{
		{Refused, func(w *Writer, req Request) { w.Refused(context.Background(), req, refusal) }, "conflict"},
		{Discarded, func(w *Writer, req Request) { w.Discarded(context.Background(), req, nil, refusal) }, "conflict"},
		{Exchanged, func(w *Writer, req Request) { w.Exchanged(context.Background(), req, Bearer{View: "caller", Exp: 1}) }, Exchanged},
		{Assigned, func(w *Writer, req Request) { w.Assigned(context.Background(), req, a) }, Assigned},
		{Ended, func(w *Writer, req Request) { w.Ended(context.Background(), req, a, "over", nil, nil) }, Ended},
	} {
		t.Run(tc.decision, func(t *testing.T) {
			w, out, c := newWriter()
			w.PerMinute = 5
			counted := map[string]int{}
			w.Summarized = func(d string) { counted[d]++ }
			for range 12 {
				tc.write(w, Request{Endpoint: "e", Caller: ownerA + ".cli"})
			}
			tc.write(w, Request{Endpoint: "e", Caller: ownerB + ".cli"})
			if got := len(records(out, tc.decision, ownerA)); got != 5 {
				t.Fatalf("owner A: got %d full %s records, want its budget of 5", got, tc.decision)
			}
			if got := len(records(out, tc.decision, ownerB)); got != 1 {
				t.Fatalf("owner B: got %d full %s records, want 1: its budget is its own", got, tc.decision)
			}
			if tc.decision != Refused {
				// Another decision of the same owner has its own budget.
				w.Refused(context.Background(), Request{Endpoint: "e", Caller: ownerA + ".other"}, fault.New(fault.BadRequest, "no"))
				if len(records(out, Refused, ownerA)) != 1 {
					t.Fatalf("owner A's refusal after a flood of %s: not written in full, want its own budget", tc.decision)
				}
			}
			if counted[tc.decision] != 7 {
				t.Fatalf("counted: got %v, want 7 %s", counted, tc.decision)
			}
			c.t = c.t.Add(time.Minute)
			w.Flush(context.Background())
			sums := records(out, SummaryOf(tc.decision), ownerA)
			if len(sums) != 1 {
				t.Fatalf("got %d summaries of owner A, want one", len(sums))
			}
			var s Summary
			if err := json.Unmarshal(sums[0].Data, &s); err != nil {
				t.Fatal(err)
			}
			if s.Decision != SummaryOf(tc.decision) || s.Owner != ownerA || len(s.Counts) != 1 || s.Counts[tc.key] != 7 {
				t.Fatalf("got summary %+v, want 7 counted under %q", s, tc.key)
			}
			if len(records(out, SummaryOf(tc.decision), ownerB)) != 0 {
				t.Fatal("owner B, within its budget, got a summary")
			}
		})
	}
}

// A record without a principal (a door's refusal before its caller was known) is charged to
// the one Anonymous owner, whatever it claims: such records cannot mint budgets.
func TestRecordsWithoutAPrincipalShareTheAnonymousBudget(t *testing.T) {
	w, out, c := newWriter()
	w.PerMinute = 3
	for _, caller := range []string{"_._", "_._", "", "not a principal", "u_x.cli"} {
		w.Refused(context.Background(), Request{Endpoint: "exchange", Caller: caller}, fault.New(fault.Unauthenticated, "no"))
	}
	if got := len(records(out, Refused, Anonymous)); got != 3 {
		t.Fatalf("got %d full anonymous records, want the budget of 3", got)
	}
	c.t = c.t.Add(time.Minute)
	w.Flush(context.Background())
	sums := records(out, RefusedSummary, Anonymous)
	var s Summary
	if len(sums) != 1 || json.Unmarshal(sums[0].Data, &s) != nil || s.Owner != Anonymous || s.Counts["unauthenticated"] != 2 {
		t.Fatalf("got %d anonymous summaries (%+v), want one counting 2", len(sums), s)
	}
}

// An end that left keys unrevoked is written in full past its owner's budget (those keys are on
// no other record), and, written, it is not also counted in the minute's summary.
func TestAnEndWithUnrevokedKeysIsWrittenPastTheBudgetAndNotCounted(t *testing.T) {
	w, out, c := newWriter()
	w.PerMinute = 2
	counted := 0
	w.Summarized = func(string) { counted++ }
	a := Assignment{Owner: ownerB, State: "ending", Revision: 1}
	req := Request{Endpoint: "e", Caller: ownerA + ".cli"}
	for range 3 {
		w.Ended(context.Background(), req, a, "over", nil, nil)
	}
	w.Ended(context.Background(), req, a, "over", []string{"UKEY"}, []string{"UKEY"})
	if got := len(records(out, Ended, ownerA)); got != 3 {
		t.Fatalf("got %d full ended records, want the budget of 2 and the end with unrevoked keys", got)
	}
	if counted != 1 {
		t.Fatalf("counted %d ends past the budget, want 1 (the end written in full is not counted)", counted)
	}
	c.t = c.t.Add(time.Minute)
	w.Flush(context.Background())
	var s Summary
	sums := records(out, SummaryOf(Ended), ownerA)
	if len(sums) != 1 || json.Unmarshal(sums[0].Data, &s) != nil || s.Counts[Ended] != 1 {
		t.Fatalf("got %d summaries (%+v), want one counting the 1 end not written", len(sums), s)
	}
}
