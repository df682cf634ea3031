package store_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/cotal-ai/authplane/internal/core/store"
)

// syncedStream is a file stream of one replica that takes atomic batches, on an embedded
// nats-server that syncs every write, as the plane's broker does by default (UNSYNCED=1 in the
// environment: without syncing, to see what of a batch's cost is not the stream's sync).
func syncedStream(b *testing.B) jetstream.JetStream {
	b.Helper()
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: b.TempDir(), SyncAlways: os.Getenv("UNSYNCED") == ""})
	if err != nil {
		b.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		b.Fatal("nats-server not ready")
	}
	b.Cleanup(srv.Shutdown)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "m", Subjects: []string{"m.>"},
		Storage: jetstream.FileStorage, MaxMsgsPerSubject: 1, AllowAtomicPublish: true}); err != nil {
		b.Fatal(err)
	}
	return js
}

// BenchmarkSyncedAppendSpread writes 32 records at once, as 32 concurrent renewals would, spread
// over k streams of one replica on a broker that syncs every write. A stream syncs its messages
// one at a time, but the file system commits the syncs of different files together: the figure
// to compare is ns/record as k grows.
func BenchmarkSyncedAppendSpread(b *testing.B) {
	const n = 32
	for _, k := range []int{1, 4, 8, 16} {
		b.Run(fmt.Sprintf("streams/%d", k), func(b *testing.B) {
			js := syncedStream(b)
			for i := range k {
				if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: fmt.Sprintf("s%d", i),
					Subjects: []string{fmt.Sprintf("s%d.>", i)}, Storage: jetstream.FileStorage, MaxMsgsPerSubject: 1}); err != nil {
					b.Fatal(err)
				}
			}
			appendAtOnce(b, js, n, func(i int) string { return fmt.Sprintf("s%d.%d", i%k, i) })
		})
	}
}

// appendAtOnce runs b's loop, each op n records of 512 bytes published at once, record i on
// subject(i), and reports ns/record.
func appendAtOnce(b *testing.B, js jetstream.JetStream, n int, subject func(i int) string) {
	record := make([]byte, 512)
	a := store.Appender{JS: js}
	ctx := context.Background()
	seq := 0
	for b.Loop() {
		var wg sync.WaitGroup
		for i := range n {
			seq++
			subject, id := subject(i), fmt.Sprintf("id-%d", seq)
			wg.Go(func() {
				if err := a.Append(ctx, subject, record, id); err != nil {
					b.Error(err)
				}
			})
		}
		wg.Wait()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/record")
}

// BenchmarkSyncedAppend compares, on a broker that syncs every write, n records written as n
// publishes at once (what n concurrent renewals do, each its own `minted` record) against the
// same n records as one atomic batch (which nats-server syncs once). One op is n records; the
// figure to compare is ns/record.
func BenchmarkSyncedAppend(b *testing.B) {
	record := make([]byte, 512)
	for _, n := range []int{1, 8, 32} {
		b.Run(fmt.Sprintf("single/%d", n), func(b *testing.B) {
			appendAtOnce(b, syncedStream(b), n, func(i int) string { return fmt.Sprintf("m.%d", i) })
		})
		b.Run(fmt.Sprintf("batch/%d", n), func(b *testing.B) {
			js := syncedStream(b)
			ctx := context.Background()
			seq := 0
			for b.Loop() {
				recs := make([]pending, n)
				for i := range recs {
					seq++
					recs[i] = pending{subject: fmt.Sprintf("m.%d", i), data: record, msgID: fmt.Sprintf("id-%d", seq)}
				}
				if err := appendBatch(ctx, js, recs); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/record")
		})
	}
}

// pending is one record of an atomic batch.
type pending struct {
	subject, msgID string
	data           []byte
}

// appendBatch writes recs as one atomic batch (nats-server 2.15: Nats-Batch-Id, -Sequence and
// -Commit): every record but the last sent without waiting, the last's ack the batch's outcome.
func appendBatch(ctx context.Context, js jetstream.JetStream, recs []pending) error {
	id := nuid.Next()
	for i, r := range recs {
		m := nats.NewMsg(r.subject)
		m.Data = r.data
		m.Header.Set("Nats-Batch-Id", id)
		m.Header.Set("Nats-Batch-Sequence", strconv.Itoa(i+1))
		m.Header.Set(nats.MsgIdHdr, r.msgID)
		if i < len(recs)-1 {
			if err := js.Conn().PublishMsg(m); err != nil {
				return err
			}
			continue
		}
		m.Header.Set("Nats-Batch-Commit", "1")
		if _, err := js.PublishMsg(ctx, m); err != nil {
			return fmt.Errorf("a batch of %d: %w", len(recs), err)
		}
	}
	return nil
}
