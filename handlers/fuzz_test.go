package handlers

import (
	"context"
	"encoding/json"
	"log/slog"
	"reflect"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/internal/core/audit"
	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/internal/testkit"
)

// noRecords drops the records of refusals: a fuzz target makes millions.
type noRecords struct{}

func (noRecords) Refused(context.Context, audit.Request, *fault.Error) {}

// fuzzFace is a face whose space trusts no IdP and whose ledger is empty: every door refuses,
// a body that decodes at the first step past its parse.
func fuzzFace(public bool) *face {
	h := &HTTP{Space: "default", Guard: &Guard{Limiter: issue.NewBuckets(0, 0, nil), Audit: noRecords{}}, Timeout: 2 * time.Second,
		Ledger: testkit.NewKV(), Log: slog.New(slog.DiscardHandler), Now: time.Now}
	return &face{h: h, public: public, refusals: newWindows()}
}

// FuzzHTTPBodies checks the HTTP doors' bodies on any bytes: `POST /exchange` (exchangeBody)
// on the loopback and the public face, and `POST /manager-service-authority` (msaBody and its
// request's actor). A refusal of a body is a bounded bad-request; any other refusal comes only
// for a body that decodes (no IdP, no agent row, an elevated view on the public face). A body
// that decodes reads the same again from what a client sending its members would send.
func FuzzHTTPBodies(f *testing.F) {
	token := "eyJhbGciOiJFZERTQSJ9.e30.c2ln"
	for _, b := range []any{
		// The exchanges of the integration suite.
		map[string]any{"idpToken": token, "actor": "cli", "ttlSec": 3},
		map[string]any{"idpToken": token, "actor": "cli"},
		map[string]any{"idpToken": token, "actor": "ops", "view": "ops"},
		map[string]any{"owner": owner, "actor": "worker", "actorToken": "secret"},
		map[string]any{"owner": owner, "actor": "worker", "actorToken": "secret", "ttlSec": 60},
		map[string]any{"idpToken": token, "actorToken": "secret"},
		map[string]any{"owner": owner, "actor": "worker", "actorToken": "secret", "view": "ops"},
		map[string]any{"idpToken": token, "actor": "cli", "view": "root"},
		map[string]any{"idpToken": token},
		map[string]any{"owner": "x", "actor": "a.b", "actorToken": "secret"},
		// Manager-service authority.
		map[string]any{"idpToken": token, "request": map[string]any{"kind": "manager-service-authority", "actor": "cli"}},
		map[string]any{"idpToken": token, "request": map[string]any{"actor": "a.b"}},
		map[string]any{"idpToken": token, "request": []any{1}},
		map[string]any{"request": map[string]any{"actor": "cli"}},
	} {
		data, err := json.Marshal(b)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(uint8(0), data)
		f.Add(uint8(2), data)
	}
	for _, s := range []string{``, `null`, `[]`, `{`, `{"idpToken":null,"actor":"cli"}`, `{"idpToken":1}`, `{"IdpToken":"x"}`,
		`{"idpToken":"x","idpToken":"y"}`, `{"ttlSec":1.5}`, `{"ttlSec":99999999999999999999}`, "{\"actor\":\"\xff\"}"} {
		f.Add(uint8(0), []byte(s))
		f.Add(uint8(2), []byte(s))
	}
	loopback, public := fuzzFace(false), fuzzFace(true)
	f.Fuzz(func(t *testing.T, which uint8, data []byte) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		switch which % 3 {
		case 0, 1:
			face := loopback
			if which%3 == 1 {
				face = public
			}
			reply, refusal := face.exchange(ctx, "peer", data)
			if refusal == nil {
				t.Fatalf("an exchange with no IdP and no ledger row answered %+v", reply)
			}
			var b exchangeBody
			decoded := fault.Decode(data, &b) == nil
			r := testkit.Refused(t, refusal, data, fault.BadRequest, fault.PermissionDenied, fault.Unimplemented, fault.Unauthenticated)
			if r.Code != fault.BadRequest && !decoded {
				t.Fatalf("refused %s a body that does not decode: %v", r.Code, r)
			}
			if decoded {
				checkRoundTrip(t, &b, new(exchangeBody))
			}
		case 2:
			reply, refusal := loopback.managerAuthority(ctx, "peer", data)
			if refusal == nil {
				t.Fatalf("manager-service authority with no IdP answered %+v", reply)
			}
			var b msaBody
			decoded := fault.Decode(data, &b) == nil
			r := testkit.Refused(t, refusal, data, fault.BadRequest, fault.Unimplemented)
			if r.Code == fault.BadRequest {
				return
			}
			if !decoded || b.IdPToken == nil || b.Request == nil {
				t.Fatalf("refused %s a body that does not decode: %v", r.Code, r)
			}
			if _, err := fault.Peek(b.Request, "actor"); err != nil {
				t.Fatalf("refused %s a body whose request has no actor: %v", r.Code, r)
			}
			checkRoundTrip(t, &b, new(msaBody))
		}
	})
}

// checkRoundTrip checks that v, decoded from a body, decodes the same from what a client
// sending only its present members would send.
func checkRoundTrip[T any](t *testing.T, v *T, again *T) {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(data, &members); err != nil {
		t.Fatal(err)
	}
	for k, m := range members {
		if string(m) == "null" {
			delete(members, k)
		}
	}
	if data, err = json.Marshal(members); err != nil {
		t.Fatal(err)
	}
	if err := fault.Decode(data, again); err != nil {
		t.Fatalf("%s, as a client would send it, is refused: %v", fault.Clip(string(data), 200), err)
	}
	// A raw member is compacted on the way: compare what each says, not its spacing.
	first, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	second, err := json.Marshal(again)
	if err != nil {
		t.Fatal(err)
	}
	var a, b any
	if json.Unmarshal(first, &a) != nil || json.Unmarshal(second, &b) != nil || !reflect.DeepEqual(a, b) {
		t.Fatalf("round trip: got %s, want %s", fault.Clip(string(second), 200), fault.Clip(string(first), 200))
	}
}
