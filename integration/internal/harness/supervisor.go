package harness

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// OwnerP is a platform holder: the owner of the platform admin's principal.
const OwnerP = "p_pppppppppppppppppppppppppp"

// NewOwner returns a fresh `u_` owner.
func NewOwner(t testing.TB) string {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "u_" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b))
}

// PlatformAdmin is a platform admin (ownerP.admin, holding platform-admin) calling a plane
// through the client package, on its own connection.
type PlatformAdmin struct {
	t  testing.TB
	Nc *nats.Conn
	C  *client.Client
}

// NewPlatformAdmin grants ownerP.actor platform-admin on p and connects it with a caller
// credential.
func NewPlatformAdmin(t testing.TB, p *TestPlane, actor string) *PlatformAdmin {
	t.Helper()
	Grant(t, p, OwnerP, actor, "platform-admin")
	nc := CallerConn(t, p, OwnerP, actor)
	c, err := PrincipalClient(nc, OwnerP, actor)
	if err != nil {
		t.Fatal(err)
	}
	return &PlatformAdmin{t: t, Nc: nc, C: c}
}

// SupervisedPlane starts a plane from testConfig changed by mutate (which may be nil), a
// platform admin on it, and one lifecycle of a fresh owner assigned until end and registered
// (prepared and activated) through supervisor-authority.
func SupervisedPlane(t testing.TB, mutate func(*service.Config), end time.Time) (*TestPlane, *PlatformAdmin, *Supervised) {
	t.Helper()
	p := StartPlane(t, mutate)
	pa := NewPlatformAdmin(t, p, "admin")
	s := pa.Assign(end)
	pa.Register(s)
	return p, pa, s
}

// CallCtx is a context for one call: 15 s, as a client would give it. It is not stretched by
// the machine's load: a caller that retries (testkit.CheckFor around an end while a node is
// down) needs each unanswered call to give up in time for the next.
func CallCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Supervised is one lifecycle a platform admin runs on an owner's behalf: the owner, the
// manager's keys (its instance and lifecycle), the assignment, and what the admin was issued.
type Supervised struct {
	Owner string
	M     *ManagerKeys
	A     *client.Assignment
	Prep  *client.Material
	Act   *client.Material
}

// Assign assigns a fresh manager of a fresh owner until expires, and fails the test on a
// refusal.
func (pa *PlatformAdmin) Assign(expires time.Time) *Supervised {
	pa.t.Helper()
	s := &Supervised{Owner: NewOwner(pa.t), M: NewManagerKeys(pa.t)}
	a, err := pa.C.Assign(CallCtx(pa.t), s.AssignBody(expires))
	if err != nil {
		pa.t.Fatalf("assign: %v", err)
	}
	s.A = a
	return s
}

// AssignBody is the supervisor-assign body of s until expires.
func (s *Supervised) AssignBody(expires time.Time) client.Assign {
	return client.Assign{Owner: s.Owner, InstanceID: s.M.Iid, LifecycleUID: s.M.Uid, ExpiresAt: expires.Unix()}
}

// Body is the supervisor-authority body of operation op for s, carrying what op needs from the
// materials issued so far.
func (pa *PlatformAdmin) Body(s *Supervised, op string) client.SupervisorAuthority {
	b := pa.C.SupervisorBody(s.Owner, s.A.Revision, op, s.M.Manager)
	switch op {
	case client.OpActivate:
		b.Request.RegistrationProof = &s.Prep.RegistrationProof
	case client.OpRenew, client.OpRenewStandingBundle:
		r := s.Act.Renewal()
		b.Request.RegistrationProof, b.Request.AccountPublicKey, b.Request.ProcessEpoch = &r.Proof, &r.Account, &r.Epoch
	}
	return b
}

// Authority asks for operation op of s.
func (pa *PlatformAdmin) Authority(s *Supervised, op string) (*client.Material, error) {
	return pa.C.SupervisorAuthority(CallCtx(pa.t), pa.Body(s, op))
}

