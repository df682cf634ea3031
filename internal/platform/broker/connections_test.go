package broker

import (
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

// A connection's principal is its user JWT's name, or the name the auth callout gave it; the
// `user` a JWT user's client sent beside its JWT is never read as a principal, nor as its key.
func TestAConnectionsPrincipalIsItsJWTsNameOrTheCalloutsNever(t *testing.T) {
	acc, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	user, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := user.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	uc := jwt.NewUserClaims(pub)
	uc.Name = "u_aaaaaaaaaaaaaaaaaaaaaaaaaa.cli"
	token, err := uc.Encode(acc)
	if err != nil {
		t.Fatal(err)
	}
	ac := jwt.NewAccountClaims(mustAccount(t))
	accountToken, err := ac.Encode(acc)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		info     clientInfo
		want     string
		callout  bool
		accepted bool
	}{
		{"a JWT user, by its JWT's name", clientInfo{ID: 7, JWT: token, Kind: clientKind}, uc.Name, false, true},
		{"a JWT user whose client sent a user name too", clientInfo{ID: 7, JWT: token, User: "u_bbbbbbbbbbbbbbbbbbbbbbbbbb.victim", Kind: clientKind}, uc.Name, false, true},
		{"a callout user, by the callout's name (an event)", clientInfo{ID: 7, User: "u_bbbbbbbbbbbbbbbbbbbbbbbbbb.worker", Kind: clientKind}, "u_bbbbbbbbbbbbbbbbbbbbbbbbbb.worker", true, true},
		{"a callout user, by the callout's name (a listing)", clientInfo{CID: 7, AuthUser: "u_bbbbbbbbbbbbbbbbbbbbbbbbbb.worker", Kind: clientKind}, "u_bbbbbbbbbbbbbbbbbbbbbbbbbb.worker", true, true},
		{"a leaf node", clientInfo{ID: 7, JWT: token, Kind: "Leafnode"}, "", false, false},
		{"not a user JWT", clientInfo{ID: 7, JWT: accountToken, Kind: clientKind}, "", false, false},
		{"a JWT that does not parse", clientInfo{ID: 7, JWT: "a.b.c", Kind: clientKind}, "", false, false},
		{"no connection id", clientInfo{JWT: token, Kind: clientKind}, "", false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, ok := tt.info.connection("SERVER")
			if ok != tt.accepted || (ok && (c.Principal != tt.want || c.Callout != tt.callout || c.CID != 7 || c.Server != "SERVER")) {
				t.Fatalf("got %+v, %v; want principal %q, callout %v, accepted %v", c, ok, tt.want, tt.callout, tt.accepted)
			}
			if wantUser := map[bool]string{false: pub, true: ""}[tt.callout]; ok && c.User != wantUser {
				t.Fatalf("user key: got %q, want %q (the JWT's subject, none for a callout user)", c.User, wantUser)
			}
		})
	}
}

func mustAccount(t *testing.T) string {
	t.Helper()
	kp, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return pub
}
