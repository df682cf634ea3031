package bench

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/internal/platform/broker"
	"github.com/cotal-ai/authplane/subjects"
)

// calloutCeiling is the callout ceiling: an auth callout on the plane's broker, for an account
// of its own that the bench adds (the space's callout account is the plane's), doing what the
// plane's callout does minus every store read and write: it opens the sealed request, checks
// it, signs a user of the data account with fixed caller permissions for the server-chosen
// nkey (with the plane's mint, so signing and its re-check cost the same), signs the answer
// and seals it. The bearer a connection presents is not read.
type calloutCeiling struct {
	nc *nats.Conn
	// sentinelJWT and sentinelSeed are a deny-all user of the ceiling's account: what a storm
	// connection presents with its bearer, as with the bundle's sentinel creds.
	sentinelJWT  string
	sentinelSeed string
	queue        chan queued
	done         chan struct{}
	workers      sync.WaitGroup
	// failed counts requests the ceiling could not answer, stale those it dropped for their age
	// or a full queue.
	failed, stale atomic.Int64
}

// ceilingPrincipal is the one principal every user the ceiling signs is.
const ceilingOwner, ceilingActor = "u_benchbenchbenchbenchbenchbe", "ceiling"

// startCeiling creates the ceiling's account (keys, signing key, curve key, callout user),
// signs its JWT with the operator signing key, pushes it to every server, waits until each
// holds it, and serves its callout on the broker.
func startCeiling(ctx context.Context, t Target, s *side, data *issue.Issuer) (_ *calloutCeiling, err error) {
	if t.Keys.OperatorSigner == nil {
		return nil, errors.New("the space material has no operator signing key: the ceiling's account cannot be signed")
	}
	account, err := nkeys.CreateAccount()
	if err != nil {
		return nil, err
	}
	signer, err := nkeys.CreateAccount()
	if err != nil {
		return nil, err
	}
	xkey, err := nkeys.CreateCurveKeys()
	if err != nil {
		return nil, err
	}
	user, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	pub, signerPub, xkeyPub, userPub := mustPub(account), mustPub(signer), mustPub(xkey), mustPub(user)
	ac := jwt.NewAccountClaims(pub)
	ac.Name = "bench_callout_ceiling"
	ac.SigningKeys.Add(signerPub)
	ac.Authorization = jwt.ExternalAuthorization{
		AuthUsers:       jwt.StringList{userPub},
		AllowedAccounts: jwt.StringList{t.Keys.Data.Public()},
		XKey:            xkeyPub,
	}
	token, err := ac.Encode(t.Keys.OperatorSigner)
	if err != nil {
		return nil, err
	}
	acct := broker.Account{NC: s.system, Public: pub}
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := acct.Push(pctx, token); err != nil {
		return nil, err
	}
	for {
		if _, err := acct.Lookup(pctx, s.servers); err == nil {
			break
		} else if pctx.Err() != nil {
			return nil, fmt.Errorf("not every server holds the ceiling's account: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// The answers are signed with the key derived once, as the plane's callout signs them.
	if signer, err = issue.Derived(signer); err != nil {
		return nil, err
	}
	iss, err := issue.NewIssuer(pub, signer, time.Now)
	if err != nil {
		return nil, err
	}
	c := &calloutCeiling{}
	sentinel, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	seed, err := sentinel.Seed()
	if err != nil {
		return nil, err
	}
	uc := jwt.NewUserClaims(mustPub(sentinel))
	uc.Name = "sentinel"
	uc.IssuerAccount = pub
	uc.Pub.Deny.Add(">")
	uc.Sub.Deny.Add(">")
	if c.sentinelJWT, err = uc.Encode(signer); err != nil {
		return nil, err
	}
	c.sentinelSeed = string(seed)

	auth, err := iss.ConnectAs(user, "bench.callout", subjects.CalloutPermissions(), sideTTL)
	if err != nil {
		return nil, err
	}
	if c.nc, err = nats.Connect(t.NATSURL, auth, nats.Name("authplane bench callout ceiling")); err != nil {
		return nil, fmt.Errorf("connect the ceiling's callout user: %w", err)
	}
	defer func() {
		if err != nil {
			c.nc.Close()
		}
	}()
	_, perms, err := subjects.PermissionsOf(subjects.DutyCaller, subjects.Holder{Space: t.Keys.Space, Owner: ceilingOwner, Actor: ceilingActor})
	if err != nil {
		return nil, err
	}
	// A storm asks faster than any callout answers: requests wait their turn, oldest first, and
	// one that waited past ceilingWait is dropped unanswered (the broker gives up on it at 2 s;
	// the client retries) instead of costing a decision nobody waits for. Without that, 5,000
	// at once made every decision late and 17 of 5,000 connected in two minutes.
	c.queue, c.done = make(chan queued, ceilingBacklog), make(chan struct{})
	for range ceilingWorkers * runtime.GOMAXPROCS(0) {
		c.workers.Go(func() {
			for {
				var q queued
				select {
				case <-c.done:
					return
				case q = <-c.queue:
				}
				if time.Since(q.at) > ceilingWait {
					c.stale.Add(1)
					continue
				}
				if err := c.answer(q.m, xkey, signer, pub, data, perms); err != nil {
					c.failed.Add(1)
				}
			}
		})
	}
	if _, err = c.nc.QueueSubscribe("$SYS.REQ.USER.AUTH", "bench-callout-ceiling", func(m *nats.Msg) {
		select {
		case c.queue <- queued{m: m, at: time.Now()}:
		default:
			c.stale.Add(1)
		}
	}); err != nil {
		close(c.done)
		return nil, err
	}
	return c, c.nc.Flush()
}

// The ceiling's queue: workers per CPU (its decisions wait on nothing but the broker), how
// many requests may wait, and for how long.
const (
	ceilingWorkers = 4
	ceilingBacklog = 8192
	ceilingWait    = time.Second
)

// queued is a request waiting for a worker, with when it came.
type queued struct {
	m  *nats.Msg
	at time.Time
}

// answer decides one request: open, check, sign the fixed user, sign the answer, seal.
func (c *calloutCeiling) answer(m *nats.Msg, xkey, signer nkeys.KeyPair, account string, data *issue.Issuer, perms subjects.Permissions) error {
	serverXKey := m.Header.Get("Nats-Server-Xkey")
	plain, err := xkey.Open(m.Data, serverXKey)
	if err != nil {
		return err
	}
	req, err := jwt.DecodeAuthorizationRequestClaims(string(plain))
	if err != nil {
		return err
	}
	vr := jwt.CreateValidationResults()
	req.Validate(vr)
	if vr.IsBlocking(true) || req.Server.XKey != serverXKey {
		return errors.New("not the server's request")
	}
	user, err := data.Sign(issue.User{Name: subjects.Principal(ceilingOwner, ceilingActor), Key: req.UserNkey, Permissions: perms,
		Expires: time.Now().Add(bearerLife), Limits: issue.DefaultLimits})
	if err != nil {
		return err
	}
	res := jwt.NewAuthorizationResponseClaims(req.UserNkey)
	res.Audience = req.Server.ID
	res.IssuerAccount = account
	res.Jwt = user
	token, err := res.Encode(signer)
	if err != nil {
		return err
	}
	sealed, err := xkey.Seal([]byte(token), serverXKey)
	if err != nil {
		return err
	}
	return m.Respond(sealed)
}

// bearerLife is how long the ceiling's users live: a bearer's longest life.
const bearerLife = 15 * time.Minute

// close stops the workers and closes the connection; a request still queued is not answered.
func (c *calloutCeiling) close() {
	close(c.done)
	c.workers.Wait()
	c.nc.Close()
}

func mustPub(kp nkeys.KeyPair) string {
	pub, err := kp.PublicKey()
	if err != nil {
		panic("bench: a fresh key without a public key: " + err.Error())
	}
	return pub
}
