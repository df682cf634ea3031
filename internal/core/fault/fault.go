// Package fault is the catalogue of refusals: every error the plane answers a caller with
// carries one of its codes, and this package's one table turns a code into its wire forms (the
// NATS service error number and the HTTP status). No other package chooses a status. Bodies
// and stored rows are parsed closed here too (body.go), so a bad one is refused in its words.
package fault

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/internal/core/store"
)

// Code is a stable refusal code of docs/PROTOCOL.md ("Replies and refusals").
type Code string

// The codes.
const (
	BadRequest         Code = "bad-request"
	Unauthenticated    Code = "unauthenticated"
	PermissionDenied   Code = "permission-denied"
	NotFound           Code = "not-found"
	Conflict           Code = "conflict"
	AlreadyExists      Code = "already-exists"
	Expired            Code = "expired"
	FailedPrecondition Code = "failed-precondition"
	ResourceExhausted  Code = "resource-exhausted"
	Internal           Code = "internal"
	Unimplemented      Code = "unimplemented"
	Unavailable        Code = "unavailable"

	// The HTTP face's own guards (docs/PROTOCOL.md, "The HTTP face"), before any body is judged.
	MethodNotAllowed     Code = "method-not-allowed"
	UnsupportedMediaType Code = "unsupported-media-type"
	TooLarge             Code = "payload-too-large"
)

// wire is the one table: each code's `Nats-Service-Error-Code` number and HTTP status.
var wire = map[Code]struct{ numeric, status int }{
	BadRequest:         {400, http.StatusBadRequest},
	Unauthenticated:    {401, http.StatusUnauthorized},
	PermissionDenied:   {403, http.StatusForbidden},
	NotFound:           {404, http.StatusNotFound},
	Conflict:           {409, http.StatusConflict},
	AlreadyExists:      {409, http.StatusConflict},
	Expired:            {410, http.StatusGone},
	FailedPrecondition: {412, http.StatusPreconditionFailed},
	ResourceExhausted:  {429, http.StatusTooManyRequests},
	Internal:           {500, http.StatusInternalServerError},
	Unimplemented:      {501, http.StatusNotImplemented},
	Unavailable:        {503, http.StatusServiceUnavailable},

	MethodNotAllowed:     {405, http.StatusMethodNotAllowed},
	UnsupportedMediaType: {415, http.StatusUnsupportedMediaType},
	TooLarge:             {413, http.StatusRequestEntityTooLarge},
}

// Codes returns every code in the table, sorted.
func Codes() []Code {
	codes := make([]Code, 0, len(wire))
	for c := range wire {
		codes = append(codes, c)
	}
	slices.Sort(codes)
	return codes
}

// Known reports whether c is in the table.
func (c Code) Known() bool {
	_, ok := wire[c]
	return ok
}

// Numeric is c's number in the `Nats-Service-Error-Code` header (500 for a code not in the
// table).
func (c Code) Numeric() int {
	if w, ok := wire[c]; ok {
		return w.numeric
	}
	return 500
}

// HTTPStatus is c's HTTP status (500 for a code not in the table).
func (c Code) HTTPStatus() int {
	if w, ok := wire[c]; ok {
		return w.status
	}
	return http.StatusInternalServerError
}

// Error is a refusal: a code and a message for the caller. Cause, when set, is kept for logs
// and errors.Is, never sent.
type Error struct {
	Code    Code
	Message string
	Cause   error
	// Details, when set, is sent beside code and message (e.g. the current run fence of a
	// conflict).
	Details any
}

// Error returns "<code>: <message>", the form of the Nats-Service-Error header.
func (e *Error) Error() string { return string(e.Code) + ": " + e.Message }

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Cause }

// Echoes are bounded (docs/PROTOCOL.md, "Conventions"): a caller's value is repeated in at most MaxQuote bytes, and
// a whole refusal message is at most MaxMessage bytes, whatever it quotes. A message travels in
// the reply, the `Nats-Service-Error` header, micro's last_error, a log line and a record.
const (
	MaxQuote   = 64
	MaxMessage = 256
)

// Clip returns s cut to at most n bytes at a UTF-8 boundary, ending in "…" when it was cut.
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const ellipsis = "…"
	cut := max(n-len(ellipsis), 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}

// Sparse reports whether the nth of a run of like events is logged: the 1st, 2nd, 4th, 8th…, so
// that no caller can flood the log with them (as Clip bounds what one line repeats), and the
// count each line carries says how many there were.
func Sparse[N ~int | ~int64 | ~uint64](n N) bool { return n > 0 && n&(n-1) == 0 }

// Quote returns a value a caller sent, as a refusal may repeat it: Go-quoted, at most MaxQuote
// bytes of it.
func Quote(s string) string { return strconv.Quote(Clip(s, MaxQuote)) }

// New returns a refusal with a formatted message.
func New(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: Clip(fmt.Sprintf(format, args...), MaxMessage)}
}

// Wrap returns a refusal that keeps cause for logs.
func Wrap(code Code, cause error, format string, args ...any) *Error {
	return &Error{Code: code, Message: Clip(fmt.Sprintf(format, args...), MaxMessage), Cause: cause}
}

// Field returns a bad-request refusal naming the offending body field.
func Field(field, format string, args ...any) *Error {
	return New(BadRequest, "field %s: %s", field, fmt.Sprintf(format, args...))
}

// As returns err as a refusal. An error that is not one becomes `internal`, with the error
// kept as its cause and a message that reveals nothing.
func As(err error) *Error {
	var e *Error
	if errors.As(err, &e) && e != nil {
		return e
	}
	return &Error{Code: Internal, Message: "internal error", Cause: err}
}

// CodeOf returns the code err would be answered with.
func CodeOf(err error) Code { return As(err).Code }

// Store turns a failure of the stores (a fence, a bucket, a record stream) during what (a
// formatted phrase: "committing the mint on gate epgate.manager.x") into the refusal a caller
// can act on. A refusal passes through unchanged, except one a stored row's parse made (a row
// decoded as a body is refused bad-request, naming its field): a row that does not parse is the
// plane's fault, never the caller's. The code follows the storage error:
//
//	fence.ErrMoved          conflict            a fence writer landed first
//	fence.ErrGone           failed-precondition a delete marker is final
//	store.ErrFull           resource-exhausted  the stream is at its size limit
//	fence.ErrMalformed      internal            a stored row that does not parse
//	anything else           unavailable         a timeout, a leader change, the deadline
func Store(err error, what string, args ...any) *Error {
	var e *Error
	if errors.As(err, &e) && (e.Code == Internal || !errors.Is(err, fence.ErrMalformed)) {
		return e
	}
	what = fmt.Sprintf(what, args...)
	switch {
	case errors.Is(err, fence.ErrMoved):
		return Wrap(Conflict, err, "%s: it moved first (a fence writer landed); nothing was issued", what)
	case errors.Is(err, fence.ErrGone):
		return Wrap(FailedPrecondition, err, "%s: it holds a delete marker; the plane never deletes a fence", what)
	case errors.Is(err, store.ErrFull):
		return Wrap(ResourceExhausted, err, "%s: the store is full", what)
	case errors.Is(err, fence.ErrMalformed):
		return Wrap(Internal, err, "%s: a stored row is malformed", what)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return Wrap(Unavailable, err, "%s: the request's deadline passed; retry shortly", what)
	}
	return Wrap(Unavailable, err, "%s failed; retry shortly", what)
}
