package space

// The account policy of a space (docs/OPERATIONS.md, "What it runs"): which accounts exist, what each may do, and what
// they export and import. Key generation, the file layout and loading are material.go's.

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/subjects"
)

// DataPolicy is what the running plane sets on the data account beyond what the material
// says: its limits and the signing keys of its live manager instances.
type DataPolicy struct {
	// MaxConnections bounds the account's connections, the plane's own serving ones included;
	// 0 leaves them unbounded.
	MaxConnections int64
	// Signers are every signing key the JWT lists, plain (unscoped: a scoped key would override
	// the permissions of the users it signs): the account's own of each generation in use and
	// the live manager instances' (package signers); nil lists the material's own alone. A key
	// left off closes every connection whose credential it signed.
	Signers []string
	// Revoked revokes each JWT user's key's credentials issued up to its unix second: the keys
	// the plane holds out (package signers).
	Revoked map[string]int64
}

// ErrNoOperatorSigner means the operator signing key is kept elsewhere: the plane cannot
// re-sign an account JWT, and says so.
var ErrNoOperatorSigner = errors.New("the operator signing key is not in the space material")

// DataAccountJWT signs the data account's claims under p with the operator signing key, and
// returns the JWT and its issue time (unix seconds, from the wall clock: the JWT library stamps
// it). A push replaces what a resolver holds; resolvers syncing with each other keep the newer
// of two JWTs by that time. Without the operator signing key it
// is ErrNoOperatorSigner.
func (m *Keys) DataAccountJWT(p DataPolicy) (string, int64, error) {
	if m.OperatorSigner == nil {
		return "", 0, ErrNoOperatorSigner
	}
	claims := m.dataClaims(p)
	token, err := claims.Encode(m.OperatorSigner)
	if err != nil {
		return "", 0, fmt.Errorf("sign %s account JWT: %w", m.Data.Name, err)
	}
	return token, claims.IssuedAt, nil
}

// dataClaims are the data account's claims: every credential the plane mints lives here, so it
// has no JetStream, and it exports the run-starts its callers publish to the plane account.
func (m *Keys) dataClaims(p DataPolicy) *jwt.AccountClaims {
	data := jwt.NewAccountClaims(m.Data.Public())
	data.Name = m.Data.Name
	if p.Signers == nil {
		data.SigningKeys.Add(mustPublic(m.Data.Signer))
	}
	// No JetStream: minted users live here, and an ack goes wherever its publisher says.
	data.Limits.JetStreamLimits = jwt.JetStreamLimits{}
	if p.MaxConnections > 0 {
		data.Limits.Conn = p.MaxConnections
	}
	for _, key := range p.Signers {
		data.SigningKeys.Add(key)
	}
	for key, until := range p.Revoked {
		data.RevokeAt(key, time.Unix(until, 0))
	}
	for _, subj := range subjects.RunStartExports(m.Space) {
		data.Exports.Add(&jwt.Export{Name: "run-start", Subject: jwt.Subject(subj), Type: jwt.Stream})
	}
	// Auditors live here too: they reach the plane account's minted and audit streams only
	// through these imports, so every answer comes back to them, never into a stream.
	for _, r := range subjects.AuditorReads(m.Space) {
		data.Imports.Add(&jwt.Import{Name: "auditor", Subject: jwt.Subject(r.Remote), LocalSubject: jwt.RenamingSubject(r.Local),
			Account: m.Plane.Public(), Type: jwt.Service})
	}
	return data
}

// PlaneAccountJWT signs the plane account's claims with the operator signing key, for the
// broker's resolver: a start pushes it, so a space whose material predates an export gets it.
func (m *Keys) PlaneAccountJWT() (string, error) {
	if m.OperatorSigner == nil {
		return "", ErrNoOperatorSigner
	}
	token, err := m.planeClaims().Encode(m.OperatorSigner)
	if err != nil {
		return "", fmt.Errorf("sign %s account JWT: %w", m.Plane.Name, err)
	}
	return token, nil
}

