// Package client is the Go client a manager process imports to call the authority plane over
// NATS as one principal: typed requests and replies for manager-service authority, and a
// Refusal error that carries the plane's refusal code. It sets the principal's inbox prefix
// itself, the only place the plane answers.
package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/subjects"
)

// DefaultTimeout bounds a request whose context has no deadline.
const DefaultTimeout = 10 * time.Second

// Client calls the plane of one space as one principal, `<owner>.<actor>`.
type Client struct {
	nc    *nats.Conn
	own   bool
	space string
	owner string
	actor string
}

// Connect connects to url as principal owner.actor of space, with the principal's inbox
// prefix set. opts carry the credential (nats.UserCredentials, nats.UserJWTAndSeed, …). Close
// closes the connection.
func Connect(url, space, owner, actor string, opts ...nats.Option) (*Client, error) {
	if err := checkPrincipal(space, owner, actor); err != nil {
		return nil, err
	}
	all := append([]nats.Option{
		nats.CustomInboxPrefix(subjects.InboxPrefix(owner, actor)),
		nats.Name("cotal " + subjects.Principal(owner, actor)),
	}, opts...)
	nc, err := nats.Connect(url, all...)
	if err != nil {
		return nil, fmt.Errorf("connect as %s: %w", subjects.Principal(owner, actor), err)
	}
	return &Client{nc: nc, own: true, space: space, owner: owner, actor: actor}, nil
}

// New returns a client on a connection the caller made and keeps. Its inbox prefix must be the
// principal's (nats.CustomInboxPrefix(subjects.InboxPrefix(owner, actor))), or no answer could
// reach it.
func New(nc *nats.Conn, space, owner, actor string) (*Client, error) {
	if err := checkPrincipal(space, owner, actor); err != nil {
		return nil, err
	}
	if want := subjects.InboxPrefix(owner, actor) + "."; !strings.HasPrefix(nc.NewRespInbox(), want) {
		return nil, fmt.Errorf("the connection's inbox prefix is not %s: the plane answers %s only there", want, subjects.Principal(owner, actor))
	}
	return &Client{nc: nc, space: space, owner: owner, actor: actor}, nil
}

func checkPrincipal(space, owner, actor string) error {
	switch {
	case !subjects.ValidSpace(space):
		return fmt.Errorf("space %q: want [a-z0-9][a-z0-9_-]{0,31}", space)
	case !subjects.ValidOwner(owner):
		return fmt.Errorf("owner %q: want u_ or p_ followed by 26 base32-lower characters", owner)
	case !subjects.ValidActor(actor):
		return fmt.Errorf("actor %q: want [A-Za-z0-9_]{1,64}", actor)
	}
	return nil
}

// Conn is the client's connection.
func (c *Client) Conn() *nats.Conn { return c.nc }

// Close closes the connection if Connect made it.
func (c *Client) Close() {
	if c.own {
		c.nc.Close()
	}
}

// Refusal is the plane's answer to a request it refused.
type Refusal struct {
	// Code is one of docs/PROTOCOL.md's ("Conventions"): bad-request, permission-denied, conflict, …
	Code string
	// Numeric is the `Nats-Service-Error-Code` header: 400, 403, 409, …
	Numeric int
	Message string
	// Details is what some refusals carry beside the message, as sent.
	Details json.RawMessage
}

// Error returns "<code>: <message>".
func (r *Refusal) Error() string { return r.Code + ": " + r.Message }

// CodeOf returns the refusal code of err, or "" when err is not a refusal.
func CodeOf(err error) string {
	var r *Refusal
	if errors.As(err, &r) {
		return r.Code
	}
	return ""
}

// Do sends body (marshalled, unless it is a []byte or a string) on endpoint as the client's
// principal and returns the reply's data, or a *Refusal.
func (c *Client) Do(ctx context.Context, endpoint string, body any) ([]byte, error) {
	msg, err := c.Request(ctx, endpoint, body)
	if err != nil {
		return nil, err
	}
	return Decode(msg)
}

