package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/internal/platform/space"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/subjects"
)

// dataUserConn connects to p's broker as a fresh data-account user with grant g, signed with
// the data account's signing key the way the plane signs its own users.
func dataUserConn(t *testing.T, p *harness.TestPlane, name string, g subjects.Permissions, errs *harness.AsyncErrors) *nats.Conn {
	t.Helper()
	m := p.Keys()
	iss, err := issue.NewIssuer(m.Data.Public(), m.Data.Signer, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	auth, err := iss.Connect(name, g, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(p.NATSURL(), auth, errs.Option(), nats.Name(name), nats.MaxReconnects(0))
	if err != nil {
		t.Fatalf("connect as data-account user %s: %v", name, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func TestCallerCredentialIsForgeLockedByTheBroker(t *testing.T) {
	t.Parallel()
	p := harness.StartPlane(t, nil)
	errs := &harness.AsyncErrors{}
	nc := harness.CallerConn(t, p, harness.OwnerA, "cli", errs.Option())

	t.Run("publishing on its own plane subject is allowed", func(t *testing.T) {
		msg, err := nc.Request(subjects.EndpointSubject(harness.TestSpace, subjects.EndpointManagerAuthority, harness.OwnerA, "cli"), []byte("{}"), 5*time.Second)
		if err != nil {
			t.Fatalf("request on its own subject: %v", err)
		}
		if msg.Header.Get("Nats-Service-Error-Code") == "" && len(msg.Data) == 0 {
			t.Errorf("request on its own subject: got an empty answer, want the endpoint's")
		}
		if err := errs.Violation(subjects.EndpointSubject(harness.TestSpace, subjects.EndpointManagerAuthority, harness.OwnerA, "cli")); err != nil {
			t.Errorf("publishing on its own subject: got %v, want no violation", err)
		}
	})

	t.Run("discovering the service on $SRV is for ops credentials only", func(t *testing.T) {
		ops := harness.OpsConn(t, p, harness.OwnerA, "ops")
		ids := map[string]bool{}
		for _, info := range harness.ServiceInstances(t, ops) {
			ids[info.ID] = true
		}
		id := harness.ServiceInfo(t, ops).ID
		for _, subject := range []string{
			"$SRV.PING", "$SRV.INFO", "$SRV.STATS",
			"$SRV.PING." + subjects.ServiceName, "$SRV.INFO." + subjects.ServiceName, "$SRV.STATS." + subjects.ServiceName,
			"$SRV.PING." + subjects.ServiceName + "." + id, "$SRV.STATS." + subjects.ServiceName + "." + id,
		} {
			msg, err := ops.Request(subject, nil, 5*time.Second)
			if err != nil {
				t.Errorf("ops %s: %v, want the plane's answer", subject, err)
				continue
			}
			var got struct {
				ID string `json:"id"`
			}
			targeted := strings.HasSuffix(subject, "."+id)
			if err := json.Unmarshal(msg.Data, &got); err != nil || !ids[got.ID] || targeted && got.ID != id {
				t.Errorf("ops %s: got %q (%v), want an answer from one of the plane's service instances %v (%s when targeted)", subject, msg.Data, err, ids, id)
			}
			// A caller's discovery would be answered wherever its reply says: the broker
			// refuses the publish.
			if err := nc.PublishRequest(subject, subjects.InboxPrefix(harness.OwnerB, "cli")+".x", nil); err != nil {
				t.Fatal(err)
			}
			errs.WaitViolation(t, "Publish", subject)
		}
	})

	for _, tt := range []struct {
		name    string
		op      string
		subject string
	}{
		{"publishing as another owner", "Publish", subjects.EndpointSubject(harness.TestSpace, subjects.EndpointManagerAuthority, harness.OwnerB, "cli")},
		{"publishing as another actor of its owner", "Publish", subjects.EndpointSubject(harness.TestSpace, subjects.EndpointSupervisorEnd, harness.OwnerA, "other")},
		{"publishing as an actor that extends its own", "Publish", subjects.EndpointSubject(harness.TestSpace, subjects.EndpointRunRevoke, harness.OwnerA, "cliX")},
		{"publishing in another space", "Publish", subjects.EndpointSubject("other", subjects.EndpointManagerAuthority, harness.OwnerA, "cli")},
		{"publishing a run-start as another principal", "Publish", "cotal." + harness.TestSpace + ".ep.v1.one.manager.run-start." + harness.OwnerB + ".cli.uid.1.n"},
		{"publishing on the JetStream API", "Publish", "$JS.API.INFO"},
		{"publishing on the system account's subjects", "Publish", "$SYS.REQ.SERVER.PING"},
		{"subscribing to another principal's inbox", "Subscription", subjects.InboxPrefix(harness.OwnerB, "cli") + ".>"},
		{"subscribing to every inbox", "Subscription", "_INBOX.>"},
		{"subscribing to the plane's requests", "Subscription", subjects.AuthPrefix(harness.TestSpace) + ".>"},
		{"subscribing to everything", "Subscription", ">"},
	} {
		t.Run(tt.name+" is a permissions violation", func(t *testing.T) {
			var err error
			if tt.op == "Publish" {
				err = nc.Publish(tt.subject, []byte("{}"))
			} else {
				_, err = nc.SubscribeSync(tt.subject)
			}
			if err != nil {
				t.Fatalf("%s %s: %v", tt.op, tt.subject, err)
			}
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			errs.WaitViolation(t, tt.op, tt.subject)
		})
	}

	if nc.IsClosed() || !nc.IsConnected() {
		t.Errorf("after the violations: got connection status %v, want still connected", nc.Status())
	}
}

func TestRequestWhoseReplyIsNotTheCallersInboxIsDroppedUnansweredAndCounted(t *testing.T) {
	t.Parallel()
	p := harness.StartPlane(t, nil)
	const actor = "dropper"
	ncA := harness.CallerConn(t, p, harness.OwnerA, actor)
	ncB := harness.CallerConn(t, p, harness.OwnerB, "cli")
	inboxB, err := ncB.SubscribeSync(subjects.InboxPrefix(harness.OwnerB, "cli") + ".>")
	if err != nil {
		t.Fatal(err)
	}
	if err := ncB.Flush(); err != nil {
		t.Fatal(err)
	}
	probe := subjects.GateKey(subjects.GateEndpointAuth, "probe")
	authKV := "$KV." + subjects.AuthBucket(harness.TestSpace) + "." + probe

	for _, tt := range []struct {
		name  string
		reply string
	}{
		{"another principal's inbox", subjects.InboxPrefix(harness.OwnerB, "cli") + ".stolen"},
		{"an inbox of its owner's other actor", subjects.InboxPrefix(harness.OwnerA, "cli") + ".x"},
		{"an inbox whose actor extends its own", subjects.InboxPrefix(harness.OwnerA, actor) + "X.y"},
		{"its inbox prefix with no token after it", subjects.InboxPrefix(harness.OwnerA, actor)},
		{"its inbox with an empty token", subjects.InboxPrefix(harness.OwnerA, actor) + "..x"},
		{"a key of the fences bucket", authKV},
		{"the JetStream API", "$JS.API.STREAM.DELETE.KV_" + subjects.AuthBucket(harness.TestSpace)},
		{"a plane subject", subjects.EndpointSubject(harness.TestSpace, subjects.EndpointSupervisorEnd, harness.OwnerB, "cli")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for _, endpoint := range []string{subjects.EndpointManagerAuthority, subjects.EndpointSupervisorEnd} {
				before := harness.Counters(t, p, endpoint)
				if err := ncA.PublishRequest(subjects.EndpointSubject(harness.TestSpace, endpoint, harness.OwnerA, actor), tt.reply, []byte("{}")); err != nil {
					t.Fatal(err)
				}
				testkit.CheckFor(t, 3*time.Second, 10*time.Millisecond, func() error {
					now := harness.Counters(t, p, endpoint)
					if now.Dropped != before.Dropped+1 {
						return fmt.Errorf("%s data.dropped: got %d, want %d", endpoint, now.Dropped, before.Dropped+1)
					}
					return nil
				})
				if now := harness.Counters(t, p, endpoint); now.Answered != before.Answered || now.Errors != before.Errors {
					t.Errorf("%s data.answered, data.errors: got %d, %d, want %d, %d (a dropped request is not answered)",
						endpoint, now.Answered, now.Errors, before.Answered, before.Errors)
				}
			}
		})
	}

	if m, err := inboxB.NextMsg(200 * time.Millisecond); !errors.Is(err, nats.ErrTimeout) {
		t.Errorf("B's inbox: got message %v (err %v), want nothing", m, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := harness.FenceEntry(t, p, probe); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("fences bucket %s after requests aimed at it: got %v, want nothing there", probe, err)
	}
	if _, err := p.JS(t).Stream(ctx, "KV_"+subjects.AuthBucket(harness.TestSpace)); err != nil {
		t.Errorf("fences stream after a request aimed at its delete: %v, want it intact", err)
	}
	// Dropped requests are counted, not audited.
	subject := subjects.AuditSubject(harness.TestSpace, "refused", harness.OwnerA, actor)
	if rec, err := harness.LastMsg(t, p, subjects.AuditStream(harness.TestSpace), subject); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("audit %s after dropped requests: got %v (err %v), want no record", subject, rec, err)
	}
}

func TestBrokerRefusesThePlanesServingIdentityOutsideInboxes(t *testing.T) {
	t.Parallel()
	p := harness.StartPlane(t, nil)
	errs := &harness.AsyncErrors{}
	nc := dataUserConn(t, p, "test.serving", subjects.ServingPermissions(harness.TestSpace), errs)

	t.Run("its JWT has no response permission and publishes only into inboxes", func(t *testing.T) {
		m := p.Keys()
		iss, err := issue.NewIssuer(m.Data.Public(), m.Data.Signer, time.Now)
		if err != nil {
			t.Fatal(err)
		}
		token, err := iss.Sign(issue.User{Name: "test.serving", Key: harness.NewUserKey(t), Permissions: subjects.ServingPermissions(harness.TestSpace), Expires: time.Now().Add(time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		uc, err := jwt.DecodeUserClaims(token)
		if err != nil {
			t.Fatal(err)
		}
		if uc.Resp != nil {
			t.Errorf("serving JWT: got response permission %+v, want none", uc.Resp)
		}
		if got := uc.Pub.Allow; len(got) != 1 || got[0] != "_INBOX.>" {
			t.Errorf("serving JWT publish allow: got %v, want [_INBOX.>]", got)
		}
	})

	for _, subject := range []string{
		"$KV." + subjects.AuthBucket(harness.TestSpace) + ".x",
		"$KV." + subjects.ActorsBucket(harness.TestSpace) + "." + subjects.ActorKey(harness.OwnerA, "cli"),
		"$JS.API.STREAM.LIST",
		"$JS.API.STREAM.PURGE.KV_" + subjects.AuthBucket(harness.TestSpace),
		"$SYS.REQ.SERVER.PING",
		subjects.EndpointSubject(harness.TestSpace, subjects.EndpointManagerAuthority, harness.OwnerA, "cli"),
		subjects.AuditSubject(harness.TestSpace, "refused", harness.OwnerA, "cli"),
	} {
		t.Run("publishing to "+subject+" is a permissions violation", func(t *testing.T) {
			if err := nc.Publish(subject, []byte("{}")); err != nil {
				t.Fatal(err)
			}
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			errs.WaitViolation(t, "Publish", subject)
		})
	}

	t.Run("publishing into a caller's inbox is allowed", func(t *testing.T) {
		caller := harness.CallerConn(t, p, harness.OwnerB, "cli")
		sub, err := caller.SubscribeSync(subjects.InboxPrefix(harness.OwnerB, "cli") + ".>")
		if err != nil {
			t.Fatal(err)
		}
		if err := caller.Flush(); err != nil {
			t.Fatal(err)
		}
		if err := nc.Publish(subjects.InboxPrefix(harness.OwnerB, "cli")+".x", []byte("hi")); err != nil {
			t.Fatal(err)
		}
		if _, err := sub.NextMsg(3 * time.Second); err != nil {
			t.Errorf("caller's inbox: got %v, want the serving user's message", err)
		}
	})
}

func TestNoMintedCredentialCanCreateWriteOrPurgeAStream(t *testing.T) {
	t.Parallel()
	p := harness.StartPlane(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Owner A has a manager, so a witness stream of its own for its callers' run-starts.
	harness.Grant(t, p, harness.OwnerA, "cli", "supervise")
	harness.Registered(t, harness.CallerConn(t, p, harness.OwnerA, "cli"), harness.OwnerA, "cli", harness.NewManagerKeys(t))
	streamsBefore := streamNames(ctx, t, p)

	t.Run("a caller credential", func(t *testing.T) {
		errs := &harness.AsyncErrors{}
		nc := harness.CallerConn(t, p, harness.OwnerA, "cli", errs.Option())
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		cctx, ccancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer ccancel()
		if _, err := js.CreateStream(cctx, jetstream.StreamConfig{Name: "EVIL", Subjects: []string{"evil.>"}}); err == nil {
			t.Errorf("caller CreateStream: got success, want a refusal")
		}
		errs.WaitViolation(t, "Publish", "$JS.API.STREAM.CREATE.EVIL")

		kvSubject := "$KV." + subjects.AuthBucket(harness.TestSpace) + ".epgate.auth.evil"
		if _, err := nc.Request(kvSubject, []byte("{}"), 500*time.Millisecond); err == nil {
			t.Errorf("caller KV put on %s: got an answer, want none", kvSubject)
		}
		errs.WaitViolation(t, "Publish", kvSubject)

		purge := "$JS.API.STREAM.PURGE.KV_" + subjects.AuthBucket(harness.TestSpace)
		if err := nc.Publish(purge, nil); err != nil {
			t.Fatal(err)
		}
		errs.WaitViolation(t, "Publish", purge)
	})

	t.Run("an unrestricted data-account user, because the data account has no JetStream", func(t *testing.T) {
		errs := &harness.AsyncErrors{}
		nc := dataUserConn(t, p, "test.everything", subjects.Permissions{Pub: []string{">"}, Sub: []string{">"}}, errs)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		defer ccancel()
		_, err = js.AccountInfo(cctx)
		if !errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) && !errors.Is(err, jetstream.ErrJetStreamNotEnabled) {
			t.Errorf("data-account AccountInfo: got %v, want JetStream not enabled for the account", err)
		}
		if _, err := js.CreateStream(cctx, jetstream.StreamConfig{Name: "EVIL", Subjects: []string{"evil.>"}}); err == nil {
			t.Errorf("data-account CreateStream: got success, want a refusal")
		}
		kvSubject := "$KV." + subjects.AuthBucket(harness.TestSpace) + ".epgate.auth.evil"
		if _, err := nc.Request(kvSubject, []byte("{}"), 500*time.Millisecond); err == nil {
			t.Errorf("data-account KV put on %s: got an answer, want none", kvSubject)
		}
		if all := errs.All(); len(all) > 0 {
			t.Logf("async errors of the unrestricted user: %v", all)
		}
	})

	t.Run("a caller's run-start reaches the witness, which sends no ack", func(t *testing.T) {
		nc := harness.CallerConn(t, p, harness.OwnerA, "cli")
		witness, err := p.JS(t).Stream(ctx, subjects.WitnessStream(harness.TestSpace, harness.OwnerA))
		if err != nil {
			t.Fatal(err)
		}
		before, err := witness.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		runStart := "cotal." + harness.TestSpace + ".ep.v1.one.manager.run-start." + harness.OwnerA + ".cli.uid.1.nonce"
		if msg, err := nc.Request(runStart, []byte("{}"), 300*time.Millisecond); err == nil {
			t.Errorf("run-start request: got answer %q, want none (the witness has no acks)", msg.Data)
		}
		testkit.CheckFor(t, 3*time.Second, 10*time.Millisecond, func() error {
			after, err := witness.Info(ctx)
			if err != nil {
				return err
			}
			if after.State.Msgs != before.State.Msgs+1 {
				return fmt.Errorf("witness messages: got %d, want %d", after.State.Msgs, before.State.Msgs+1)
			}
			return nil
		})
	})

	if _, err := harness.FenceEntry(t, p, "epgate.auth.evil"); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("fences bucket epgate.auth.evil: got %v, want nothing there", err)
	}
	if after := streamNames(ctx, t, p); len(after) != len(streamsBefore) {
		t.Errorf("plane account streams: got %v, want %v", after, streamsBefore)
	}
}

// streamNames lists the plane account's streams.
func streamNames(ctx context.Context, t *testing.T, p *harness.TestPlane) []string {
	t.Helper()
	var names []string
	l := p.JS(t).StreamNames(ctx)
	for n := range l.Name() {
		names = append(names, n)
	}
	if err := l.Err(); err != nil {
		t.Fatalf("list streams: %v", err)
	}
	return names
}

// TestEveryAccountSignerOfTheSpaceMaterialSignsUsersTheBrokerAccepts: the plane mints users in
// all four accounts (data: callers and duties; plane: its stores; system: revocation pushes
// and connection listings; callout: the callout's own fixed user), so each account's Signer
// in the space material must sign user JWTs the broker accepts.
func TestEveryAccountSignerOfTheSpaceMaterialSignsUsersTheBrokerAccepts(t *testing.T) {
	t.Parallel()
	p := harness.StartPlane(t, nil)
	m := p.Keys()
	grant := subjects.Permissions{Pub: []string{"_INBOX.>"}, Sub: []string{"_INBOX.>"}}
	tests := []struct {
		name    string
		account space.Account
		user    nkeys.KeyPair // nil: a fresh user key
	}{
		{"data", m.Data, nil},
		{"plane", m.Plane, nil},
		{"system", m.System, nil},
		// The callout's own user, listed in auth_users, so the broker skips the callout for it.
		{"callout", m.Callout, m.CalloutUser},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			iss, err := issue.NewIssuer(tt.account.Public(), tt.account.Signer, time.Now)
			if err != nil {
				t.Fatal(err)
			}
			kp := tt.user
			if kp == nil {
				if kp, err = nkeys.CreateUser(); err != nil {
					t.Fatal(err)
				}
			}
			pub, err := kp.PublicKey()
			if err != nil {
				t.Fatal(err)
			}
			token, err := iss.Sign(issue.User{Name: "test." + tt.name, Key: pub, Permissions: grant, Expires: time.Now().Add(time.Minute)})
			if err != nil {
				t.Fatal(err)
			}
			nc, err := nats.Connect(p.NATSURL(), nats.UserJWT(
				func() (string, error) { return token, nil },
				func(nonce []byte) ([]byte, error) { return kp.Sign(nonce) },
			), nats.MaxReconnects(0), nats.Timeout(5*time.Second))
			if err != nil {
				t.Fatalf("connect as a %s-account user signed by the material's %s signer: %v, want accepted", tt.name, tt.name, err)
			}
			nc.Close()
		})
	}
}

// TestThePlanesOwnConnectionsHaveLeastPrivilege reads the JWTs the plane's own connections
// presented from the broker (a server the test runs, so no system user is needed).
func TestThePlanesOwnConnectionsHaveLeastPrivilege(t *testing.T) {
	t.Parallel()
	s := harness.StartStandalone(t, harness.TestSpace)
	p := harness.StartPlane(t, harness.AgainstStandalone(s))
	m := p.Keys()
	connz, err := s.Srv.Connz(&server.ConnzOptions{Username: true, Limit: 1024})
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		role    string
		account string
		grant   subjects.Permissions
	}{
		{"serving", m.Data.Public(), subjects.ServingPermissions(harness.TestSpace)},
		{"store", m.Plane.Public(), subjects.StorePermissions(harness.TestSpace)},
		{"auditors", m.Plane.Public(), subjects.AuditorsPermissions(harness.TestSpace)},
	}
	for _, tt := range tests {
		t.Run(tt.role, func(t *testing.T) {
			name := "authplane " + tt.role + " " + p.InstanceID()
			found := 0
			for _, c := range connz.Conns {
				if c.Name != name {
					continue
				}
				found++
				if c.Account != tt.account {
					t.Errorf("account: got %s, want %s", c.Account, tt.account)
				}
				uc, err := jwt.DecodeUserClaims(c.JWT)
				if err != nil {
					t.Fatalf("the %s connection's JWT: %v", tt.role, err)
				}
				if want := "plane." + tt.role + "_" + p.InstanceID(); uc.Name != want {
					t.Errorf("JWT name: got %q, want %q", uc.Name, want)
				}
				if uc.IssuerAccount != tt.account {
					t.Errorf("JWT issuer account: got %q, want %q (signed with the account's signing key)", uc.IssuerAccount, tt.account)
				}
				if !slices.Equal(uc.Pub.Allow, tt.grant.Pub) || !slices.Equal(uc.Sub.Allow, tt.grant.Sub) {
					t.Errorf("JWT permissions: got pub %v sub %v, want pub %v sub %v", uc.Pub.Allow, uc.Sub.Allow, tt.grant.Pub, tt.grant.Sub)
				}
				if len(uc.Pub.Deny) != 0 || len(uc.Sub.Deny) != 0 || uc.Resp != nil {
					t.Errorf("JWT: got deny lists %v %v and response permission %+v, want none", uc.Pub.Deny, uc.Sub.Deny, uc.Resp)
				}
				if life := time.Duration(uc.Expires-uc.IssuedAt) * time.Second; uc.Expires == 0 || life > time.Hour {
					t.Errorf("JWT lifetime: got %s, want short-lived (the default --plane-user-ttl is 1h)", life)
				}
			}
			if found != 1 {
				t.Errorf("connections named %q: got %d, want 1", name, found)
			}
		})
	}
}
