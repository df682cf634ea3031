package broker

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/subjects"
)

// Sync is how one server of the cluster writes its JetStream store to disk, as its VARZ says.
type Sync struct {
	// Server is the server's name.
	Server string
	// JetStream says the server runs JetStream; one that does not stores nothing of the plane's.
	JetStream bool
	// Always says it syncs every write before acknowledging it (`sync_interval: always`).
	Always bool
	// Interval is how often it syncs in the background when it does not sync always.
	Interval time.Duration
}

// Synced reports whether what the server acknowledges is on its disk: it syncs every write, or
// it stores nothing.
func (s Sync) Synced() bool { return s.Always || !s.JetStream }

// String names the server and its setting, for refusals and /health.
func (s Sync) String() string {
	if s.Synced() {
		return "server " + s.Server + ": sync_interval always"
	}
	return fmt.Sprintf("server %s: sync_interval %s", s.Server, s.Interval)
}

// Syncs reads how every server of the cluster nc is connected to syncs its store, sorted by
// name: it counts the servers (Account.Servers), asks each for its VARZ through the system
// account, and fails unless all of them answered before ctx ended.
func Syncs(ctx context.Context, nc *nats.Conn) ([]Sync, error) {
	n, err := Account{NC: nc}.Servers(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the servers' sync settings: %w", err)
	}
	seen := map[string]bool{}
	var out []Sync
	err = ask(ctx, nc, subjects.ServerVarz, nil, func(data []byte) (bool, error) {
		s, err := parseVarz(data)
		if err != nil {
			return false, err
		}
		if !seen[s.Server] {
			seen[s.Server] = true
			out = append(out, s)
		}
		return len(out) >= n, nil
	})
	if err != nil {
		return nil, fmt.Errorf("read the servers' sync settings (%d of %d answered): %w", len(out), n, err)
	}
	slices.SortFunc(out, func(a, b Sync) int { return strings.Compare(a.Server, b.Server) })
	return out, nil
}

// parseVarz reads a server's name and its JetStream sync setting from its VARZ answer.
func parseVarz(data []byte) (Sync, error) {
	var answer struct {
		Server struct {
			Name string `json:"name"`
		} `json:"server"`
		Data struct {
			JetStream struct {
				Config *struct {
					SyncInterval time.Duration `json:"sync_interval"`
					SyncAlways   bool          `json:"sync_always"`
				} `json:"config"`
			} `json:"jetstream"`
		} `json:"data"`
		Error *struct {
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(data, &answer); err != nil || answer.Server.Name == "" {
		return Sync{}, fmt.Errorf("a VARZ answer %.64q does not name its server", data)
	}
	if answer.Error != nil {
		return Sync{}, fmt.Errorf("server %s: VARZ: %s", answer.Server.Name, answer.Error.Description)
	}
	s := Sync{Server: answer.Server.Name}
	if c := answer.Data.JetStream.Config; c != nil {
		s.JetStream, s.Always, s.Interval = true, c.SyncAlways, c.SyncInterval
	}
	return s, nil
}
