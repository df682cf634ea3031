package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/subjects"
)

// Account is one account as every server of a cluster holds it, reached through a
// system-account user's connection: its JWT pushed to every server's resolver, read back from
// each, and its connections listed on each. The same requests serve the embedded server, a
// cluster of one.
type Account struct {
	NC *nats.Conn
	// Public is the account's public key.
	Public string
	// Page is how many connections a server lists in one answer (0: 1024).
	Page int
}

// Push sends the account JWT token to every server (PushAccount).
func (a Account) Push(ctx context.Context, token string) error {
	return PushAccount(ctx, a.NC, a.Public, token)
}

// Lookup returns the account JWT each of the cluster's n servers' resolvers holds, and fails
// unless all of them answered before ctx ended.
func (a Account) Lookup(ctx context.Context, n int) ([]string, error) {
	replies, err := gather(ctx, a.NC, subjects.AccountClaimsLookup(a.Public), nil, n)
	if err != nil {
		return nil, fmt.Errorf("look up account %s: %w", a.Public, err)
	}
	tokens := make([]string, 0, len(replies))
	for _, r := range replies {
		if len(r) == 0 {
			return nil, fmt.Errorf("look up account %s: a server's resolver does not hold it", a.Public)
		}
		tokens = append(tokens, string(r))
	}
	return tokens, nil
}

// Servers counts the servers of the cluster: every server answers a ping, and each answer
// names the servers it has routes to, so the count is known once every server named answered.
func (a Account) Servers(ctx context.Context) (int, error) {
	answered, named := map[string]bool{}, map[string]bool{}
	err := ask(ctx, a.NC, subjects.ServerPing, nil, func(data []byte) (bool, error) {
		var stats struct {
			Server struct {
				Name string `json:"name"`
			} `json:"server"`
			Stats struct {
				Routes []struct {
					Name string `json:"name"`
				} `json:"routes"`
			} `json:"statsz"`
		}
		if err := json.Unmarshal(data, &stats); err != nil || stats.Server.Name == "" {
			return false, fmt.Errorf("an answer %q does not name its server", data)
		}
		answered[stats.Server.Name], named[stats.Server.Name] = true, true
		for _, r := range stats.Stats.Routes {
			if r.Name != "" {
				named[r.Name] = true
			}
		}
		return len(answered) == len(named), nil
	})
	if err != nil {
		return 0, fmt.Errorf("count the servers (%d of %d answered): %w", len(answered), len(named), err)
	}
	return len(answered), nil
}

// ServerIDs asks every server for its id (new at each start) and returns those that answered
// before ctx ended: a short ctx, as no count says when every server has.
func (a Account) ServerIDs(ctx context.Context) map[string]bool {
	ids := map[string]bool{}
	err := ask(ctx, a.NC, subjects.ServerIDs, nil, func(data []byte) (bool, error) {
		var id struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(data, &id) == nil && id.ID != "" {
			ids[id.ID] = true
		}
		return false, nil
	})
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return nil // the connection is down: no answer says anything
	}
	return ids
}

// gather sends a request on subject and collects n answers, or fails when ctx ends first.
func gather(ctx context.Context, nc *nats.Conn, subject string, data []byte, n int) ([][]byte, error) {
	var out [][]byte
	err := ask(ctx, nc, subject, data, func(answer []byte) (bool, error) {
		out = append(out, answer)
		return len(out) >= n, nil
	})
	if err != nil {
		return nil, fmt.Errorf("%d of %d servers answered: %w", len(out), n, err)
	}
	return out, nil
}

// ask sends a request on subject to every server and hands each answer to take, until take
// has what it needs (or refuses an answer), or ctx ends.
func ask(ctx context.Context, nc *nats.Conn, subject string, data []byte, take func([]byte) (bool, error)) (err error) {
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return err
	}
	defer func() {
		if uerr := sub.Unsubscribe(); err == nil && uerr != nil && !errors.Is(uerr, nats.ErrConnectionClosed) {
			err = uerr
		}
	}()
	if err := nc.PublishRequest(subject, inbox, data); err != nil {
		return err
	}
	for {
		msg, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return err
		}
		if done, err := take(msg.Data); done || err != nil {
			return err
		}
	}
}

// PushIfChanged pushes token unless every server's resolver already holds the account with the
// same claims (its issue time and id aside), and says whether it pushed. A push reconfigures
// the account on every server, its JetStream imports among them, while its clients use them:
// nats-server 2.15 races there (its race detector sees Account.enableAllJetStreamService-
// ImportsAndMappings write what a service import being processed reads), and a restart that
// changed nothing need not take that chance. Any server it cannot read is pushed to.
func (a Account) PushIfChanged(ctx context.Context, token string) (bool, error) {
	if a.holds(ctx, token) {
		return false, nil
	}
	return true, a.Push(ctx, token)
}

// holds says whether every server's resolver holds the account with token's claims.
func (a Account) holds(ctx context.Context, token string) bool {
	want, err := sameClaims(token)
	if err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, holdsWithin)
	defer cancel()
	n, err := a.Servers(ctx)
	if err != nil {
		return false
	}
	held, err := a.Lookup(ctx, n)
	if err != nil {
		return false
	}
	for _, h := range held {
		if got, err := sameClaims(h); err != nil || got != want {
			return false
		}
	}
	return true
}

// holdsWithin bounds the reads of PushIfChanged: past it, it pushes.
const holdsWithin = 2 * time.Second

// sameClaims is an account JWT's claims without what every signing changes (the issue time,
// the id), as a string two signings of the same claims agree on.
func sameClaims(token string) (string, error) {
	c, err := jwt.DecodeAccountClaims(token)
	if err != nil {
		return "", err
	}
	c.IssuedAt, c.ID = 0, ""
	data, err := json.Marshal(c)
	return string(data), err
}
