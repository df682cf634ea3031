package integration

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// ownerP is a platform holder: the owner of the platform admin's principal.
const ownerP = "p_pppppppppppppppppppppppppp"

// newOwner returns a fresh `u_` owner.
func newOwner(t testing.TB) string {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "u_" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b))
}

// platformAdmin is a platform admin (ownerP.admin, holding platform-admin) calling a plane
// through the client package, on its own connection.
type platformAdmin struct {
	t  testing.TB
	nc *nats.Conn
	c  *client.Client
}

// newPlatformAdmin grants ownerP.actor platform-admin on p and connects it with a caller
// credential.
func newPlatformAdmin(t testing.TB, p *testPlane, actor string) *platformAdmin {
	t.Helper()
	grant(t, p, ownerP, actor, "platform-admin")
	nc := callerConn(t, p, ownerP, actor)
	c, err := principalClient(nc, ownerP, actor)
	if err != nil {
		t.Fatal(err)
	}
	return &platformAdmin{t: t, nc: nc, c: c}
}

// supervisedPlane starts a plane from testConfig changed by mutate (which may be nil), a
// platform admin on it, and one lifecycle of a fresh owner assigned until end and registered
// (prepared and activated) through supervisor-authority.
func supervisedPlane(t testing.TB, mutate func(*service.Config), end time.Time) (*testPlane, *platformAdmin, *supervised) {
	t.Helper()
	p := startPlane(t, mutate)
	pa := newPlatformAdmin(t, p, "admin")
	s := pa.assign(end)
	pa.register(s)
	return p, pa, s
}

// callCtx is a context for one call.
func callCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// supervised is one lifecycle a platform admin runs on an owner's behalf: the owner, the
// manager's keys (its instance and lifecycle), the assignment, and what the admin was issued.
type supervised struct {
	owner string
	m     *managerKeys
	a     *client.Assignment
	prep  *client.Material
	act   *client.Material
}

// assign assigns a fresh manager of a fresh owner until expires, and fails the test on a
// refusal.
func (pa *platformAdmin) assign(expires time.Time) *supervised {
	pa.t.Helper()
	s := &supervised{owner: newOwner(pa.t), m: newManagerKeys(pa.t)}
	a, err := pa.c.Assign(callCtx(pa.t), s.assignBody(expires))
	if err != nil {
		pa.t.Fatalf("assign: %v", err)
	}
	s.a = a
	return s
}

// assignBody is the supervisor-assign body of s until expires.
func (s *supervised) assignBody(expires time.Time) client.Assign {
	return client.Assign{Owner: s.owner, InstanceID: s.m.iid, LifecycleUID: s.m.uid, ExpiresAt: expires.Unix()}
}

// body is the supervisor-authority body of operation op for s, carrying what op needs from the
// materials issued so far.
func (pa *platformAdmin) body(s *supervised, op string) client.SupervisorAuthority {
	b := pa.c.SupervisorBody(s.owner, s.a.Revision, op, s.m.Manager)
	switch op {
	case client.OpActivate:
		b.Request.RegistrationProof = &s.prep.RegistrationProof
	case client.OpRenew, client.OpRenewStandingBundle:
		r := s.act.Renewal()
		b.Request.RegistrationProof, b.Request.AccountPublicKey, b.Request.ProcessEpoch = &r.Proof, &r.Account, &r.Epoch
	}
	return b
}

// authority asks for operation op of s.
func (pa *platformAdmin) authority(s *supervised, op string) (*client.Material, error) {
	return pa.c.SupervisorAuthority(callCtx(pa.t), pa.body(s, op))
}

// register prepares and activates s through supervisor-authority.
func (pa *platformAdmin) register(s *supervised) {
	pa.t.Helper()
	var err error
	if s.prep, err = pa.authority(s, client.OpPrepare); err != nil {
		pa.t.Fatalf("supervised prepare: %v", err)
	}
	if s.act, err = pa.authority(s, client.OpActivate); err != nil {
		pa.t.Fatalf("supervised activate: %v", err)
	}
}

// end ends s's assignment.
func (pa *platformAdmin) end(s *supervised) (*client.EndReport, error) {
	return pa.c.End(callCtx(pa.t), client.End{Owner: s.owner, InstanceID: s.m.iid, LifecycleUID: s.m.uid, Reason: "the engagement is over"})
}

// ownRenewal is s's own supervisor (or executor) renewing through manager-authority over
// nc, a connection made with that duty's credential.
func ownRenewal(nc *nats.Conn, s *supervised, d subjects.Duty, op string) outcome {
	c, err := client.New(nc, testSpace, s.owner, subjects.DutyActor(d, s.m.iid, ""))
	if err != nil {
		return outcome{code: "transport", message: err.Error()}
	}
	b, r := c.Body(op, s.m.Manager), s.act.Renewal()
	b.RegistrationProof, b.AccountPublicKey, b.ProcessEpoch = &r.Proof, &r.Account, &r.Epoch
	return askAsync(nc, s.owner, subjects.DutyActor(d, s.m.iid, ""), subjects.EndpointManagerAuthority, b)
}

// wantRefusal fails the test unless err is a refusal with code whose message contains text.
func wantRefusalOf(t testing.TB, what string, err error, code, text string) {
	t.Helper()
	var r *client.Refusal
	if !errors.As(err, &r) {
		t.Fatalf("%s: got %v, want refusal %s", what, err, code)
	}
	if r.Code != code || !strings.Contains(r.Message, text) {
		t.Fatalf("%s: got %s %q, want %s containing %q", what, r.Code, r.Message, code, text)
	}
}

// endedText is the reference's text for everything an ended assignment once allowed.
func endedText(owner string) string {
	return "platform supervisor assignment for owner " + owner + " has ended; its lifecycle has ended and material issued under it authorizes nothing"
}

// claimsOf decodes every credential of materials, failing the test on one that does not.
func claimsOf(t testing.TB, materials ...*client.Material) map[string][]*jwt.UserClaims {
	t.Helper()
	out := map[string][]*jwt.UserClaims{}
	for _, m := range materials {
		for duty, c := range m.Credentials {
			uc, err := jwt.DecodeUserClaims(c.JWT)
			if err != nil {
				t.Fatalf("%s %s: %v", m.Operation, duty, err)
			}
			out[duty] = append(out[duty], uc)
		}
	}
	return out
}

// seqs are the last sequences of the stores a refusal must not write.
type seqs map[string]uint64

// storeSeqs reads the last sequence of each store a supervisor call may write.
func storeSeqs(t testing.TB, p *testPlane) seqs {
	t.Helper()
	out := seqs{}
	for _, name := range []string{subjects.MintedStream(testSpace), subjects.AuthBucket(testSpace), subjects.PlatformBucket(testSpace),
		subjects.IssuedBucket(testSpace), subjects.AcceptedBucket(testSpace)} {
		out[name] = lastSeq(t, p, name)
	}
	return out
}

// except returns s without the stores named.
func (s seqs) except(names ...string) seqs {
	out := seqs{}
	for name, seq := range s {
		if !slices.Contains(names, name) {
			out[name] = seq
		}
	}
	return out
}

// wantUnwritten fails the test if any store of before moved since.
func wantUnwritten(t testing.TB, p *testPlane, what string, before seqs) {
	t.Helper()
	now := storeSeqs(t, p)
	for name, seq := range before {
		if now[name] != seq {
			t.Errorf("%s: %s moved from sequence %d to %d; a refusal writes nothing but its record", what, name, seq, now[name])
		}
	}
}
