package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/internal/files"
	"github.com/cotal-ai/authplane/internal/instance"
	"github.com/cotal-ai/authplane/internal/space"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

func locateFlags(fs *flag.FlagSet) *service.Locate {
	l := &service.Locate{}
	fs.StringVar(&l.Dir, "dir", ".authplane", "the plane's state directory (its auth-service.json names the space material and broker)")
	fs.StringVar(&l.SpaceDir, "space-dir", "", "space material directory (default: the running plane's, else <dir>/space)")
	fs.StringVar(&l.NATSURL, "nats-url", "", "broker URL (default: the running plane's)")
	return l
}

func initSpace(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("init", flag.ContinueOnError)
	fs.SetOutput(stderr)
	name := fs.String("space", "default", "space name")
	dir := fs.String("space-dir", "space", "where to write the space material")
	storeDir := fs.String("server-store", "./nats", "where the nats-server keeps its resolver and JetStream data")
	listen := fs.String("listen", "127.0.0.1:4222", "the nats-server's client address")
	if err := parse(fs, args); err != nil {
		return err
	}
	m, created, err := space.LoadOrCreate(*dir, *name)
	if err != nil {
		return err
	}
	conf := filepath.Join(*dir, "nats-server.conf")
	if err := files.WriteAtomic(conf, []byte(m.ServerConf(*storeDir, *listen)), 0o644); err != nil {
		return err
	}
	verb := "reused the space material in"
	if created {
		verb = "wrote the space material to"
	}
	fmt.Fprintf(stdout, "%s %s (space %q)\n", verb, *dir, m.Space)
	fmt.Fprintf(stdout, "wrote %s\n", conf)
	fmt.Fprintf(stdout, "next:\n  nats-server -c %s\n  authplane serve --nats-url nats://%s --space %s --space-dir %s --dir <state dir>\n",
		conf, *listen, m.Space, *dir)
	return nil
}

func creds(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("creds", flag.ContinueOnError)
	fs.SetOutput(stderr)
	l := locateFlags(fs)
	owner := fs.String("owner", "", "the principal's owner (u_… or p_…)")
	actor := fs.String("actor", "", "the principal's actor")
	ttl := fs.Duration("ttl", 24*time.Hour, "lifetime of the credential")
	out := fs.String("out", "", "the .creds file to write (0600)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *out == "" {
		return fmt.Errorf("--out is required")
	}
	m, err := l.Material()
	if err != nil {
		return err
	}
	data, err := service.CallerCreds(m, *owner, *actor, *ttl, time.Now())
	if err != nil {
		return err
	}
	if err := files.WriteAtomic(*out, data, files.Private); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s for %s (expires in %s)\n", *out, subjects.Principal(*owner, *actor), *ttl)
	fmt.Fprintf(stdout, "use it with: nats --creds %s --inbox-prefix %s …\n", *out, subjects.InboxPrefix(*owner, *actor))
	return nil
}

func grant(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("grant", flag.ContinueOnError)
	fs.SetOutput(stderr)
	l := locateFlags(fs)
	owner := fs.String("owner", "", "the principal's owner (u_… or p_…)")
	actor := fs.String("actor", "", "the principal's actor")
	scopeFlag := fs.String("scope", "\x00", "comma-separated scopes: supervise, admin, platform-admin ('' clears them)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *scopeFlag == "\x00" {
		return fmt.Errorf("--scope is required (use --scope '' to clear a principal's scopes)")
	}
	var scope []string
	for _, s := range strings.Split(*scopeFlag, ",") {
		if s = strings.TrimSpace(s); s != "" {
			scope = append(scope, s)
		}
	}
	m, err := l.Material()
	if err != nil {
		return err
	}
	url, err := l.URL()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	row, err := service.Grant(ctx, m, url, *owner, *actor, scope)
	if err != nil {
		return err
	}
	out, err := json.Marshal(row)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s\n", out)
	return nil
}

// nkeysCmd generates the five duty nkeys of one manager instance and prints a prepare body.
func nkeysCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("nkeys", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "", "directory for the five seeds (0600) and prepare.json")
	spaceName := fs.String("space", "default", "space name")
	actor := fs.String("actor", "cli", "the actor of the principal that will send the prepare")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *out == "" {
		return fmt.Errorf("--out is required")
	}
	if !subjects.ValidSpace(*spaceName) || !subjects.ValidActor(*actor) {
		return fmt.Errorf("--space %q or --actor %q is not valid", *spaceName, *actor)
	}
	if err := files.EnsureDir(*out); err != nil {
		return err
	}
	identities := map[string]map[string]string{}
	for _, d := range subjects.StandingDuties {
		kp, err := nkeys.CreateUser()
		if err != nil {
			return err
		}
		seed, err := kp.Seed()
		if err != nil {
			return err
		}
		pub, err := kp.PublicKey()
		if err != nil {
			return err
		}
		if err := files.WriteAtomic(filepath.Join(*out, string(d)+".nk"), append(seed, '\n'), files.Private); err != nil {
			return err
		}
		identities[string(d)] = map[string]string{"id": pub}
	}
	rid := make([]byte, 18)
	if _, err := rand.Read(rid); err != nil {
		return err
	}
	prepare := map[string]any{
		"v": 1, "kind": "manager-service-authority", "operation": "prepare",
		"space": *spaceName, "actor": *actor,
		"instanceId": instance.NewUID(), "managerLifecycleUid": instance.NewUID(),
		"requestId":  base64.RawURLEncoding.EncodeToString(rid),
		"identities": identities,
	}
	body, err := json.Marshal(prepare)
	if err != nil {
		return err
	}
	if err := files.WriteAtomic(filepath.Join(*out, "prepare.json"), append(body, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s\n", body)
	return nil
}
