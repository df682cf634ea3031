// Package rows decodes the rows the plane keeps in its buckets: closed JSON, as request bodies
// are (package body), but each row type with a size limit of its own. A row is not a request: the
// plane wrote it, and some grow with a flag (an owner's instances with
// --max-instances-per-owner, the revocation set with the ended keys), so the request limit of
// 64 KiB must not apply to them, and a flag is bounded by what its row can hold.
package rows

import (
	"errors"
	"fmt"
	"strings"

	"github.com/cotal-ai/authplane/internal/body"
	"github.com/cotal-ai/authplane/internal/fault"
)

// MaxMessage is the largest row any bucket can hold: the largest message NATS allows
// (max_payload's ceiling). A row type whose size grows with a flag bounds the flag by it, or by
// the broker's own max_payload, which is smaller.
const MaxMessage = 64 << 20

// Decode parses the stored row data into v (a pointer to a struct with `json` tags), closed as
// a request body is, and refuses a row over limit bytes. Its error is a plain error about the
// row, never a refusal: a row that does not decode is the plane's fault, not the caller's.
func Decode(data []byte, v any, limit int) error {
	err := body.DecodeLimit(data, v, limit)
	var f *fault.Error
	if errors.As(err, &f) {
		msg := strings.Replace(f.Message, "body is", "row is", 1)
		return fmt.Errorf("stored row: %s", msg)
	}
	return err
}
