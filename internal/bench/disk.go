package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// syncedRecord is the size of one synced write of the disk ceilings: about a `minted` record
// or a gate row.
const syncedRecord = 512

// diskPhase is how long each disk ceiling is measured (after its warm-up), at most the run's
// phase length.
const diskPhase = time.Second

// Disk is what the directory the bench runs in allows a durable write, measured in the same run
// as the operations: the durable ceilings, as the echo is the request ceiling.
type Disk struct {
	// SyncedWritesPerS is 512-byte appends to a file opened O_DSYNC (O_SYNC where there is no
	// O_DSYNC) in the bench's state directory, one at a time; SyncedWriteUs is one's mean time.
	SyncedWritesPerS float64 `json:"synced_writes_per_s"`
	SyncedWriteUs    float64 `json:"synced_write_us"`
	// StreamPerS is 512-byte publishes, each waiting for its ack, to a file stream of one
	// replica on a nats-server that syncs every write (sync_interval: always), in the same
	// directory, by one publisher; StreamConcurrentPerS by Publishers at once (the requesters'
	// N): what one stream takes, synced, and so every renewal's write to it.
	StreamPerS           float64 `json:"synced_stream_per_s"`
	StreamP99            float64 `json:"synced_stream_p99_ms"`
	StreamConcurrentPerS float64 `json:"synced_stream_concurrent_per_s"`
	StreamConcurrentP99  float64 `json:"synced_stream_concurrent_p99_ms"`
	Publishers           int     `json:"synced_stream_publishers"`
}

// diskCeiling measures Disk in dir, into files it removes afterwards.
func diskCeiling(ctx context.Context, dir string, cfg Config) (*Disk, error) {
	if dir == "" {
		return nil, errors.New("the disk ceiling needs the bench's state directory")
	}
	one := cfg
	one.Requesters, one.Duration = 1, min(cfg.Duration, diskPhase)
	d := &Disk{Publishers: cfg.Requesters}

	path := filepath.Join(dir, "disk-ceiling.dsync")
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND|oDSync, 0o600)
	if err != nil {
		return nil, fmt.Errorf("disk ceiling: %w", err)
	}
	defer os.Remove(path)
	record := make([]byte, syncedRecord)
	ph := drive(ctx, one, nil, func(context.Context, int) (int, error) {
		_, err := f.Write(record)
		return 0, err
	})
	if err := errors.Join(f.Close(), failed(ph)); err != nil {
		return nil, fmt.Errorf("disk ceiling, synced writes: %w", err)
	}
	d.SyncedWritesPerS = ph.RequestsPerS
	if ph.Requests > 0 {
		d.SyncedWriteUs = one.Duration.Seconds() * 1e6 / float64(ph.Requests)
	}

	store := filepath.Join(dir, "disk-ceiling")
	defer os.RemoveAll(store)
	s, err := server.NewServer(&server.Options{ServerName: "bench-disk", JetStream: true, StoreDir: store, SyncAlways: true,
		DontListen: true, NoLog: true, NoSigs: true})
	if err != nil {
		return nil, fmt.Errorf("disk ceiling, its nats-server: %w", err)
	}
	go s.Start()
	defer func() { s.Shutdown(); s.WaitForShutdown() }()
	if !s.ReadyForConnections(10 * time.Second) {
		return nil, errors.New("disk ceiling: its nats-server did not start")
	}
	nc, err := nats.Connect("", nats.InProcessServer(s))
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "disk", Subjects: []string{"disk"}, Storage: jetstream.FileStorage}); err != nil {
		return nil, fmt.Errorf("disk ceiling, its stream: %w", err)
	}
	publish := func(ctx context.Context, _ int) (int, error) {
		_, err := js.Publish(ctx, "disk", record)
		return 0, err
	}
	if ph = drive(ctx, one, nil, publish); failed(ph) != nil {
		return nil, fmt.Errorf("disk ceiling, a synced stream: %w", failed(ph))
	}
	d.StreamPerS, d.StreamP99 = ph.RequestsPerS, ph.P99
	many := one
	many.Requesters = cfg.Requesters
	if ph = drive(ctx, many, nil, publish); failed(ph) != nil {
		return nil, fmt.Errorf("disk ceiling, a synced stream at %d publishers: %w", cfg.Requesters, failed(ph))
	}
	d.StreamConcurrentPerS, d.StreamConcurrentP99 = ph.RequestsPerS, ph.P99
	return d, nil
}

// failed says why a phase of writes that must all succeed did not: nil if none failed.
func failed(ph Phase) error {
	if len(ph.Refused) > 0 {
		return fmt.Errorf("writes failed: %v", ph.Refused)
	}
	if ph.Requests == 0 {
		return errors.New("no write completed")
	}
	return nil
}
