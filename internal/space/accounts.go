package space

// The account policy of a space (DESIGN §3): which accounts exist, what each may do, and what
// they export and import. Key generation, the file layout and loading are material.go's.

import (
	"fmt"

	"github.com/nats-io/jwt/v2"

	"github.com/cotal-ai/authplane/subjects"
)

// signJWTs issues the operator and account JWTs (DESIGN §3).
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

	data := jwt.NewAccountClaims(dataPub)
	data.Name = m.Data.Name
	data.SigningKeys.Add(mustPublic(m.Data.Signer))
	// No JetStream: minted users live here, and an ack goes wherever its publisher says.
	data.Limits.JetStreamLimits = jwt.JetStreamLimits{}
	for _, subj := range subjects.RunStartExports(m.Space) {
		data.Exports.Add(&jwt.Export{Name: "run-start", Subject: jwt.Subject(subj), Type: jwt.Stream})
	}

	plane := jwt.NewAccountClaims(m.Plane.Public())
	plane.Name = m.Plane.Name
	plane.SigningKeys.Add(mustPublic(m.Plane.Signer))
	plane.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1, MaxAckPending: -1}
	for _, subj := range subjects.RunStartExports(m.Space) {
		plane.Imports.Add(&jwt.Import{Name: "run-start", Subject: jwt.Subject(subj), Account: dataPub, Type: jwt.Stream})
	}

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
