package broker

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/subjects"
)

// Connection is one client connection of an account as a server reports it: where it is, whose
// it is, and since when.
type Connection struct {
	// Server is the id of the server it is connected to; CID its id there.
	Server string
	CID    uint64
	// Principal is the name of its user: a user JWT's `name`, or the name the auth callout gave
	// it. Never a name the client sent.
	Principal string
	// User is a JWT user's public key, its JWT's subject, and Signer the key that signed the
	// JWT (its issuer); both empty for a callout user.
	User, Signer string
	// Callout says the auth callout authorized it (it presented no user JWT of its own).
	Callout bool
	// Issuer is the key that signed its user: an account signing key, or the account's own.
	Issuer string
	Start  time.Time
}

// clientKind is how a server names a client connection (not a leaf node's, a route's, or one
// of its own) in its events and listings.
const clientKind = "Client"

// clientInfo is what an event or a listing says of one connection. The server fills `user`
// with the name the client sent in its CONNECT (beside a user JWT) unless the auth callout
// named it, so the principal of a JWT user is read from its JWT only.
type clientInfo struct {
	Start      time.Time `json:"start"`
	ID         uint64    `json:"id"`  // in events
	CID        uint64    `json:"cid"` // in listings
	User       string    `json:"user"`
	AuthUser   string    `json:"authorized_user"`
	JWT        string    `json:"jwt"`
	Issuer     string    `json:"issuer_key"`
	Kind       string    `json:"kind"`
	ClientType string    `json:"client_type"`
}

// connection reads c as a Connection on server; ok is false for what is not a client
// connection with a principal.
func (c clientInfo) connection(server string) (Connection, bool) {
	if c.Kind != clientKind && c.Kind != "" {
		return Connection{}, false
	}
	conn := Connection{Server: server, CID: c.ID, Start: c.Start, Issuer: c.Issuer}
	if c.CID != 0 {
		conn.CID = c.CID
	}
	switch {
	case c.JWT != "":
		name, user, signer, ok := jwtIdentity(c.JWT)
		if !ok {
			return Connection{}, false
		}
		conn.Principal, conn.User, conn.Signer = name, user, signer
	case c.AuthUser != "":
		conn.Principal, conn.Callout = c.AuthUser, true
	default:
		conn.Principal, conn.Callout = c.User, true
	}
	return conn, conn.Principal != "" && conn.CID != 0 && server != ""
}

// jwtIdentity reads the `name`, the subject (the user's public key) and the issuer (the key
// that signed it) of a user JWT that a server reports it accepted, without checking its
// signature again: the server did, and only
// the servers (and the system account's users, which may kick any connection anyway) publish
// what this reads. jwt.DecodeUserClaims would verify it again, about 70 µs a connection: as
// much as the broker's own check, on every JWT user's connect and every listed connection.
func jwtIdentity(token string) (name, user, signer string, ok bool) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return "", "", "", false
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return "", "", "", false
	}
	var claims struct {
		Name    string `json:"name"`
		Subject string `json:"sub"`
		Issuer  string `json:"iss"`
		Nats    struct {
			Type string `json:"type"`
		} `json:"nats"`
	}
	if json.Unmarshal(payload, &claims) != nil || claims.Nats.Type != string(jwt.UserClaim) || claims.Subject == "" {
		return "", "", "", false
	}
	return claims.Name, claims.Subject, claims.Issuer, true
}

// event is a connect or disconnect event of the account.
type event struct {
	Server struct {
		ID string `json:"id"`
	} `json:"server"`
	Client clientInfo `json:"client"`
}

