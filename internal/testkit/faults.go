package testkit

// Refusals are checked the way docs/PROTOCOL.md bounds them ("Bodies"), for the fuzz targets of
// every package that refuses a caller's input: a *fault.Error of an expected code, whose message
// is short and repeats little of what the caller sent.

import (
	"errors"
	"slices"
	"testing"

	"github.com/cotal-ai/authplane/internal/core/fault"
)

// Slack is what a quoted echo may add around its fault.MaxQuote bytes of a caller's value and
// still match the input verbatim: the quotes and the punctuation beside them (`: "…"`).
const Slack = 8

// Refused checks that err refuses input as docs/PROTOCOL.md requires ("Bodies"), and returns the refusal: it is a
// *fault.Error (found with errors.As), its code is one of codes (bad-request when none is
// given), its message is at most fault.MaxMessage bytes, and it repeats at most
// fault.MaxQuote+Slack consecutive bytes of input.
func Refused(t testing.TB, err error, input []byte, codes ...fault.Code) *fault.Error {
	t.Helper()
	if len(codes) == 0 {
		codes = []fault.Code{fault.BadRequest}
	}
	var f *fault.Error
	if !errors.As(err, &f) || f == nil {
		t.Fatalf("got %.300v (%T), want a *fault.Error", err, err)
	}
	if !slices.Contains(codes, f.Code) {
		t.Fatalf("got code %q (%.300q), want one of %q", f.Code, f.Message, codes)
	}
	if len(f.Message) > fault.MaxMessage {
		t.Fatalf("got a %d-byte message, want at most %d: %.300q", len(f.Message), fault.MaxMessage, f.Message)
	}
	Bounded(t, f.Message, input)
	return f
}

// Bounded checks that msg, a refusal's text, repeats at most fault.MaxQuote+Slack consecutive
// bytes of input.
func Bounded(t testing.TB, msg string, input []byte) {
	t.Helper()
	if run, ok := Echo(msg, input, fault.MaxQuote+Slack); ok {
		t.Fatalf("the message %.300q repeats more than %d consecutive bytes of the input: %.300q", msg, fault.MaxQuote+Slack, run)
	}
}

// Echo reports whether input holds verbatim a run of more than n consecutive bytes of msg, and
// returns the first such run of n+1 bytes. It reads input once, whatever its size.
func Echo(msg string, input []byte, n int) (string, bool) {
	size := n + 1
	if size <= 0 || len(msg) < size || len(input) < size {
		return "", false
	}
	// A Rabin-Karp scan of input for every window of msg of the given size.
	const base = 16777619
	hash := func(b []byte) uint64 {
		var h uint64
		for _, c := range b {
			h = h*base + uint64(c)
		}
		return h
	}
	var drop uint64 = 1 // base^(size-1), to take a byte out of the window
	for range size - 1 {
		drop *= base
	}
	windows := map[uint64][]string{}
	for i := 0; i+size <= len(msg); i++ {
		w := msg[i : i+size]
		h := hash([]byte(w))
		windows[h] = append(windows[h], w)
	}
	h := hash(input[:size])
	for i := 0; ; i++ {
		for _, w := range windows[h] {
			if string(input[i:i+size]) == w {
				return w, true
			}
		}
		if i+size >= len(input) {
			return "", false
		}
		h = (h-uint64(input[i])*drop)*base + uint64(input[i+size])
	}
}
