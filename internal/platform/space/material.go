package space

import (
	"bytes"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/go-jose/go-jose/v4"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/subjects"
)

// OwnerSecretFile is the material's file of the owner secret: the one a check of where the
// material may be written asks git about.
const OwnerSecretFile = ownerSecretFile

// File names inside the space directory.
const (
	descriptorFile      = "space.json"
	ownerSecretFile     = "owner-secret.json"
	bearerKeyFile       = "bearer-issuer.jwk"
	operatorSeedFile    = "operator.nk"
	operatorSignerFile  = "operator-signing.nk"
	systemSeedFile      = "system.nk"
	systemSignerFile    = "system-signing.nk"
	dataSeedFile        = "data.nk"
	dataSignerFile      = "data-signing.nk"
	planeSeedFile       = "plane.nk"
	planeSignerFile     = "plane-signing.nk"
	calloutSeedFile     = "callout.nk"
	calloutSignerFile   = "callout-signing.nk"
	calloutXKeyFile     = "callout-xkey.nk"
	calloutUserSeedFile = "callout-user.nk"
)

// Account is one account of the space: its identity key, the signing key its users are signed
// with (unscoped: a scoped key would override the users' permissions), and its JWT. The
// operator enforces strict signing-key usage, so no user is ever signed by an identity key.
type Account struct {
	Name   string
	Key    nkeys.KeyPair
	Signer nkeys.KeyPair
	JWT    string
}

// Public returns the account's public nkey.
func (a Account) Public() string {
	pub, err := a.Key.PublicKey()
	if err != nil {
		panic("space: account key without public key: " + err.Error()) // checked at load
	}
	return pub
}

// Keys is the space material in memory: every key, JWT and secret of the space.
type Keys struct {
	Space string
	Dir   string

	Operator    nkeys.KeyPair
	OperatorJWT string
	// OperatorSigner signs account JWTs; nil when the operator keeps it elsewhere, in which
	// case the plane cannot revoke at the broker and says so.
	OperatorSigner nkeys.KeyPair

	System  Account
	Data    Account
	Plane   Account
	Callout Account

	// CalloutXKey seals the callout's requests and responses; CalloutUser is the callout's
	// fixed user, listed in the callout account's auth_users.
	CalloutXKey nkeys.KeyPair
	CalloutUser nkeys.KeyPair

	// OwnerSecret derives `u_` owners from IdP subjects.
	OwnerSecret []byte
	// BearerKey is the first bearer issuer key (a private JWK).
	BearerKey jose.JSONWebKey
}

type descriptor struct {
	Ver      int               `json:"ver"`
	Space    string            `json:"space"`
	Operator string            `json:"operator"`
	Accounts map[string]string `json:"accounts"`
}

type ownerSecret struct {
	Ver       int    `json:"ver"`
	SecretB64 string `json:"secretB64"`
}

// ErrNotFound means the directory holds no space material yet.
var ErrNotFound = errors.New("no space material")

// ErrExposed means a file of the material that holds a secret (a seed, the owner secret, the
// bearer key) may be read or written by group or others: Load refuses it rather than use keys
// the host shares, the way ssh refuses a private key.
var ErrExposed = errors.New("group or others may read or write it")

// readSecret reads the file name of dir, which holds a secret, and refuses it if its mode lets
// group or others at it.
func readSecret(dir, name string) ([]byte, error) {
	f, err := os.Open(filepath.Join(dir, name))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("%s has mode %04o: %w; it holds a secret: chmod 600 it", name, perm, ErrExposed)
	}
	return io.ReadAll(f)
}

// LoadOrCreate loads the material in dir, or creates it for space when dir does not exist. It
// reports whether it created the material.
func LoadOrCreate(dir, space string) (*Keys, bool, error) {
	m, err := Load(dir)
	if err == nil {
		if m.Space != space {
			return nil, false, fmt.Errorf("space material in %s is for space %q, not %q", dir, m.Space, space)
		}
		return m, false, nil
	}
	if !errors.Is(err, ErrNotFound) {
		return nil, false, err
	}
	m, err = Create(dir, space)
	if errors.Is(err, os.ErrExist) { // another process created it first
		m, err = Load(dir)
		return m, false, err
	}
	return m, err == nil, err
}