// WatchConnections hands every connect event of the account, from every server, to connected
// and every disconnect event to disconnected, one at a time on the subscriptions' goroutines,
// until stop. An event is at most once: one lost (a slow consumer, a reconnect) is what a
// listing (ListConnections) puts right.
func (a Account) WatchConnections(connected func(Connection), disconnected func(server string, cid uint64)) (stop func() error, err error) {
	var subs []*nats.Subscription
	stop = func() error {
		var errs []error
		for _, s := range subs {
			if err := s.Unsubscribe(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) && !errors.Is(err, nats.ErrBadSubscription) {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	}
	for _, w := range []struct {
		subject string
		handle  func(event)
	}{
		{subjects.AccountConnectEvents(a.Public), func(e event) {
			if c, ok := e.Client.connection(e.Server.ID); ok {
				connected(c)
			}
		}},
		{subjects.AccountDisconnectEvents(a.Public), func(e event) {
			if e.Server.ID != "" && e.Client.ID != 0 {
				disconnected(e.Server.ID, e.Client.ID)
			}
		}},
	} {
		sub, err := a.NC.Subscribe(w.subject, func(m *nats.Msg) {
			var e event
			if json.Unmarshal(m.Data, &e) == nil {
				w.handle(e)
			}
		})
		if err != nil {
			return nil, errors.Join(fmt.Errorf("subscribe %s: %w", w.subject, err), stop())
		}
		// Events come in storms (a client fleet reconnecting): hold them rather than drop.
		if err := sub.SetPendingLimits(1<<20, 256<<20); err != nil {
			return nil, errors.Join(err, stop())
		}
		subs = append(subs, sub)
	}
	if err := a.NC.Flush(); err != nil {
		return nil, errors.Join(err, stop())
	}
	return stop, nil
}

// listPage is how many connections one server lists in one answer, unless Account.Page says.
const listPage = 1024

// ListConnections lists every client connection of the account on the cluster's n servers,
// a page at a time, and says which servers answered every page before ctx ended: a server
// that did not is missing from the listing, not an error (it may have gone, with its
// connections). It fails only when no server answered.
func (a Account) ListConnections(ctx context.Context, n int) ([]Connection, map[string]bool, error) {
	conns, answered, err := a.list(ctx, n, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("list the connections of account %s: %w", a.Public, err)
	}
	return conns, answered, nil
}

// CalloutConnections lists the connections the auth callout authorized as principal on the
// cluster's n servers, and fails unless all of them answered every page before ctx ended.
//
// The servers' `user` filter matches the name the callout gave a connection, but also the
// user name any JWT user sent beside its JWT: a page can be full of others' connections that
// sent principal as their name. So every page is read, and only the callout's are kept.
func (a Account) CalloutConnections(ctx context.Context, principal string, n int) ([]Connection, error) {
	all, answered, err := a.list(ctx, n, map[string]any{"user": principal})
	if err == nil && len(answered) < n {
		err = fmt.Errorf("%d of %d servers answered every page", len(answered), n)
	}
	if err != nil {
		return nil, fmt.Errorf("list the connections of %s: %w", principal, err)
	}
	var conns []Connection
	for _, c := range all {
		if c.Callout && c.Principal == principal {
			conns = append(conns, c)
		}
	}
	return conns, nil
}

// list lists the account's client connections that filter (CONNZ options) selects, on the
// cluster's n servers, a page at a time, and says which servers answered every page before
// ctx ended. It fails only when no server answered.
func (a Account) list(ctx context.Context, n int, filter map[string]any) ([]Connection, map[string]bool, error) {
	page := a.Page
	if page <= 0 {
		page = listPage
	}
	var conns []Connection
	answered := map[string]bool{}
	for offset := 0; ; offset += page {
		opts := map[string]any{"auth": true, "limit": page, "offset": offset}
		for k, v := range filter {
			opts[k] = v
		}
		req, err := json.Marshal(opts)
		if err != nil {
			return nil, nil, err
		}
		more, got := false, map[string]bool{}
		err = ask(ctx, a.NC, subjects.AccountConnz(a.Public), req, func(data []byte) (bool, error) {
			var resp struct {
				Data *struct {
					ID    string       `json:"server_id"`
					Num   int          `json:"num_connections"`
					Total int          `json:"total"`
					Conns []clientInfo `json:"connections"`
				} `json:"data"`
			}
			if json.Unmarshal(data, &resp) != nil || resp.Data == nil || resp.Data.ID == "" {
				return false, nil // an error answer: that server stays unanswered
			}
			d := resp.Data
			if offset > 0 && !answered[d.ID] {
				return false, nil // it missed an earlier page
			}
			got[d.ID] = true
			for _, c := range d.Conns {
				if conn, ok := c.connection(d.ID); ok {
					conns = append(conns, conn)
				}
			}
			// Total counts the server's every connection of the account, whatever the filter
			// matched: a page that is not full was its last.
			if d.Num == page && offset+d.Num < d.Total {
				more = true
			}
			return len(got) >= n, nil
		})
		if err != nil && len(got) == 0 {
			return nil, nil, err
		}
		answered = got
		if !more || err != nil {
			return conns, answered, nil
		}
	}
}

// Kick closes connection cid on server. A connection already gone is no error.
func (a Account) Kick(ctx context.Context, server string, cid uint64) error {
	req, err := json.Marshal(map[string]uint64{"cid": cid})
	if err != nil {
		return err
	}
	msg, err := a.NC.RequestWithContext(ctx, subjects.ServerKick(server), req)
	if err != nil {
		return fmt.Errorf("kick connection %d on server %s: %w", cid, server, err)
	}
	var resp struct {
		Error *struct {
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return fmt.Errorf("kick connection %d on server %s: answer %q: %w", cid, server, msg.Data, err)
	}
	if resp.Error != nil && !strings.Contains(resp.Error.Description, "no such client") {
		return fmt.Errorf("kick connection %d on server %s: %s", cid, server, resp.Error.Description)
	}
	return nil
}
