package issue

import (
	"context"
	"errors"
	"time"

	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/subjects"
)

// StoredBudget is a token bucket per name kept in the store: one fence row, `budget.<budget>.<name>`
// in the plane's fence bucket, holding the tokens left and when they were counted. A take reads
// the row from the leader and writes it back at the revision read (fence.Update), so the
// budget holds per space: across restarts, and shared by every replica. A name whose row is
// absent has a full bucket. Its cost is one read and one write per take: keep it off any path
// that runs on every request (a renewal of keys already held takes nothing).
type StoredBudget struct {
	KV fence.KV
	// Budget names the budget (one of BudgetNames): its rows' keys and its refusals' label.
	Budget string
	// PerSecond tokens come back a second, up to Burst. A PerSecond of zero or less bounds
	// nothing.
	PerSecond float64
	Burst     int
	Now       func() time.Time
}

// Bucket is one stored token bucket: the tokens it held when they were last counted. A row
// that keeps one (a stored budget's, a gate's) changes it only by a write at the revision read,
// so whoever takes from it takes what is there.
type Bucket struct {
	Tokens float64 `json:"tokens"`
	// At is when Tokens were counted, in unix milliseconds of the plane's clock.
	At int64 `json:"at"`
}

// Take takes n tokens at now from b (nil: a full bucket), of a budget of perSecond tokens a
// second up to burst, and returns the bucket left, or false when b holds fewer than n. A clock
// behind the bucket's (another replica's) gives nothing back, never takes.
func (b *Bucket) Take(now time.Time, perSecond float64, burst, n int) (Bucket, bool) {
	tokens := float64(burst)
	if b != nil {
		since := max(now.Sub(time.UnixMilli(b.At)), 0)
		tokens = min(tokens, b.Tokens+since.Seconds()*perSecond)
	}
	if tokens < float64(n) {
		return Bucket{}, false
	}
	return Bucket{Tokens: tokens - float64(n), At: now.UnixMilli()}, true
}

// bucketRow is one name's stored bucket.
type bucketRow struct {
	V int `json:"v"`
	Bucket
	// Nonce makes every write's bytes fresh (fence.New's stamp).
	Nonce string `json:"nonce"`
}

// maxBucketRow bounds a stored bucket.
const maxBucketRow = 256

func (s *StoredBudget) fence(name string) *fence.Fence[bucketRow] {
	return fence.New(s.KV, subjects.BudgetKey(s.Budget, name), func(data []byte) (bucketRow, error) {
		var r bucketRow
		if err := fault.DecodeRow(data, &r, maxBucketRow); err != nil {
			return bucketRow{}, err
		}
		if r.V != 1 || r.Tokens < 0 {
			return bucketRow{}, errors.New("not a version 1 token bucket")
		}
		return r, nil
	}, func(r *bucketRow) { r.Nonce = subjects.NewNonce() })
}

// Take takes n tokens from name's bucket, all or none, and reports whether it had them; an
// error is the store's (the outcome of a write it could not settle included). A nil or
// unbounded StoredBudget always has them, and a take of none costs nothing.
func (s *StoredBudget) Take(ctx context.Context, name string, n int) (bool, error) {
	short, err := TakeAll(ctx, Want{From: s, Name: name, N: n})
	return short < 0, err
}

// Want is n tokens of name's bucket of a stored budget.
type Want struct {
	From *StoredBudget
	Name string
	N    int
}

// bounds reports whether w takes anything.
func (w Want) bounds() bool { return w.From != nil && w.From.PerSecond > 0 && w.N > 0 }

// TakeAll takes every want, and returns the index of the first whose bucket could not give it
// (-1 when every one was taken); an error is the store's. It reads every bucket first and
// takes nothing, writing nothing, when any lacks its tokens; then it takes each, in order, at
// the revision it read (reading again only a bucket that moved meanwhile). A want refused then
// by a take that raced it leaves the wants before it taken.
func TakeAll(ctx context.Context, wants ...Want) (short int, err error) {
	seen := make([]*fence.Observed[bucketRow], len(wants))
	for i, w := range wants {
		if !w.bounds() {
			continue
		}
		if w.N > w.From.Burst {
			return i, nil
		}
		if seen[i], err = w.From.fence(w.Name).Observe(ctx); err != nil {
			return i, err
		}
		if _, ok := w.From.take(seen[i], w.N); !ok {
			return i, nil
		}
	}
	for i, w := range wants {
		if !w.bounds() {
			continue
		}
		var had bool
		_, err := w.From.fence(w.Name).UpdateFrom(ctx, seen[i], func(o *fence.Observed[bucketRow]) (bucketRow, error) {
			left, ok := w.From.take(o, w.N)
			if had = ok; !had {
				return bucketRow{}, fence.ErrKeep
			}
			return bucketRow{V: 1, Bucket: left}, nil
		})
		if err != nil || !had {
			return i, err
		}
	}
	return -1, nil
}

// take takes n tokens from o's bucket now.
func (s *StoredBudget) take(o *fence.Observed[bucketRow], n int) (Bucket, bool) {
	var b *Bucket
	if !o.Absent() {
		b = &o.Row.Bucket
	}
	return b.Take(s.Now(), s.PerSecond, s.Burst, n)
}