// planeClaims are the plane account's claims: the plane's private state, with JetStream; it
// imports the run-starts for the witness and exports the read API of the minted and audit
// streams to the data account's auditors.
func (m *Keys) planeClaims() *jwt.AccountClaims {
	plane := jwt.NewAccountClaims(m.Plane.Public())
	plane.Name = m.Plane.Name
	plane.SigningKeys.Add(mustPublic(m.Plane.Signer))
	plane.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1, MaxAckPending: -1}
	for _, subj := range subjects.RunStartExports(m.Space) {
		plane.Imports.Add(&jwt.Import{Name: "run-start", Subject: jwt.Subject(subj), Account: m.Data.Public(), Type: jwt.Stream})
	}
	for _, r := range subjects.AuditorReads(m.Space) {
		e := &jwt.Export{Name: "auditor", Subject: jwt.Subject(r.Remote), Type: jwt.Service, ResponseType: jwt.ResponseTypeSingleton}
		if r.Stream {
			e.ResponseType = jwt.ResponseTypeStream
		}
		plane.Exports.Add(e)
	}
	// An auditor's requests reach JetStream through these, each about its own consumer.
	for from, to := range subjects.AuditorMappings(m.Space) {
		plane.AddMapping(jwt.Subject(from), jwt.WeightedMapping{Subject: jwt.Subject(to)})
	}
	return plane
}

// signJWTs issues the operator and account JWTs (docs/OPERATIONS.md, "What it runs").
func (m *Keys) signJWTs() error {
	opPub, opSigner := mustPublic(m.Operator), mustPublic(m.OperatorSigner)
	sysPub := m.System.Public()
	dataPub := m.Data.Public()

	op := jwt.NewOperatorClaims(opPub)
	op.Name = "cotal_" + m.Space
	op.SigningKeys.Add(opSigner)
	op.SystemAccount = sysPub
	op.StrictSigningKeyUsage = true
	var err error
	if m.OperatorJWT, err = op.Encode(m.Operator); err != nil {
		return fmt.Errorf("sign operator JWT: %w", err)
	}

	sys := jwt.NewAccountClaims(sysPub)
	sys.Name = m.System.Name
	sys.SigningKeys.Add(mustPublic(m.System.Signer))
	sys.Exports = jwt.Exports{
		&jwt.Export{Name: "account-monitoring-services", Subject: "$SYS.REQ.ACCOUNT.*.*", Type: jwt.Service, ResponseType: jwt.ResponseTypeStream, AccountTokenPosition: 4},
		&jwt.Export{Name: "account-monitoring-streams", Subject: "$SYS.ACCOUNT.*.>", Type: jwt.Stream, AccountTokenPosition: 3},
	}

	data := m.dataClaims(DataPolicy{})

	plane := m.planeClaims()

	callout := jwt.NewAccountClaims(m.Callout.Public())
	callout.Name = m.Callout.Name
	callout.SigningKeys.Add(mustPublic(m.Callout.Signer))
	callout.Authorization = jwt.ExternalAuthorization{
		AuthUsers:       jwt.StringList{mustPublic(m.CalloutUser)},
		AllowedAccounts: jwt.StringList{dataPub},
		XKey:            mustPublic(m.CalloutXKey),
	}

	for _, a := range []struct {
		acct   *Account
		claims *jwt.AccountClaims
	}{{&m.System, sys}, {&m.Data, data}, {&m.Plane, plane}, {&m.Callout, callout}} {
		if a.acct.JWT, err = a.claims.Encode(m.OperatorSigner); err != nil {
			return fmt.Errorf("sign %s account JWT: %w", a.acct.Name, err)
		}
	}
	return nil
}

// SentinelCreds returns creds of a fresh deny-all user of the callout account, for the
// discovery bundle: a client connects with them and its bearer as its token, and the broker
// hands the connection to the auth callout, which decides who it is. As itself the user may do
// nothing, and it never expires (every bundle's copy stays good).
func (m *Keys) SentinelCreds() ([]byte, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, err
	}
	seed, err := kp.Seed()
	if err != nil {
		return nil, err
	}
	uc := jwt.NewUserClaims(pub)
	uc.Name = "sentinel"
	uc.IssuerAccount = m.Callout.Public()
	uc.Pub.Deny.Add(">")
	uc.Sub.Deny.Add(">")
	token, err := uc.Encode(m.Callout.Signer)
	if err != nil {
		return nil, fmt.Errorf("sign the sentinel user: %w", err)
	}
	return jwt.FormatUserConfig(token, seed)
}