// Create generates fresh material for space and writes it to dir. When dir does not exist the
// files go to a private temporary directory that is renamed into place, so dir holds all of
// the material or none of it. An existing directory (a volume's mount point, say) is filled in
// place only if it holds no descriptor yet; the descriptor is written last, so a crash leaves
// material that Load still reports as absent. Existing material is never overwritten.
func Create(dir, space string) (*Keys, error) {
	if !subjects.ValidSpace(space) {
		return nil, fmt.Errorf("space %q: want [a-z0-9][a-z0-9_-]{0,31}", space)
	}
	if _, err := os.Stat(filepath.Join(dir, descriptorFile)); err == nil {
		return nil, fmt.Errorf("create space material: %s: %w", dir, os.ErrExist)
	}
	m, err := generate(space)
	if err != nil {
		return nil, err
	}
	m.Dir = dir
	if _, err := os.Stat(dir); err == nil {
		return m, m.write(dir)
	}
	parent := filepath.Dir(dir)
	if err := EnsureDir(parent); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dir)+".tmp-*")
	if err != nil {
		return nil, fmt.Errorf("create space material: %w", err)
	}
	if err := m.write(tmp); err != nil {
		return nil, errors.Join(err, os.RemoveAll(tmp))
	}
	if err := os.Rename(tmp, dir); err != nil {
		err = fmt.Errorf("create space material: %w", err)
		if _, statErr := os.Stat(filepath.Join(dir, descriptorFile)); statErr == nil {
			err = fmt.Errorf("create space material: %s: %w", dir, os.ErrExist)
		}
		return nil, errors.Join(err, os.RemoveAll(tmp))
	}
	return m, nil
}

func generate(space string) (*Keys, error) {
	m := &Keys{Space: space}
	var err error
	pair := func(create func() (nkeys.KeyPair, error)) nkeys.KeyPair {
		if err != nil {
			return nil
		}
		var kp nkeys.KeyPair
		kp, err = create()
		return kp
	}
	m.Operator = pair(nkeys.CreateOperator)
	m.OperatorSigner = pair(nkeys.CreateOperator)
	m.System = Account{Name: "SYS", Key: pair(nkeys.CreateAccount), Signer: pair(nkeys.CreateAccount)}
	m.Data = Account{Name: subjects.DataAccountName(space), Key: pair(nkeys.CreateAccount), Signer: pair(nkeys.CreateAccount)}
	m.Plane = Account{Name: "cotal_plane_" + space, Key: pair(nkeys.CreateAccount), Signer: pair(nkeys.CreateAccount)}
	m.Callout = Account{Name: "cotal_callout_" + space, Key: pair(nkeys.CreateAccount), Signer: pair(nkeys.CreateAccount)}
	m.CalloutXKey = pair(nkeys.CreateCurveKeys)
	m.CalloutUser = pair(nkeys.CreateUser)
	if err != nil {
		return nil, fmt.Errorf("generate keys: %w", err)
	}

	m.OwnerSecret = make([]byte, 32)
	if _, err := rand.Read(m.OwnerSecret); err != nil {
		return nil, fmt.Errorf("generate owner secret: %w", err)
	}
	if m.BearerKey, err = newBearerKey(); err != nil {
		return nil, err
	}
	if err := m.signJWTs(); err != nil {
		return nil, err
	}
	return m, nil
}

// newBearerKey returns a fresh Ed25519 bearer issuer key as a private JWK whose kid is its
// RFC 7638 thumbprint.
func newBearerKey() (jose.JSONWebKey, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return jose.JSONWebKey{}, fmt.Errorf("generate bearer key: %w", err)
	}
	k := jose.JSONWebKey{Key: priv, Algorithm: string(jose.EdDSA), Use: "sig"}
	tp, err := k.Thumbprint(crypto.SHA256)
	if err != nil {
		return jose.JSONWebKey{}, fmt.Errorf("bearer key thumbprint: %w", err)
	}
	k.KeyID = base64.RawURLEncoding.EncodeToString(tp)
	return k, nil
}