// Register prepares and activates s through supervisor-authority, each sent again (as a
// manager would) while it answers unavailable: a first prepare waits for a signing of the data
// account's JWT, which a loaded machine may not make by the deadline.
func (pa *PlatformAdmin) Register(s *Supervised) {
	pa.t.Helper()
	var err error
	for _, op := range []string{client.OpPrepare, client.OpActivate} {
		var m *client.Material
		for try := 1; ; try++ {
			var r *client.Refusal
			if m, err = pa.Authority(s, op); err == nil || !errors.As(err, &r) || r.Code != "unavailable" || try == 4 {
				break
			}
		}
		if err != nil {
			pa.t.Fatalf("supervised %s: %v", op, err)
		}
		if op == client.OpPrepare {
			s.Prep = m
		} else {
			s.Act = m
		}
	}
}

// End ends s's assignment.
func (pa *PlatformAdmin) End(s *Supervised) (*client.EndReport, error) {
	return pa.C.End(CallCtx(pa.t), client.End{Owner: s.Owner, InstanceID: s.M.Iid, LifecycleUID: s.M.Uid, Reason: "the engagement is over"})
}

// OwnRenewal is s's own supervisor (or executor) renewing through manager-authority over
// nc, a connection made with that duty's credential.
func OwnRenewal(nc *nats.Conn, s *Supervised, d subjects.Duty, op string) Outcome {
	c, err := client.New(nc, TestSpace, s.Owner, subjects.DutyActor(d, s.M.Iid, ""))
	if err != nil {
		return Outcome{Code: "transport", Message: err.Error()}
	}
	b, r := c.Body(op, s.M.Manager), s.Act.Renewal()
	b.RegistrationProof, b.AccountPublicKey, b.ProcessEpoch = &r.Proof, &r.Account, &r.Epoch
	return AskAsync(nc, s.Owner, subjects.DutyActor(d, s.M.Iid, ""), subjects.EndpointManagerAuthority, b)
}

// wantRefusal fails the test unless err is a refusal with code whose message contains text.
func WantRefusalOf(t testing.TB, what string, err error, code, text string) {
	t.Helper()
	var r *client.Refusal
	if !errors.As(err, &r) {
		t.Fatalf("%s: got %v, want refusal %s", what, err, code)
	}
	if r.Code != code || !strings.Contains(r.Message, text) {
		t.Fatalf("%s: got %s %q, want %s containing %q", what, r.Code, r.Message, code, text)
	}
}

// Seqs are the last sequences of the stores a refusal must not write.
type Seqs map[string]uint64

// StoreSeqs reads the last sequence of each store a supervisor call may write.
func StoreSeqs(t testing.TB, p *TestPlane) Seqs {
	t.Helper()
	out := Seqs{}
	for _, name := range []string{subjects.MintedStream(TestSpace), subjects.AuthBucket(TestSpace), subjects.PlatformBucket(TestSpace),
		subjects.IssuedBucket(TestSpace), subjects.AcceptedBucket(TestSpace)} {
		out[name] = LastSeq(t, p, name)
	}
	return out
}

// Except returns s without the stores named.
func (s Seqs) Except(names ...string) Seqs {
	out := Seqs{}
	for name, seq := range s {
		if !slices.Contains(names, name) {
			out[name] = seq
		}
	}
	return out
}

// WantUnwritten fails the test if any store of before moved since, but for what a request
// refused after signing leaves in the fence bucket by design (docs/SECURITY.md): the tenant
// budgets it spent (`budget.*`: a budget counts attempts), and a first registration's instance
// key listed on the signer set (`signers.*`), which the sweep takes off.
func WantUnwritten(t testing.TB, p *TestPlane, what string, before Seqs) {
	t.Helper()
	now := StoreSeqs(t, p)
	for name, seq := range before {
		if now[name] == seq {
			continue
		}
		if name == subjects.AuthBucket(TestSpace) && onlySpent(t, p, name, seq, now[name]) {
			continue
		}
		t.Errorf("%s: %s moved from sequence %d to %d; a refusal writes nothing but its record", what, name, seq, now[name])
	}
}

