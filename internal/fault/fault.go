// Package fault is the catalogue of refusals: every error the plane answers a caller with
// carries one of its codes, and handlers turn it into a wire error in one place.
package fault

import (
	"errors"
	"fmt"
)

// Code is a stable refusal code from DESIGN §5.
type Code string

// The codes. Their numeric forms are the handlers' business.
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
)

// Error is a refusal: a code and a message for the caller. Cause, when set, is kept for logs
// and errors.Is, never sent.
type Error struct {
	Code    Code
	Message string
	Cause   error
	// Details, when set, is sent beside code and message (e.g. the current run fence of a
	// conflict).
	Details any
	// Recorded means the decision was already recorded (e.g. as `discarded`); whoever answers
	// the caller must not record it again as `refused`.
	Recorded bool
}

// Error returns "<code>: <message>", the form of the Nats-Service-Error header.
func (e *Error) Error() string { return string(e.Code) + ": " + e.Message }

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Cause }

// Is matches any *Error with the same code, so errors.Is(err, fault.New(fault.Conflict, ""))
// works; prefer CodeOf.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code && t.Message == ""
}

// New returns a refusal with a formatted message.
func New(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Wrap returns a refusal that keeps cause for logs.
func Wrap(code Code, cause error, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...), Cause: cause}
}

// Field returns a bad-request refusal naming the offending body field.
func Field(field, format string, args ...any) *Error {
	return &Error{Code: BadRequest, Message: "field " + field + ": " + fmt.Sprintf(format, args...)}
}

// As returns err as a refusal. An error that is not one becomes `internal`, with the error
// kept as its cause and a message that reveals nothing.
func As(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return &Error{Code: Internal, Message: "internal error", Cause: err}
}

// CodeOf returns the code err would be answered with.
func CodeOf(err error) Code { return As(err).Code }
