package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/subjects"
)

// echoEndpoint is the echo service's endpoint: a subject every requester may already publish
// (`cotal.<space>.auth.*.<owner>.<actor>`), so the echo travels the same rails as a renewal.
const echoEndpoint = "bench-echo"

// echoCeiling measures a trivial micro echo service on t's broker: cfg.Workers service
// instances of one endpoint that answers each request with its body, asked by the same
// requesters, with a body the size of a renewal's.
func echoCeiling(ctx context.Context, t Target, iss *issue.Issuer, cfg Config, reqs []*requester) (_ Phase, err error) {
	subject := subjects.AuthPrefix(t.Keys.Space) + "." + echoEndpoint + ".*.*"
	// The plane's serving grant, narrowed to the echo's subject.
	auth, err := iss.Connect("bench.echo", subjects.Permissions{Pub: []string{"_INBOX.>"}, Sub: []string{subject, "$SRV.>"}}, time.Hour)
	if err != nil {
		return Phase{}, err
	}
	nc, err := nats.Connect(t.NATSURL, auth, nats.Name("authplane bench echo"))
	if err != nil {
		return Phase{}, fmt.Errorf("connect the echo service: %w", err)
	}
	defer nc.Close()
	var svcs []micro.Service
	defer func() {
		for _, svc := range svcs {
			err = errors.Join(err, svc.Stop())
		}
	}()
	var unsent atomic.Int64
	for w := range cfg.Workers {
		svc, err := micro.AddService(nc, micro.Config{
			Name: "bench-echo", Version: "0.0.1", Metadata: map[string]string{"worker": fmt.Sprint(w)},
			Endpoint: &micro.EndpointConfig{
				Subject: subject,
				Handler: micro.HandlerFunc(func(r micro.Request) {
					if err := r.Respond(r.Data()); err != nil {
						unsent.Add(1) // the requester times out and counts it
					}
				}),
			},
		})
		if err != nil {
			return Phase{}, fmt.Errorf("echo service: %w", err)
		}
		svcs = append(svcs, svc)
	}
	if err := nc.Flush(); err != nil {
		return Phase{}, err
	}
	// A body as large as a renewal's.
	renewal := reqs[0].cli.Body(client.OpRenew, reqs[0].m)
	renewal.RegistrationProof, renewal.AccountPublicKey, renewal.ProcessEpoch = &reqs[0].r.Proof, &reqs[0].r.Account, &reqs[0].r.Epoch
	body, err := json.Marshal(renewal)
	if err != nil {
		return Phase{}, err
	}
	ph := drive(ctx, cfg, nil, func(ctx context.Context, i int) (int, error) {
		msg, err := reqs[i].cli.Request(ctx, echoEndpoint, body)
		if err != nil {
			return 0, err
		}
		if len(msg.Data) != len(body) {
			return 0, errors.New("the echo differs from the request")
		}
		return 0, nil
	})
	ph.Op = "echo"
	if n := unsent.Load(); n > 0 {
		return ph, fmt.Errorf("the echo service could not answer %d requests", n)
	}
	return ph, nil
}

// mintCeiling measures the plane's mint alone: iss (the plane's signer for the data account)
// signs and validates supervisor credentials from every CPU for a measured phase, and it
// returns credentials per second.
func mintCeiling(ctx context.Context, iss *issue.Issuer, space string, cfg Config) (float64, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return 0, err
	}
	key, err := kp.PublicKey()
	if err != nil {
		return 0, err
	}
	owner := newOwner()
	actor, perms, err := subjects.PermissionsOf(subjects.DutySupervisor, subjects.Holder{Space: space, Owner: owner, Instance: "benchbenchbenchbenchbenchb"})
	if err != nil {
		return 0, err
	}
	user := issue.User{Name: subjects.Principal(owner, actor), Key: key, Permissions: perms, Limits: issue.DefaultLimits}
	from := time.Now().Add(cfg.warmup())
	end := from.Add(cfg.Duration)
	var signed atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for ctx.Err() == nil {
				now := time.Now()
				if !now.Before(end) {
					return
				}
				u := user
				u.Expires = now.Add(24 * time.Hour)
				if _, err := iss.Sign(u); err != nil {
					failed.Store(err)
					return
				}
				if now.After(from) {
					signed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if err, ok := failed.Load().(error); ok {
		return 0, fmt.Errorf("mint ceiling: %w", err)
	}
	return float64(signed.Load()) / cfg.Duration.Seconds(), nil
}