func (m *Keys) write(dir string) error {
	desc := descriptor{
		Ver: 1, Space: m.Space, Operator: m.OperatorJWT,
		Accounts: map[string]string{"system": m.System.JWT, "data": m.Data.JWT, "plane": m.Plane.JWT, "callout": m.Callout.JWT},
	}
	descJSON, err := json.MarshalIndent(desc, "", "  ")
	if err != nil {
		return err
	}
	secretJSON, err := json.Marshal(ownerSecret{Ver: 1, SecretB64: base64.StdEncoding.EncodeToString(m.OwnerSecret)})
	if err != nil {
		return err
	}
	bearerJSON, err := m.BearerKey.MarshalJSON()
	if err != nil {
		return fmt.Errorf("encode bearer key: %w", err)
	}
	out := map[string][]byte{
		descriptorFile:  append(descJSON, '\n'),
		ownerSecretFile: append(secretJSON, '\n'),
		bearerKeyFile:   append(bearerJSON, '\n'),
	}
	for name, kp := range m.seeds() {
		seed, err := kp.Seed()
		if err != nil {
			return fmt.Errorf("seed for %s: %w", name, err)
		}
		out[name] = append(seed, '\n')
	}
	for name, data := range out {
		if name == descriptorFile {
			continue
		}
		if err := WriteAtomic(filepath.Join(dir, name), data, Private); err != nil {
			return err
		}
	}
	// The descriptor last: it is what makes the directory hold material.
	return WriteAtomic(filepath.Join(dir, descriptorFile), out[descriptorFile], Private)
}

func (m *Keys) seeds() map[string]nkeys.KeyPair {
	s := map[string]nkeys.KeyPair{
		operatorSeedFile:    m.Operator,
		systemSeedFile:      m.System.Key,
		systemSignerFile:    m.System.Signer,
		dataSeedFile:        m.Data.Key,
		dataSignerFile:      m.Data.Signer,
		planeSeedFile:       m.Plane.Key,
		planeSignerFile:     m.Plane.Signer,
		calloutSeedFile:     m.Callout.Key,
		calloutSignerFile:   m.Callout.Signer,
		calloutXKeyFile:     m.CalloutXKey,
		calloutUserSeedFile: m.CalloutUser,
	}
	if m.OperatorSigner != nil {
		s[operatorSignerFile] = m.OperatorSigner
	}
	return s
}

