package handlers

import (
	"encoding/json"
	"strconv"

	"github.com/nats-io/nats.go/micro"

	"github.com/cotal-ai/authplane/internal/fault"
)

// numeric is the one table from refusal codes to the numbers in `Nats-Service-Error-Code`.
var numeric = map[fault.Code]int{
	fault.BadRequest:         400,
	fault.Unauthenticated:    401,
	fault.PermissionDenied:   403,
	fault.NotFound:           404,
	fault.Conflict:           409,
	fault.AlreadyExists:      409,
	fault.Expired:            410,
	fault.FailedPrecondition: 412,
	fault.ResourceExhausted:  429,
	fault.Internal:           500,
	fault.Unimplemented:      501,
	fault.Unavailable:        503,
}

// Numeric returns the numeric form of code (500 for a code not in the table).
func Numeric(code fault.Code) int {
	if n, ok := numeric[code]; ok {
		return n
	}
	return 500
}

// ErrorBody is the JSON body of a refusal.
type ErrorBody struct {
	Error WireError `json:"error"`
}

// WireError is a refusal on the wire.
type WireError struct {
	Code    fault.Code `json:"code"`
	Message string     `json:"message"`
	Details any        `json:"details,omitempty"`
}

// respondError answers req with the refusal e: both micro headers and the JSON body. micro
// counts it in the endpoint's error stats.
func respondError(req micro.Request, e *fault.Error) error {
	w := WireError{Code: e.Code, Message: e.Message, Details: e.Details}
	if _, known := numeric[e.Code]; !known {
		w = WireError{Code: fault.Internal, Message: "internal error"}
	}
	data, err := json.Marshal(ErrorBody{Error: w})
	if err != nil {
		return err
	}
	return req.Error(strconv.Itoa(Numeric(w.Code)), string(w.Code)+": "+w.Message, data)
}