// onlySpent says whether every message of bucket after sequence from, up to to, that is still
// there is a tenant budget's row or the signer set's. A message gone was replaced by a later
// write of its key, which is in the range and read.
func onlySpent(t testing.TB, p *TestPlane, bucket string, from, to uint64) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := p.JS(t).Stream(ctx, streamOf(bucket))
	if err != nil {
		t.Fatalf("stream %s: %v", bucket, err)
	}
	budgets, signers := "$KV."+bucket+".budget.", "$KV."+bucket+".signers."
	for seq := from + 1; seq <= to; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatalf("stream %s message %d: %v", bucket, seq, err)
		}
		if !strings.HasPrefix(m.Subject, budgets) && !strings.HasPrefix(m.Subject, signers) {
			return false
		}
	}
	return true
}

// EvictionWatch is a connection made with one duty's credential, watched for the broker
// closing it.
type EvictionWatch struct {
	Nc     *nats.Conn
	Closed chan struct{}
	errs   *AsyncErrors
}

// WatchDuty connects to url as duty d of s with credential token, and never reconnects: a
// revocation must close it for good.
func WatchDuty(t testing.TB, url string, s *Supervised, d subjects.Duty, token string) *EvictionWatch {
	t.Helper()
	w := &EvictionWatch{Closed: make(chan struct{}), errs: &AsyncErrors{}}
	seed, err := s.M.Keys[d].Seed()
	if err != nil {
		t.Fatal(err)
	}
	w.Nc, err = nats.Connect(url, nats.UserJWTAndSeed(token, string(seed)),
		nats.CustomInboxPrefix(subjects.InboxPrefix(s.Owner, subjects.DutyActor(d, s.M.Iid, ""))),
		nats.NoReconnect(), w.errs.Option(),
		nats.ClosedHandler(func(*nats.Conn) { close(w.Closed) }))
	if err != nil {
		t.Fatalf("connect as %s before the end: %v", d, err)
	}
	t.Cleanup(w.Nc.Close)
	Flush(t, w.Nc)
	return w
}

// WantEvicted fails the test unless the broker closed the connection: when the key that
// signed its credential leaves the account JWT, nats-server closes it without a word (the
// client reads EOF; a revocation list would have said "revoked").
func (w *EvictionWatch) WantEvicted(t testing.TB, d subjects.Duty) {
	t.Helper()
	select {
	case <-w.Closed:
	case <-time.After(5 * time.Second):
		t.Fatalf("the %s connection is still open after the end: %v %s %v %v", d, w.Nc.Status(), w.Nc.ConnectedUrl(), w.Nc.LastError(), w.errs.All())
	}
	if err := w.Nc.LastError(); err != nil && !errors.Is(err, io.EOF) && !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Errorf("the %s connection: closed with %v (async %v), want the broker to close it", d, err, w.errs.All())
	}
}

// WantRefusedToConnect fails the test unless the broker at url refuses duty d's credential.
func WantRefusedToConnect(t testing.TB, url string, s *Supervised, d subjects.Duty, token string) {
	t.Helper()
	seed, err := s.M.Keys[d].Seed()
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(url, nats.UserJWTAndSeed(token, string(seed)), nats.MaxReconnects(0))
	if err == nil {
		nc.Close()
		t.Fatalf("the %s credential connected to %s after the end, want it refused", d, url)
	}
	if !errors.Is(err, nats.ErrAuthorization) && !strings.Contains(strings.ToLower(err.Error()), "revoked") && !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Fatalf("the %s credential at %s: got %v, want an authorization refusal", d, url, err)
	}
}