// Load reads the material in dir and checks that every key matches the JWTs that name it.
// Every missing, broken or exposed (ErrExposed) file is reported at once. The operator signing
// key may be absent.
func Load(dir string) (*Keys, error) {
	descJSON, err := os.ReadFile(filepath.Join(dir, descriptorFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w", dir, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read space material: %w", err)
	}
	var desc descriptor
	if err := json.Unmarshal(descJSON, &desc); err != nil || desc.Ver != 1 || !subjects.ValidSpace(desc.Space) {
		return nil, fmt.Errorf("read space material: %s is not a version 1 space descriptor", filepath.Join(dir, descriptorFile))
	}
	m := &Keys{Space: desc.Space, Dir: dir, OperatorJWT: desc.Operator}
	var problems []error
	seed := func(name string, optional bool) nkeys.KeyPair {
		raw, err := readSecret(dir, name)
		if optional && errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			problems = append(problems, err)
			return nil
		}
		kp, err := nkeys.FromSeed(bytes.TrimSpace(raw))
		if err != nil {
			problems = append(problems, fmt.Errorf("%s: %w", name, err))
			return nil
		}
		return kp
	}
	m.Operator = seed(operatorSeedFile, true)
	m.OperatorSigner = seed(operatorSignerFile, true)
	m.System = Account{Name: "SYS", Key: seed(systemSeedFile, false), Signer: seed(systemSignerFile, false), JWT: desc.Accounts["system"]}
	m.Data = Account{Name: subjects.DataAccountName(m.Space), Key: seed(dataSeedFile, false), Signer: seed(dataSignerFile, false), JWT: desc.Accounts["data"]}
	m.Plane = Account{Name: "cotal_plane_" + m.Space, Key: seed(planeSeedFile, false), Signer: seed(planeSignerFile, false), JWT: desc.Accounts["plane"]}
	m.Callout = Account{Name: "cotal_callout_" + m.Space, Key: seed(calloutSeedFile, false), Signer: seed(calloutSignerFile, false), JWT: desc.Accounts["callout"]}
	m.CalloutXKey = seed(calloutXKeyFile, false)
	m.CalloutUser = seed(calloutUserSeedFile, false)

	if raw, err := readSecret(dir, ownerSecretFile); err != nil {
		problems = append(problems, err)
	} else {
		var s ownerSecret
		if err := json.Unmarshal(raw, &s); err != nil || s.Ver != 1 {
			problems = append(problems, fmt.Errorf("%s: not a version 1 owner secret", ownerSecretFile))
		} else if m.OwnerSecret, err = base64.StdEncoding.DecodeString(s.SecretB64); err != nil || len(m.OwnerSecret) < 32 {
			problems = append(problems, fmt.Errorf("%s: secretB64 must be standard base64 of at least 32 bytes", ownerSecretFile))
		}
	}
	if raw, err := readSecret(dir, bearerKeyFile); err != nil {
		problems = append(problems, err)
	} else if err := m.BearerKey.UnmarshalJSON(raw); err != nil || m.BearerKey.IsPublic() {
		problems = append(problems, fmt.Errorf("%s: not a private JWK", bearerKeyFile))
	}
	if len(problems) == 0 {
		problems = append(problems, m.check()...)
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("space material in %s: %w", dir, errors.Join(problems...))
	}
	return m, nil
}

// check verifies that the JWTs are the ones the keys describe.
func (m *Keys) check() []error {
	var problems []error
	op, err := jwt.DecodeOperatorClaims(m.OperatorJWT)
	if err != nil {
		return []error{fmt.Errorf("operator JWT: %w", err)}
	}
	if m.Operator != nil && mustPublic(m.Operator) != op.Subject {
		problems = append(problems, fmt.Errorf("%s does not match the operator JWT", operatorSeedFile))
	}
	if m.OperatorSigner != nil && !op.SigningKeys.Contains(mustPublic(m.OperatorSigner)) {
		problems = append(problems, fmt.Errorf("%s is not a signing key of the operator", operatorSignerFile))
	}
	if op.SystemAccount != m.System.Public() {
		problems = append(problems, fmt.Errorf("the operator's system account is not %s", systemSeedFile))
	}
	for _, a := range []Account{m.System, m.Data, m.Plane, m.Callout} {
		ac, err := jwt.DecodeAccountClaims(a.JWT)
		if err != nil {
			problems = append(problems, fmt.Errorf("%s account JWT: %w", a.Name, err))
			continue
		}
		if ac.Subject != a.Public() {
			problems = append(problems, fmt.Errorf("%s account JWT names another account", a.Name))
		}
		if !op.DidSign(ac) {
			problems = append(problems, fmt.Errorf("%s account JWT is not signed by the operator", a.Name))
		}
		if !ac.SigningKeys.Contains(mustPublic(a.Signer)) {
			problems = append(problems, fmt.Errorf("%s signing key is not listed in its account JWT", a.Name))
		}
	}
	return problems
}

// OperatorClaims decodes the operator JWT.
func (m *Keys) OperatorClaims() (*jwt.OperatorClaims, error) {
	return jwt.DecodeOperatorClaims(m.OperatorJWT)
}

// Accounts lists the four accounts in a fixed order: system, data, plane, callout.
func (m *Keys) Accounts() []Account { return []Account{m.System, m.Data, m.Plane, m.Callout} }

func mustPublic(kp nkeys.KeyPair) string {
	pub, err := kp.PublicKey()
	if err != nil {
		panic("space: key without public key: " + err.Error())
	}
	return pub
}
