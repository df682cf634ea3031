package audit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

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

// RecordMargin is how long, at least, a `minted` record outlives every credential it stands
// for, by its age in the stream: room for the plane's clock, which dates a record it wrote, to
// run ahead of the stream's.
const RecordMargin = time.Hour

// RecheckAfter is how long the writer takes a record it wrote, or read standing, to stand
// still without reading it again: a record lost meanwhile (a stream replaced under the plane,
// an unsynced broker's power cut) is written again by the first mint of its keys past it.
const RecheckAfter = 10 * time.Minute

// maxStanding bounds the records the writer remembers; past it, it forgets them all.
const maxStanding = 1 << 16

// Minted puts the keys of a mint of creds on record under instance iid (the instance the keys
// are claimed by: what an end of it revokes) before the mint commits. When the last record on
// the set's subject names exactly these duties and keys and stays in the stream RecordMargin
// past every credential's expiry, that record stands for this mint too, and nothing is
// written: a renewal of the same keys makes no synced write of its own. The writer reads the
// record to know, unless it wrote or read it within RecheckAfter. Otherwise, and always for a
// mint for no instance (iid ""), it writes the mint's one record. A write of unknown outcome is
// retried until ctx ends under the message id mintID, so a retry that meets a write that did
// land adds no second record. An error means the mint must not commit; a full stream is
// store.ErrFull.
func (w *Writer) Minted(ctx context.Context, iid string, req Request, creds []Credential, mintID string) error {
	keys := make([]string, len(creds))
	for i, c := range creds {
		keys[i] = c.NKey
	}
	subject := subjects.MintedSubject(w.space, iid, keys)
	now := w.now()
	// A mint for no instance (a connection of the auth callout, a creds file) has a fresh key
	// every time: no record stands for it, and none is worth remembering.
	renewable := iid != ""
	if renewable && (w.standing.covers(subject, creds, now) || w.readStanding(ctx, subject, creds, now)) {
		return nil
	}
	data, err := fault.Encode(Minted{V: 1, Request: req, Credentials: creds, At: now.UnixMilli()})
	if err == nil && len(data) > MaxMintedRecord {
		err = fmt.Errorf("%d bytes, over the bound of %d", len(data), MaxMintedRecord)
	}
	if err == nil {
		err = w.append(ctx, subject, data, mintID)
	}
	if err != nil {
		w.log.Error("minted record not written; the mint will not commit", append(append(req.attrs(), credentialAttrs(creds)...), "err", err)...)
		return fmt.Errorf("record minted: %w", err)
	}
	if renewable {
		w.standing.remember(subject, stood{creds: slices.Clone(creds), stays: now.Add(store.MintedMaxAge - RecordMargin).Unix(), seen: now})
	}
	return nil
}

// readStanding reads the last record on subject, remembers it, and says whether it stands for
// creds. A record that cannot be read or decoded stands for nothing: the mint writes its own.
func (w *Writer) readStanding(ctx context.Context, subject string, creds []Credential, now time.Time) bool {
	actx, cancel := store.Attempt(ctx)
	r, found, err := w.out.LastOn(actx, subjects.MintedStream(w.space), subject)
	cancel()
	if err != nil || !found {
		return false
	}
	var m Minted
	if fault.DecodeRow(r.Data, &m, MaxMintedRecord) != nil {
		return false
	}
	rec := stood{creds: m.Credentials, stays: r.Time.Add(store.MintedMaxAge - RecordMargin).Unix(), seen: now}
	w.standing.remember(subject, rec)
	return rec.covers(creds)
}

// standing is the records a writer wrote or read, by subject.
type standing struct {
	mu sync.Mutex
	by map[string]stood
}

// stood is one record as the writer last saw it: the credentials it names, the latest expiry it
// stands for (seconds), and when the writer saw it.
type stood struct {
	creds []Credential
	stays int64
	seen  time.Time
}

// covers says whether the record names exactly the duties and keys of creds, and stays past
// each one's expiry.
func (r stood) covers(creds []Credential) bool {
	if len(r.creds) != len(creds) {
		return false
	}
	for _, c := range creds {
		if c.Exp > r.stays || !slices.ContainsFunc(r.creds, func(o Credential) bool { return o.Duty == c.Duty && o.NKey == c.NKey }) {
			return false
		}
	}
	return true
}

// covers says whether the record on subject, seen within RecheckAfter, covers creds.
func (s *standing) covers(subject string, creds []Credential, now time.Time) bool {
	s.mu.Lock()
	r, ok := s.by[subject]
	s.mu.Unlock()
	return ok && now.Sub(r.seen) < RecheckAfter && r.covers(creds)
}

func (s *standing) remember(subject string, r stood) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.by == nil || len(s.by) >= maxStanding {
		s.by = map[string]stood{}
	}
	s.by[subject] = r
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
