package handlers

import (
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

// calloutEnv is a callout as the plane runs it (its account, signing key and curve key) and
// a server that asks it, with its own server and curve keys.
type calloutEnv struct {
	c         *Callout
	env       *guardEnv
	account   string
	signerPub string
	server    nkeys.KeyPair
	serverID  string
	serverX   nkeys.KeyPair
	serverXP  string
	calloutXP string
}

func newCalloutEnv(t *testing.T) *calloutEnv {
	t.Helper()
	must := func(kp nkeys.KeyPair, err error) nkeys.KeyPair {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return kp
	}
	pub := func(kp nkeys.KeyPair) string {
		t.Helper()
		p, err := kp.PublicKey()
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	account, signer := must(nkeys.CreateAccount()), must(nkeys.CreateAccount())
	calloutX := must(nkeys.CreateCurveKeys())
	e := &calloutEnv{env: newGuardEnv(0, 1), account: pub(account), signerPub: pub(signer),
		server: must(nkeys.CreateServer()), serverX: must(nkeys.CreateCurveKeys()), calloutXP: pub(calloutX)}
	e.serverID, e.serverXP = pub(e.server), pub(e.serverX)
	e.c = &Callout{Space: "default", Guard: e.env.g, Account: e.account, Signer: signer, XKey: calloutX, Log: slog.New(slog.DiscardHandler)}
	return e
}

// request is a server's sealed authorization request for a fresh user key, signed by signer
// (the server itself unless a test forges it), naming xkey as the server's curve key, with token.
func (e *calloutEnv) request(t *testing.T, signer nkeys.KeyPair, xkey, token string) []byte {
	t.Helper()
	user, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	userPub, _ := user.PublicKey()
	claims := jwt.NewAuthorizationRequestClaims(e.account)
	claims.Audience = "nats-authorization-request"
	claims.UserNkey = userPub
	claims.Server = jwt.ServerID{Name: "n1", ID: e.serverID, XKey: xkey}
	claims.ConnectOptions.Token = token
	claims.Expires = time.Now().Add(2 * time.Second).Unix()
	raw, err := claims.Encode(signer)
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := e.serverX.Seal([]byte(raw), e.calloutXP)
	if err != nil {
		t.Fatal(err)
	}
	return sealed
}

// A request that is not the broker's, properly sealed and signed, gets no answer at all: the
// callout says nothing to whoever cannot prove to be the server.
func TestTheCalloutAnswersNothingButTheServersSealedRequest(t *testing.T) {
	t.Parallel()
	e := newCalloutEnv(t)
	other, err := nkeys.CreateServer()
	if err != nil {
		t.Fatal(err)
	}
	otherX, err := nkeys.CreateCurveKeys()
	if err != nil {
		t.Fatal(err)
	}
	otherXP, _ := otherX.PublicKey()
	good := e.request(t, e.server, e.serverXP, "")
	for _, tt := range []struct {
		name   string
		header string
		data   []byte
	}{
		{"no curve key header", "", good},
		{"another curve key in the header than the one that sealed", otherXP, good},
		{"not sealed", e.serverXP, []byte("eyJhbGciOiJlZDI1NTE5LW5rZXkifQ.e30.x")},
		{"garbage", e.serverXP, []byte{0xff, 0x00, 0x01}},
		{"signed by another server than the one it names", e.serverXP, e.request(t, other, e.serverXP, "")},
		{"a signed curve key other than the sealing one", e.serverXP, e.request(t, e.server, otherXP, "")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if answer, _, ok := e.c.decide(time.Now().Add(CalloutDeadline), tt.header, tt.data); ok || answer != nil {
				t.Fatalf("got an answer %q, want none", answer)
			}
		})
	}
	if got := e.env.refused(t); len(got) != 0 {
		t.Errorf("dropped requests were recorded as refusals: %+v", got)
	}
}

// The server's own request without a bearer is answered with a refusal the server can check:
// signed by the callout account's signing key, for this server and this user key, and recorded.
func TestTheCalloutRefusesAConnectionWithoutABearer(t *testing.T) {
	t.Parallel()
	e := newCalloutEnv(t)
	answer, xkey, ok := e.c.decide(time.Now().Add(CalloutDeadline), e.serverXP, e.request(t, e.server, e.serverXP, ""))
	if !ok || xkey != e.serverXP {
		t.Fatalf("got ok %v, seal for %q; want an answer sealed for the server's curve key", ok, xkey)
	}
	res, err := jwt.DecodeAuthorizationResponseClaims(string(answer))
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case res.Issuer != e.signerPub || res.IssuerAccount != e.account:
		t.Errorf("answer signed by %s for account %s, want the signing key %s of %s", res.Issuer, res.IssuerAccount, e.signerPub, e.account)
	case res.Audience != e.serverID:
		t.Errorf("answer audience %q, want the server %s", res.Audience, e.serverID)
	case !nkeys.IsValidPublicUserKey(res.Subject):
		t.Errorf("answer subject %q, want the request's user key", res.Subject)
	case res.Jwt != "" || res.Error == "":
		t.Errorf("answer jwt %q error %q, want a refusal and no user", res.Jwt, res.Error)
	}
	if got := e.env.refused(t); len(got) != 1 || got[0].Endpoint != EndpointCallout || got[0].Code != "unauthenticated" {
		t.Errorf("refusal records: got %+v, want one unauthenticated auth-callout refusal", got)
	}
}
