// Package broker runs the embedded nats-server: operator mode with a full account resolver
// under the process state directory, JetStream syncing every write, and the space's four
// accounts.
package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/internal/platform/space"
)

// Options configure the embedded broker.
type Options struct {
	// Dir holds the resolver and the JetStream store.
	Dir string
	// Port is the client port on 127.0.0.1; 0 picks a free one.
	Port int
	// Name is the server name.
	Name string
	// Logger receives the server's warnings and errors; nil discards them.
	Logger *slog.Logger
	// Unsynced runs JetStream without syncing every write: it syncs every two minutes, so an
	// OS crash or a power cut can take back what it acknowledged (`--allow-unsynced`).
	Unsynced bool
	// Newer are account JWTs newer than the material's (the data account's newest, as the
	// plane keeps it), put into the resolver before the server starts listening, each only if
	// it is not older than the one the resolver holds: no client is admitted before them.
	Newer []string
}

// Broker is a running embedded nats-server.
type Broker struct {
	srv      *server.Server
	resolver *server.DirAccResolver
}

// ErrPortInUse means the requested client port is taken.
var ErrPortInUse = errors.New("port in use")

// Start starts the broker with the material's operator and accounts, and waits until it
// accepts connections.
func Start(m *space.Keys, o Options) (*Broker, error) {
	if o.Port != 0 {
		// nats-server reports a failed listen only through its logger; check first so the
		// error names the port.
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(o.Port)))
		if err != nil {
			return nil, fmt.Errorf("127.0.0.1:%d: %w: %w", o.Port, ErrPortInUse, err)
		}
		if err := l.Close(); err != nil {
			return nil, err
		}
	}
	op, err := m.OperatorClaims()
	if err != nil {
		return nil, fmt.Errorf("operator JWT: %w", err)
	}
	resolver, err := server.NewDirAccResolver(filepath.Join(o.Dir, "resolver"), 0, time.Minute, server.NoDelete)
	if err != nil {
		return nil, fmt.Errorf("account resolver: %w", err)
	}
	// The resolver must hold the system account (and ours) before the server is created.
	for _, a := range m.Accounts() {
		if err := resolver.Store(a.Public(), a.JWT); err != nil {
			return nil, fmt.Errorf("store %s account JWT: %w", a.Name, err)
		}
	}
	for _, token := range o.Newer {
		claims, err := jwt.DecodeAccountClaims(token)
		if err != nil {
			return nil, fmt.Errorf("an account JWT to start with: %w", err)
		}
		if err := resolver.Store(claims.Subject, token); err != nil {
			return nil, fmt.Errorf("store account JWT %s: %w", claims.Subject, err)
		}
	}
	port := o.Port
	if port == 0 {
		port = server.RANDOM_PORT
	}
	opts := &server.Options{
		ServerName: o.Name,
		Host:       "127.0.0.1",
		Port:       port,
		NoLog:      o.Logger == nil,
		NoSigs:     true,
		JetStream:  true,
		StoreDir:   filepath.Join(o.Dir, "jetstream"),
		// Every write reaches the disk before it is acknowledged (`sync_interval: always`).
		SyncAlways:       !o.Unsynced,
		TrustedOperators: []*jwt.OperatorClaims{op},
		SystemAccount:    m.System.Public(),
		AccountResolver:  resolver,
		MaxPayload:       1 << 20,
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded nats-server: %w", err)
	}
	if o.Logger != nil {
		srv.SetLoggerV2(logAdapter{o.Logger}, false, false, false)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return nil, fmt.Errorf("embedded nats-server on 127.0.0.1:%d did not become ready", o.Port)
	}
	return &Broker{srv: srv, resolver: resolver}, nil
}

// ClientURL is the URL clients connect to.
func (b *Broker) ClientURL() string { return b.srv.ClientURL() }

// Server returns the running server.
func (b *Broker) Server() *server.Server { return b.srv }

// Shutdown stops the broker and waits for it.
func (b *Broker) Shutdown() {
	b.srv.Shutdown()
	b.srv.WaitForShutdown()
}

// logAdapter sends the server's log lines to slog: notices at debug, a client connection's
// errors at warn, the rest at their level.
type logAdapter struct{ l *slog.Logger }

// clientLine is the start of a line the server logs about one client connection (its address,
// then `cid:N`, `wid:N` for a websocket, `mid:N` for MQTT): a client's mistake (a permissions
// violation, a refused authorization, a slow consumer) that the plane serves on, not the
// broker's own failure.
var clientLine = regexp.MustCompile(`^\S+ - (cid|wid|mid[a-z]*):\d+ `)

func (a logAdapter) Noticef(format string, v ...any) { a.l.Debug(fmt.Sprintf(format, v...)) }
func (a logAdapter) Warnf(format string, v ...any)   { a.l.Warn(fmt.Sprintf(format, v...)) }
func (a logAdapter) Fatalf(format string, v ...any)  { a.l.Error(fmt.Sprintf(format, v...)) }
func (a logAdapter) Errorf(format string, v ...any) {
	line := fmt.Sprintf(format, v...)
	if clientLine.MatchString(line) {
		a.l.Warn(line)
		return
	}
	a.l.Error(line)
}
func (a logAdapter) Debugf(format string, v ...any) { a.l.Debug(fmt.Sprintf(format, v...)) }
func (a logAdapter) Tracef(format string, v ...any) { a.l.Debug(fmt.Sprintf(format, v...)) }

// PushAccount sends account JWT token to every server of the cluster nc is connected to, as a
// system-account user (`$SYS.REQ.ACCOUNT.<account>.CLAIMS.UPDATE`): a full resolver stores it
// and applies it to the account's connections at once. It is the same for the embedded server.
func PushAccount(ctx context.Context, nc *nats.Conn, account, token string) error {
	msg, err := nc.RequestWithContext(ctx, "$SYS.REQ.ACCOUNT."+account+".CLAIMS.UPDATE", []byte(token))
	if err != nil {
		return fmt.Errorf("push account %s: %w", account, err)
	}
	var reply struct {
		Data *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"data"`
		Error *struct {
			Code        int    `json:"code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		return fmt.Errorf("push account %s: answer %q: %w", account, msg.Data, err)
	}
	if reply.Error != nil {
		return fmt.Errorf("push account %s: %d %s", account, reply.Error.Code, reply.Error.Description)
	}
	return nil
}

// RedactURL returns urls (one broker URL or a comma-separated list) with the user information
// of each (a user and password, or a token) replaced by REDACTED: a URL may carry a secret,
// and URLs are shown in errors, logs and the start summary. It needs no URL to parse.
func RedactURL(urls string) string {
	parts := strings.Split(urls, ",")
	for i, u := range parts {
		start := 0
		if j := strings.Index(u, "://"); j >= 0 {
			start = j + 3
		}
		end := len(u)
		if j := strings.IndexAny(u[start:], "/?#"); j >= 0 {
			end = start + j
		}
		if at := strings.LastIndex(u[start:end], "@"); at >= 0 {
			parts[i] = u[:start] + "REDACTED" + u[start+at:]
		}
	}
	return strings.Join(parts, ",")
}
