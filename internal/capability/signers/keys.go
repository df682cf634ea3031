package signers

import (
	"context"
	"crypto/hkdf"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/subjects"
)

// label is the HKDF label an instance's signing key is derived under.
const label = "authplane instance signer v1"

// Keys derives the data account's signing keys, of every generation. A generation is a root:
// an account key pair whose own key signs what belongs to no instance (the auth callout's
// users, `authplane creds`, the plane's serving user), and from whose seed each manager
// instance's own signing key is derived, HKDF-SHA256 with the space, the account and the
// instance in the info (the proof key is derived from a root too, under another label).
// Generation 0 is the space material's data signing key; every later one is made by a
// rotation from crypto/rand and stored, create-only, in the keys bucket, so every replica
// derives the same keys. Issuers of the instances seen lately are kept, so a key is derived
// once per instance and generation, not once per signature.
type Keys struct {
	account string
	prefix  string
	now     func() time.Time
	store   fence.KV

	mu      sync.Mutex
	roots   map[uint64]nkeys.KeyPair
	mains   map[uint64]*issue.Issuer
	issuers map[instanceKey]*issue.Issuer
}

// instanceKey names one instance's key of one generation.
type instanceKey struct {
	gen uint64
	iid string
}

// maxIssuers bounds the issuers kept; past it the memory starts over.
const maxIssuers = 1 << 15

// NewKeys returns the keys of space's data account account, whose generation 0 is its signing
// key root; now is the clock of the credentials they sign. Later generations are read from the
// keys bucket given to Stored.
func NewKeys(space, account string, root nkeys.KeyPair, now func() time.Time) (*Keys, error) {
	if root == nil {
		return nil, errors.New("instance signing keys: no data account signing key")
	}
	k := &Keys{account: account, prefix: space + "\x00" + account + "\x00", now: now,
		roots: map[uint64]nkeys.KeyPair{}, mains: map[uint64]*issue.Issuer{}, issuers: map[instanceKey]*issue.Issuer{}}
	if err := k.adopt(0, root); err != nil {
		return nil, fmt.Errorf("instance signing keys: %w", err)
	}
	return k, nil
}

// Stored gives k the keys bucket its generations past 0 are kept in, and returns k.
func (k *Keys) Stored(kv fence.KV) *Keys {
	k.store = kv
	return k
}

// adopt keeps root as generation gen's.
func (k *Keys) adopt(gen uint64, root nkeys.KeyPair) error {
	main, err := issue.NewIssuer(k.account, root, k.now)
	if err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.roots[gen]; !ok {
		k.roots[gen], k.mains[gen] = root, main
	}
	return nil
}

// Gens lists the generations k holds, in order.
func (k *Keys) Gens() []uint64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]uint64, 0, len(k.roots))
	for g := range k.roots {
		out = append(out, g)
	}
	slices.Sort(out)
	return out
}

// ErrNoGeneration: the keys bucket holds no root of the generation asked for.
var ErrNoGeneration = errors.New("no such signing key generation")

// genRow is a stored generation: its root's seed.
type genRow struct {
	V         int    `json:"v"`
	Account   string `json:"account"`
	Gen       uint64 `json:"gen"`
	Seed      string `json:"seed"`
	CreatedAt int64  `json:"createdAt"`
}

// Load makes generation gen's root known, reading it from the keys bucket if need be.
func (k *Keys) Load(ctx context.Context, gen uint64) error {
	k.mu.Lock()
	_, ok := k.roots[gen]
	k.mu.Unlock()
	if ok {
		return nil
	}
	if k.store == nil {
		return fmt.Errorf("signing key generation %d: %w (no keys bucket)", gen, ErrNoGeneration)
	}
	e, err := fence.New(k.store, subjects.SigningGenKey(k.account, gen), parseGen, nil).Observe(ctx)
	switch {
	case err != nil:
		return fmt.Errorf("read signing key generation %d: %w", gen, err)
	case e.Absent():
		return fmt.Errorf("signing key generation %d: %w", gen, ErrNoGeneration)
	case e.Row.Account != k.account || e.Row.Gen != gen:
		return fmt.Errorf("signing key generation %d: its row names another account or generation", gen)
	}
	root, err := nkeys.FromSeed([]byte(e.Row.Seed))
	if err != nil {
		return fmt.Errorf("signing key generation %d: %w", gen, err)
	}
	return k.adopt(gen, root)
}