// Request is Do without the decoding: it returns the answer as it came, headers and all, for
// tools that look at the wire.
func (c *Client) Request(ctx context.Context, endpoint string, body any) (*nats.Msg, error) {
	var data []byte
	switch b := body.(type) {
	case []byte:
		data = b
	case string:
		data = []byte(b)
	default:
		var err error
		if data, err = json.Marshal(body); err != nil {
			return nil, err
		}
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	msg, err := c.nc.RequestWithContext(ctx, subjects.EndpointSubject(c.space, endpoint, c.owner, c.actor), data)
	if err != nil {
		return nil, fmt.Errorf("%s as %s: %w", endpoint, subjects.Principal(c.owner, c.actor), err)
	}
	return msg, nil
}

// Decode returns the data of an answer from the plane, or the *Refusal it carries.
func Decode(msg *nats.Msg) ([]byte, error) {
	code := msg.Header.Get("Nats-Service-Error-Code")
	if code == "" {
		return msg.Data, nil
	}
	var e struct {
		Error struct {
			Code    string          `json:"code"`
			Message string          `json:"message"`
			Details json.RawMessage `json:"details"`
		} `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &e); err != nil {
		return nil, fmt.Errorf("a refusal (%s %s) whose body does not decode: %w", code, msg.Header.Get("Nats-Service-Error"), err)
	}
	n, err := strconv.Atoi(code)
	if err != nil {
		return nil, fmt.Errorf("a refusal whose code %q is not a number", code)
	}
	return nil, &Refusal{Code: e.Error.Code, Numeric: n, Message: e.Error.Message, Details: e.Error.Details}
}

// Manager is what a manager process tells the plane about itself: its instance, its lifecycle
// and the public nkeys of its five duties.
type Manager struct {
	InstanceID   string
	LifecycleUID string
	Identities   Identities
}

// NewManager returns a fresh manager: a new instance id and lifecycle uid, and five duty nkeys
// it generated, whose seeds stay with the caller.
func NewManager() (Manager, map[subjects.Duty]nkeys.KeyPair, error) {
	m := Manager{InstanceID: subjects.NewUID(), LifecycleUID: subjects.NewUID()}
	keys := map[subjects.Duty]nkeys.KeyPair{}
	set := map[subjects.Duty]*Identity{
		subjects.DutySupervisor: &m.Identities.Supervisor, subjects.DutyExecutor: &m.Identities.Executor,
		subjects.DutyServe: &m.Identities.Serve, subjects.DutyGoalWriter: &m.Identities.GoalWriter,
		subjects.DutySessionLedger: &m.Identities.SessionLedger,
	}
	for _, d := range subjects.StandingDuties {
		kp, err := nkeys.CreateUser()
		if err != nil {
			return Manager{}, nil, err
		}
		pub, err := kp.PublicKey()
		if err != nil {
			return Manager{}, nil, err
		}
		keys[d], set[d].ID = kp, pub
	}
	return m, keys, nil
}

// Envelope returns the envelope of a request of kind about m, sent by this client's actor
// under a fresh request id; the caller adds what the request carries beyond it.
func (c *Client) Envelope(kind string, m Manager) Envelope {
	identities := m.Identities
	return Envelope{
		V: 1, Kind: kind, Space: c.space, Actor: c.actor,
		InstanceID: m.InstanceID, ManagerLifecycleUID: m.LifecycleUID, RequestID: subjects.NewRequestID(),
		Identities: &identities,
	}
}

// current returns the envelope of kind about m carrying r: what every request past activate
// presents.
func (c *Client) current(kind string, m Manager, r Renewal) Envelope {
	env := c.Envelope(kind, m)
	env.RegistrationProof, env.AccountPublicKey, env.ProcessEpoch = &r.Proof, &r.Account, &r.Epoch
	return env
}

// Body returns the manager-service-authority body of operation op for m; the caller adds the
// operation's keys.
func (c *Client) Body(op string, m Manager) ServiceAuthority {
	return ServiceAuthority{Envelope: c.Envelope(KindServiceAuthority, m), Operation: op}
}

// ServiceAuthority sends one manager-service-authority body and decodes the material.
func (c *Client) ServiceAuthority(ctx context.Context, body ServiceAuthority) (*Material, error) {
	var m Material
	if err := c.call(ctx, subjects.EndpointManagerAuthority, body, &m); err != nil {
		return nil, err
	}
	return &m, nil
}

// call sends body on endpoint and decodes the reply into reply.
func (c *Client) call(ctx context.Context, endpoint string, body, reply any) error {
	data, err := c.Do(ctx, endpoint, body)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, reply); err != nil {
		return fmt.Errorf("%s: reply does not decode: %w", endpoint, err)
	}
	return nil
}

// Prepare registers m (or re-registers it, advancing its process epoch) and returns the
// supervisor and executor credentials and the registrationProof Activate needs. The caller
// needs scope `supervise`.
func (c *Client) Prepare(ctx context.Context, m Manager) (*Material, error) {
	return c.ServiceAuthority(ctx, c.Body(OpPrepare, m))
}

// Activate presents prepare's registrationProof and returns the serve, goalWriter and
// sessionLedger credentials, and in NextRegistrationProof the proof renewals carry.
func (c *Client) Activate(ctx context.Context, m Manager, registrationProof string) (*Material, error) {
	b := c.Body(OpActivate, m)
	b.RegistrationProof = &registrationProof
	return c.ServiceAuthority(ctx, b)
}

// Renew returns fresh supervisor and executor credentials.
func (c *Client) Renew(ctx context.Context, m Manager, r Renewal) (*Material, error) {
	return c.ServiceAuthority(ctx, ServiceAuthority{Envelope: c.current(KindServiceAuthority, m, r), Operation: OpRenew})
}

// RenewStandingBundle returns fresh credentials for all five duties.
func (c *Client) RenewStandingBundle(ctx context.Context, m Manager, r Renewal) (*Material, error) {
	return c.ServiceAuthority(ctx, ServiceAuthority{Envelope: c.current(KindServiceAuthority, m, r), Operation: OpRenewStandingBundle})
}

// NewRunID returns a fresh run id: `run-` and 32 lowercase hex.
func NewRunID() string { return "run-" + subjects.NewSecret(16) }

// Admit asks the plane to admit run runID, started by the run-start subject a caller
// published, to m.
func (c *Client) Admit(ctx context.Context, m Manager, r Renewal, runID, subject string) (*AdmissionReply, error) {
	var reply AdmissionReply
	body := RunAdmission{Envelope: c.current(KindRunAdmission, m, r), Run: RunStart{RunID: runID, Subject: subject}}
	if err := c.call(ctx, subjects.EndpointManagerAuthority, body, &reply); err != nil {
		return nil, err
	}
	return &reply, nil
}

// Attempt takes over an admitted run for m: its driver and mediator credentials for a.
func (c *Client) Attempt(ctx context.Context, m Manager, r Renewal, a Attempt) (*RunMaterial, error) {
	var reply RunMaterial
	body := RunAttempt{Envelope: c.current(KindRunAttempt, m, r), Attempt: a}
	if err := c.call(ctx, subjects.EndpointManagerAuthority, body, &reply); err != nil {
		return nil, err
	}
	return &reply, nil
}

// RenewRunDriver renews the driver and mediator credentials of a run m holds.
func (c *Client) RenewRunDriver(ctx context.Context, m Manager, r Renewal, hold RunHold) (*RunMaterial, error) {
	var reply RunMaterial
	body := ServiceAuthority{Envelope: c.current(KindServiceAuthority, m, r), Operation: OpRenewRunDriver, Run: &hold}
	if err := c.call(ctx, subjects.EndpointManagerAuthority, body, &reply); err != nil {
		return nil, err
	}
	return &reply, nil
}

// ReportStatus reports a run's status; the client must be the run's driver principal.
func (c *Client) ReportStatus(ctx context.Context, s RunStatus) (*StatusReply, error) {
	s.V, s.Kind, s.Space = 1, KindRunStatus, c.space
	var reply StatusReply
	if err := c.call(ctx, subjects.EndpointManagerAuthority, s, &reply); err != nil {
		return nil, err
	}
	return &reply, nil
}

// Revoke revokes run runID of m for good, on the run-revoke endpoint. The caller is the run's
// admitted owner or holds `admin`, and presents m's current proof.
func (c *Client) Revoke(ctx context.Context, m Manager, r Renewal, runID, reason string) (*RevokeReply, error) {
	var reply RevokeReply
	body := RunRevoke{Envelope: c.current(KindRunRevoke, m, r), Revoke: Revoke{RunID: runID, Reason: reason}}
	if err := c.call(ctx, subjects.EndpointRunRevoke, body, &reply); err != nil {
		return nil, err
	}
	return &reply, nil
}
