package audit

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/store"
	"github.com/cotal-ai/authplane/subjects"
)

// Minted is the record of one mint, on `cotal.<space>.minted.<iid>.<digest of its keys>`
// (subjects.MintedSubject): every credential it signed and what asked for them. A mint of the
// same keys again replaces it; the keys of every record of an instance are what an end of it
// revokes.
type Minted struct {
	V int `json:"v"`
	Request
	Credentials []Credential `json:"credentials"`
	At          int64        `json:"at"` // milliseconds
}

// MaxMintedRecord is the largest `minted` record, in bytes: a mint signs at most five
// credentials (a standing bundle), each about 100 bytes, beside the request's few bounded
// fields. A larger one is not written, and its mint does not commit.
const MaxMintedRecord = 4 << 10

// Minted writes the one `minted` record of a mint of creds, filed under instance iid (the
// instance the keys are claimed by: what an end of it revokes), before the mint commits. A
// write of unknown outcome is retried until ctx ends under the message id mintID, so a retry
// that meets a write that did land adds no second record. An error means the mint must not
// commit; a full stream is store.ErrFull.
func (w *Writer) Minted(ctx context.Context, iid string, req Request, creds []Credential, mintID string) error {
	keys := make([]string, len(creds))
	for i, c := range creds {
		keys[i] = c.NKey
	}
	data, err := fault.Encode(Minted{V: 1, Request: req, Credentials: creds, At: w.now().UnixMilli()})
	if err == nil && len(data) > MaxMintedRecord {
		err = fmt.Errorf("%d bytes, over the bound of %d", len(data), MaxMintedRecord)
	}
	if err == nil {
		err = w.append(ctx, subjects.MintedSubject(w.space, iid, keys), data, mintID)
	}
	if err != nil {
		w.log.Error("minted record not written; the mint will not commit", append(append(req.attrs(), credentialAttrs(creds)...), "err", err)...)
		return fmt.Errorf("record minted: %w", err)
	}
	return nil
}

// append writes one record, again after a write of unknown outcome, until ctx ends.
func (w *Writer) append(ctx context.Context, subject string, data []byte, msgID string) error {
	for attempt := 0; ; attempt++ {
		actx, cancel := store.Attempt(ctx) // a lost ack leaves time to try again
		err := w.out.Append(actx, subject, data, msgID)
		cancel()
		if err == nil || msgID == "" || !errors.Is(err, store.ErrUnknownOutcome) {
			return err
		}
		if perr := store.Pause(ctx, attempt); perr != nil {
			return fmt.Errorf("%w (gave up: %w)", err, perr)
		}
	}
}

// MintedKeys lists the public keys named by instance iid's `minted` records, sorted, each once:
// the union over every record of the instance (one a set of keys minted together) within the
// minted stream's age, the source a supervisor end revokes from. A record that does not decode
// is an error: its keys would be missed.
func (w *Writer) MintedKeys(ctx context.Context, iid string) ([]string, error) {
	records, err := w.out.Last(ctx, subjects.MintedStream(w.space), subjects.MintedInstanceFilter(w.space, iid))
	if err != nil {
		return nil, fmt.Errorf("minted records of instance %s: %w", iid, err)
	}
	keys := []string{}
	for _, r := range records {
		var m Minted
		if err := fault.DecodeRow(r.Data, &m, MaxMintedRecord); err != nil {
			return nil, fmt.Errorf("the minted record on %s: %w", r.Subject, err)
		}
		for _, c := range m.Credentials {
			if !subjects.ValidUserNKey(c.NKey) {
				return nil, fmt.Errorf("the minted record on %s names %q, not a user nkey", r.Subject, c.NKey)
			}
			keys = append(keys, c.NKey)
		}
	}
	slices.Sort(keys)
	return slices.Compact(keys), nil
}
