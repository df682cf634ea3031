package fault

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/internal/core/store"
)

func TestEveryCodeHasOneNumberAndOneStatus(t *testing.T) {
	want := map[Code][2]int{
		BadRequest: {400, 400}, Unauthenticated: {401, 401}, PermissionDenied: {403, 403}, NotFound: {404, 404},
		Conflict: {409, 409}, AlreadyExists: {409, 409}, Expired: {410, 410}, FailedPrecondition: {412, 412},
		ResourceExhausted: {429, 429}, Internal: {500, 500}, Unimplemented: {501, 501}, Unavailable: {503, 503},
		MethodNotAllowed: {405, 405}, UnsupportedMediaType: {415, 415}, TooLarge: {413, 413},
	}
	for code, w := range want {
		if !code.Known() || code.Numeric() != w[0] || code.HTTPStatus() != w[1] {
			t.Errorf("%s: got known %v numeric %d status %d, want %d %d", code, code.Known(), code.Numeric(), code.HTTPStatus(), w[0], w[1])
		}
	}
	if len(wire) != len(want) {
		t.Errorf("the table has %d codes, want %d", len(wire), len(want))
	}
	if Code("made-up").Known() || Code("made-up").Numeric() != 500 || Code("made-up").HTTPStatus() != 500 {
		t.Error("a code outside the table must answer as internal")
	}
}

func TestStoreChoosesTheCodeFromTheStorageError(t *testing.T) {
	for _, c := range []struct {
		err  error
		want Code
	}{
		{fmt.Errorf("commit k: %w", fence.ErrMoved), Conflict},
		{fmt.Errorf("read k: %w", fence.ErrGone), FailedPrecondition},
		{fmt.Errorf("append: %w", store.ErrFull), ResourceExhausted},
		{fmt.Errorf("%w: k", fence.ErrMalformed), Internal},
		{fmt.Errorf("%w: k: %w", fence.ErrMalformed, Field("extra", "unknown field")), Internal}, // the row's parse, not the caller's body
		{fmt.Errorf("write k: %w", fence.ErrUnknownOutcome), Unavailable},
		{fmt.Errorf("write k: %w", context.DeadlineExceeded), Unavailable},
		{errors.New("nats: connection closed"), Unavailable},
		{New(PermissionDenied, "not yours"), PermissionDenied},
	} {
		got := Store(c.err, "committing on %s", "k")
		if got.Code != c.want {
			t.Errorf("%v: got %s (%s), want %s", c.err, got.Code, got.Message, c.want)
		}
		if c.want != PermissionDenied && !errors.Is(got, c.err) {
			t.Errorf("%v: the cause is not kept", c.err)
		}
	}
}

func TestEchoesAreBounded(t *testing.T) {
	huge := strings.Repeat("<", 60000)
	if q := Quote(huge); len(q) > MaxQuote+8 || !strings.HasSuffix(q, `…"`) {
		t.Errorf("Quote of 60,000 bytes: got %d bytes %q…, want at most %d of them, elided", len(q), q[:20], MaxQuote)
	}
	if q := Quote("kind"); q != `"kind"` {
		t.Errorf("Quote of a short value: got %s, want it whole", q)
	}
	// A cut never splits a character.
	for n := 0; n < 12; n++ {
		if c := Clip(strings.Repeat("é", 10), n); !utf8.ValidString(c) || len(c) > max(n, len("…")) {
			t.Errorf("Clip(é×10, %d): got %q (%d bytes)", n, c, len(c))
		}
	}
	for _, e := range []*Error{
		New(BadRequest, "field %s: unknown", huge),
		Wrap(Unavailable, nil, "%s", huge),
		Field(huge, "want %s", huge),
	} {
		if len(e.Message) > MaxMessage {
			t.Errorf("got a %d-byte message, want at most %d", len(e.Message), MaxMessage)
		}
	}
}

func TestSparseLogsThePowersOfTwo(t *testing.T) {
	var got []int
	for n := -1; n <= 64; n++ {
		if Sparse(n) {
			got = append(got, n)
		}
	}
	want := []int{1, 2, 4, 8, 16, 32, 64}
	if len(got) != len(want) {
		t.Fatalf("logged %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("logged %v, want %v", got, want)
		}
	}
	if !Sparse(uint64(1)<<63) || Sparse(uint64(0)) {
		t.Fatal("Sparse on uint64: want 2^63 logged and 0 not")
	}
}