// WantEndReport checks an end's reply describes the final state of s's end: ended, both
// generations and the gate retired, every key minted for the instance revoked and confirmed,
// and no connection of them left.
func WantEndReport(t testing.TB, s *Supervised, r *client.EndReport, minted []string) {
	t.Helper()
	if r.Owner != s.Owner || r.InstanceID != s.M.Iid || r.LifecycleUID != s.M.Uid {
		t.Errorf("end report names %s %s %s, want %s %s %s", r.Owner, r.InstanceID, r.LifecycleUID, s.Owner, s.M.Iid, s.M.Uid)
	}
	if r.Assignment.State != client.StateEnded || r.Assignment.Revision <= s.A.Revision {
		t.Errorf("end report assignment: got %+v, want ended at a revision after %d", r.Assignment, s.A.Revision)
	}
	var duties []string
	for _, g := range r.Retired.Generations {
		duties = append(duties, g.Duty)
	}
	if !slices.Equal(duties, []string{"supervisor", "executor"}) || r.Retired.Gate != "retired" {
		t.Errorf("end report retired: got %+v, want the supervisor and executor generations and the gate", r.Retired)
	}
	if !r.Revoked.Done || !slices.Equal(r.Revoked.NKeys, minted) || r.Revoked.Reason != "" {
		t.Errorf("end report revoked: got %+v, want done with every minted key %v", r.Revoked, minted)
	}
	if !r.Evicted.Complete || r.Evicted.Count != len(minted) {
		t.Errorf("end report evicted: got %+v, want complete for %d keys", r.Evicted, len(minted))
	}
}

// EndEvicting ends s and fails the test unless the report is complete and the broker closed
// the supervisor's and the executor's connections.
func EndEvicting(t testing.TB, pa *PlatformAdmin, s *Supervised, sup, exec *EvictionWatch) *client.EndReport {
	t.Helper()
	report, err := pa.End(s)
	if err != nil {
		t.Fatalf("end: %v", err)
	}
	WantEndReport(t, s, report, IdentityKeys(t, s.M))
	sup.WantEvicted(t, subjects.DutySupervisor)
	exec.WantEvicted(t, subjects.DutyExecutor)
	return report
}

// IdentityKeys are the five duty keys of m, sorted: what a registered instance's minted
// records name.
func IdentityKeys(t testing.TB, m *ManagerKeys) []string {
	t.Helper()
	var out []string
	for _, d := range subjects.StandingDuties {
		out = append(out, m.Pub(t, d))
	}
	slices.Sort(out)
	return out
}

// SystemConn connects to the plane's broker as a system-account user with the plane's own
// system permissions (push and read back account JWTs, list connections).
func SystemConn(t testing.TB, p *TestPlane) *nats.Conn {
	t.Helper()
	keys := p.Keys()
	iss, err := issue.NewIssuer(keys.System.Public(), keys.System.Signer, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	token, err := iss.Sign(issue.User{Name: "test.system", Key: pub, Expires: time.Now().Add(time.Hour),
		Permissions: subjects.SystemPermissions(keys.Data.Public(), keys.Plane.Public())})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(p.NATSURL(), nats.UserJWTAndSeed(token, string(seed)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// ConnectSendingName connects to p's data account as a JWT user of kp's key, named jwtName in
// its JWT, that sends sent as its user name beside the JWT (a client may send any), until the
// test ends.
func ConnectSendingName(t testing.TB, p *TestPlane, kp nkeys.KeyPair, jwtName, sent string) *nats.Conn {
	t.Helper()
	iss, err := issue.NewIssuer(p.Keys().Data.Public(), p.Keys().Data.Signer, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	auth, err := iss.ConnectAs(kp, jwtName, subjects.Permissions{Pub: []string{"_INBOX.>"}, Sub: []string{"_INBOX.>"}}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(p.NATSURL(), auth, nats.UserInfo(sent, ""), nats.MaxReconnects(0))
	if err != nil {
		t.Fatalf("connect as %s sending the user name %q beside the JWT: %v", jwtName, sent, err)
	}
	t.Cleanup(nc.Close)
	return nc
}
