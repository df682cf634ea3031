package client

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"
)

// FuzzDecode checks Decode on any answer: one with no error code is its data as it came; one
// with a code is a *Refusal carrying that number and the code and message of its body, or an
// error that is no refusal when the body or the number does not read.
func FuzzDecode(f *testing.F) {
	// What the plane answers (handlers.respondError), and what it never does.
	for _, c := range []struct{ code, data string }{
		{"", `{"v":1,"kind":"manager-service-authority"}`},
		{"400", `{"error":{"code":"bad-request","message":"field v: want 1"}}`},
		{"409", `{"error":{"code":"conflict","message":"attempt epoch…","details":{"epoch":1,"fencingToken":1,"holder":"U.t"}}}`},
		{"503", `{"error":{"code":"unavailable","message":"retry shortly"}}`},
		{"400", `not json`}, {"x", `{"error":{"code":"bad-request","message":"m"}}`}, {"400", ``}, {"400", `null`},
		{"400", `{"error":null}`}, {"400", `{"error":{"code":1}}`}, {"99999999999999999999", `{}`},
	} {
		f.Add(c.code, []byte(c.data))
	}
	f.Fuzz(func(t *testing.T, code string, data []byte) {
		msg := &nats.Msg{Data: data, Header: nats.Header{}}
		if code != "" {
			msg.Header.Set("Nats-Service-Error-Code", code)
		}
		got, err := Decode(msg)
		if msg.Header.Get("Nats-Service-Error-Code") == "" {
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("an answer with no code: got %q, %v; want its data", got, err)
			}
			return
		}
		if got != nil || err == nil {
			t.Fatalf("an answer with code %q: got data %q, %v; want a refusal", code, got, err)
		}
		var r *Refusal
		var e struct {
			Error struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		n, nerr := strconv.Atoi(msg.Header.Get("Nats-Service-Error-Code"))
		jerr := json.Unmarshal(data, &e)
		if isRefusal := errors.As(err, &r); isRefusal != (nerr == nil && jerr == nil) {
			t.Fatalf("code %q, body %.200q: got %v, refusal %v; want a refusal exactly when both read", code, data, err, isRefusal)
		}
		if r != nil && (r.Numeric != n || r.Code != e.Error.Code || r.Message != e.Error.Message || CodeOf(err) != r.Code) {
			t.Fatalf("code %q, body %.200q: got %+v", code, data, r)
		}
	})
}