func parseGen(data []byte) (genRow, error) {
	var r genRow
	if err := fault.DecodeRow(data, &r, 4<<10); err != nil {
		return genRow{}, err
	}
	if r.V != 1 || !strings.HasPrefix(r.Seed, "SA") {
		return genRow{}, errors.New("not a version 1 signing key generation")
	}
	return r, nil
}

// Generate stores a fresh root for generation gen, create-only: when one is stored already
// (a rotation resumed after its step, or another replica's), that one is kept. Either way the
// generation is known once it returns.
func (k *Keys) Generate(ctx context.Context, gen uint64) error {
	if gen == 0 || k.store == nil {
		return fmt.Errorf("generate signing key generation %d: generation 0 is the material's; later ones need the keys bucket", gen)
	}
	if err := k.Load(ctx, gen); !errors.Is(err, ErrNoGeneration) {
		return err
	}
	root, err := nkeys.CreateAccount()
	if err != nil {
		return fmt.Errorf("generate signing key generation %d: %w", gen, err)
	}
	seed, err := root.Seed()
	if err != nil {
		return fmt.Errorf("generate signing key generation %d: %w", gen, err)
	}
	row := genRow{V: 1, Account: k.account, Gen: gen, Seed: string(seed), CreatedAt: k.now().Unix()}
	// Another writer that made it first wins: what is stored is the root.
	_, err = fence.New(k.store, subjects.SigningGenKey(k.account, gen), parseGen, nil).Update(ctx, func(o *fence.Observed[genRow]) (genRow, error) {
		if !o.Absent() {
			return genRow{}, fence.ErrKeep
		}
		return row, nil
	})
	if err != nil {
		return fmt.Errorf("store signing key generation %d: %w", gen, err)
	}
	return k.Load(ctx, gen)
}

// Root is generation gen's root key pair (the proof key is derived from one); gen must be
// known (Load).
func (k *Keys) Root(gen uint64) (nkeys.KeyPair, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	root, ok := k.roots[gen]
	if !ok {
		return nil, fmt.Errorf("signing key generation %d: %w (not loaded)", gen, ErrNoGeneration)
	}
	return root, nil
}

// Main returns the issuer of generation gen's own key: what signs the users of no instance.
func (k *Keys) Main(gen uint64) (*issue.Issuer, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	iss, ok := k.mains[gen]
	if !ok {
		return nil, fmt.Errorf("signing key generation %d: %w (not loaded)", gen, ErrNoGeneration)
	}
	return iss, nil
}

// Issuer returns the issuer of instance iid's credentials of generation 0.
func (k *Keys) Issuer(iid string) (*issue.Issuer, error) { return k.IssuerOf(0, iid) }

// IssuerOf returns the issuer of instance iid's credentials of generation gen, which must be
// known (Load): signed with the instance's own key, derived from the generation's root.
func (k *Keys) IssuerOf(gen uint64, iid string) (*issue.Issuer, error) {
	at := instanceKey{gen, iid}
	k.mu.Lock()
	iss, ok := k.issuers[at]
	root := k.roots[gen]
	k.mu.Unlock()
	if ok {
		return iss, nil
	}
	if root == nil {
		return nil, fmt.Errorf("the signing key of instance %s: generation %d: %w (not loaded)", iid, gen, ErrNoGeneration)
	}
	seed, err := root.Seed()
	if err != nil {
		return nil, fmt.Errorf("derive the signing key of instance %s: %w", iid, err)
	}
	raw, err := hkdf.Key(sha256.New, seed, nil, label+"\x00"+k.prefix+iid, 32)
	if err != nil {
		return nil, fmt.Errorf("derive the signing key of instance %s: %w", iid, err)
	}
	kp, err := nkeys.FromRawSeed(nkeys.PrefixByteAccount, raw)
	if err != nil {
		return nil, fmt.Errorf("derive the signing key of instance %s: %w", iid, err)
	}
	if iss, err = issue.NewIssuer(k.account, kp, k.now); err != nil {
		return nil, fmt.Errorf("the signing key of instance %s: %w", iid, err)
	}
	k.mu.Lock()
	if len(k.issuers) >= maxIssuers {
		k.issuers = map[instanceKey]*issue.Issuer{}
	}
	k.issuers[at] = iss
	k.mu.Unlock()
	return iss, nil
}

// Public is the public key of instance iid's signing key of generation 0.
func (k *Keys) Public(iid string) (string, error) { return k.PublicOf(0, iid) }

// PublicOf is the public key of instance iid's signing key of generation gen.
func (k *Keys) PublicOf(gen uint64, iid string) (string, error) {
	iss, err := k.IssuerOf(gen, iid)
	if err != nil {
		return "", err
	}
	return iss.Signer(), nil
}
