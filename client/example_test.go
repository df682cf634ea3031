package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/service"
)

// owner is the example's owner: `u_` and 26 base32-lower characters.
const owner = "u_aaaaaaaaaaaaaaaaaaaaaaaaaa"

// A manager process, start to finish: connect as the principal its caller credential names,
// make its own duty keys, prepare, activate and renew. Each answer carries credentials for the
// manager's own public keys and the proof of the next call; a refusal is a *client.Refusal
// whose code a program branches on.
func Example() {
	url, creds, stop := examplePlane()
	defer stop()

	c, err := client.Connect(url, "default", owner, "cli", nats.UserCredentials(creds))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	// The manager's five duty keys stay with it; only their public halves go to the plane.
	m, _, err := client.NewManager()
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	prep, err := c.Prepare(ctx, m)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("prepare:", duties(prep))
	act, err := c.Activate(ctx, m, prep.RegistrationProof)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("activate:", duties(act))
	renewed, err := c.Renew(ctx, m, act.Renewal())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("renew:", duties(renewed))

	// A renewal that names an epoch the plane did not register is refused, with nothing minted.
	stale := act.Renewal()
	stale.Epoch++
	_, err = c.Renew(ctx, m, stale)
	var refusal *client.Refusal
	if errors.As(err, &refusal) {
		fmt.Println("stale renew:", refusal.Code, refusal.Numeric)
	}
	// Output:
	// prepare: [executor supervisor]
	// activate: [goalWriter serve sessionLedger]
	// renew: [executor supervisor]
	// stale renew: conflict 409
}

// Decode turns the plane's answer into its data, or into the *Refusal it carries: the
// `Nats-Service-Error-Code` header says which, the body says what.
func ExampleDecode() {
	refused := nats.NewMsg("_INBOX.example")
	refused.Header.Set("Nats-Service-Error-Code", "403")
	refused.Header.Set("Nats-Service-Error", "permission-denied")
	refused.Data = []byte(`{"error":{"code":"permission-denied","message":"the caller lacks supervise"}}`)
	_, err := client.Decode(refused)
	fmt.Println(client.CodeOf(err))
	var r *client.Refusal
	if errors.As(err, &r) {
		fmt.Println(r.Numeric, r.Message)
	}

	answered := nats.NewMsg("_INBOX.example")
	answered.Data = []byte(`{"v":1}`)
	data, err := client.Decode(answered)
	fmt.Println(string(data), err, client.CodeOf(err) == "")
	// Output:
	// permission-denied
	// 403 the caller lacks supervise
	// {"v":1} <nil> true
}

// duties lists the duties m carries credentials for.
func duties(m *client.Material) []string {
	var out []string
	for d := range m.Credentials {
		out = append(out, d)
	}
	slices.Sort(out)
	return out
}

// examplePlane starts a plane on an embedded broker in a temp folder, grants owner.cli the
// supervise scope (`authplane grant`) and writes its caller credential (`authplane creds`);
// stop closes the plane and removes the folder.
func examplePlane() (url, creds string, stop func()) {
	dir, err := os.MkdirTemp("", "authplane-example-")
	if err != nil {
		log.Fatal(err)
	}
	cfg := service.Defaults()
	cfg.Dir, cfg.NATSPort, cfg.HTTPPort, cfg.Workers = dir, 0, 0, 1
	cfg.Logger = slog.New(slog.DiscardHandler)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := service.Start(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	stop = func() {
		if err := p.Close(); err != nil {
			log.Print(err)
		}
		if err := os.RemoveAll(dir); err != nil {
			log.Print(err)
		}
	}
	info := p.Info()
	keys, err := (admin.Locate{SpaceDir: info.SpaceDir}).Keys()
	if err != nil {
		log.Fatal(err)
	}
	if _, err := admin.Grant(ctx, keys, info.NATSURL, owner, "cli", []string{"supervise"}); err != nil {
		log.Fatal(err)
	}
	o := admin.DefaultCreds()
	o.Role, o.Owner, o.Actor, o.TTL = admin.RoleCaller, owner, "cli", time.Hour
	raw, err := admin.Creds(keys, o, time.Now())
	if err != nil {
		log.Fatal(err)
	}
	creds = filepath.Join(dir, "cli.creds")
	if err := os.WriteFile(creds, raw, 0o600); err != nil {
		log.Fatal(err)
	}
	return info.NATSURL, creds, stop
}
