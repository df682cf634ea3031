package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/internal/platform/space"
	"github.com/cotal-ai/authplane/subjects"
)

func locateFlags(fs *flag.FlagSet) *admin.Locate {
	l := &admin.Locate{}
	fs.StringVar(&l.Dir, "dir", ".authplane", "the plane's state directory (its auth-service.json names the space material and broker)")
	fs.StringVar(&l.SpaceDir, "space-dir", "", "space material directory (default: the running plane's, else <dir>/space)")
	fs.StringVar(&l.NATSURL, "nats-url", "", "broker URL (default: the running plane's)")
	return l
}

// located is the space material and the broker URL l finds.
func located(l *admin.Locate) (*space.Keys, string, error) {
	m, err := l.Keys()
	if err != nil {
		return nil, "", err
	}
	url, err := l.URL()
	if err != nil {
		return nil, "", err
	}
	return m, url, nil
}

// principalFlags adds --owner and --actor: the principal a command writes for.
func principalFlags(fs *flag.FlagSet) (owner, actor *string) {
	return fs.String("owner", "", "the principal's owner (u_… or p_…)"), fs.String("actor", "", "the principal's actor")
}

func initSpace(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("init", "[flags]", stderr)
	var o admin.InitOptions
	fs.StringVar(&o.Space, "space", "default", "space name")
	fs.StringVar(&o.SpaceDir, "space-dir", filepath.Join(stateRoot, "space"), "where to write the space material (every key and secret; in a git work tree, only where git ignores it)")
	fs.StringVar(&o.ServerConf, "server-conf", "", "where to write the nats-server configuration (default <space-dir>/nats-server.conf)")
	fs.StringVar(&o.ServerStore, "server-store", filepath.Join(stateRoot, "nats"), "where the nats-server keeps its resolver and JetStream data")
	fs.StringVar(&o.Listen, "listen", "127.0.0.1:4222", "the nats-server's client address")
	if err := parse(fs, args); err != nil {
		return err
	}
	if _, err := space.Load(o.SpaceDir); errors.Is(err, space.ErrNotFound) {
		if err := secretAt("--space-dir", o.SpaceDir, space.OwnerSecretFile); err != nil {
			return err
		}
	}
	created, conf, err := admin.Init(o)
	if err != nil {
		return err
	}
	verb := "reused the space material in"
	if created {
		verb = "wrote the space material to"
	}
	fmt.Fprintf(stdout, "%s %s (space %q)\n", verb, o.SpaceDir, o.Space)
	fmt.Fprintf(stdout, "wrote %s\n", conf)
	fmt.Fprintf(stdout, "next:\n  nats-server -c %s\n  %s serve --nats-url nats://%s --space %s --space-dir %s --dir <state dir>\n",
		conf, invocation(), o.Listen, o.Space, o.SpaceDir)
	return nil
}

func creds(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("creds", "[flags]", stderr)
	l := locateFlags(fs)
	owner, actor := principalFlags(fs)
	o := admin.DefaultCreds()
	role := fs.String("role", string(o.Role), "caller (call the plane, publish its own run-starts), ops (a caller that may also use nats micro ls|info|stats|ping) or auditor (read the minted and audit streams; --actor names the auditor, no --owner)")
	fs.DurationVar(&o.TTL, "ttl", o.TTL, "lifetime of the credential (1m to 720h)")
	fs.Int64Var(&o.MaxSubscriptions, "max-subscriptions", o.MaxSubscriptions, "subscriptions the user may hold (1 to 1000000)")
	fs.Int64Var(&o.MaxPayload, "max-payload", o.MaxPayload, "largest message the user may publish, in bytes (1 KiB to 64 MiB)")
	out := fs.String("out", "", "the .creds file to write (0600; its directory is made 0700 if need be), once its minted record is written; in a git work tree, only where git ignores it")
	if err := parse(fs, args); err != nil {
		return err
	}
	o.Role, o.Owner, o.Actor = admin.Role(*role), *owner, *actor
	if err := o.Validate(); err != nil {
		return err
	}
	if *out == "" {
		return fmt.Errorf("--out is required")
	}
	if err := secretAt("--out", *out, ""); err != nil {
		return err
	}
	m, url, err := located(l)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	now := time.Now()
	// Signed by the data account's signing key that signs now, its expiry recorded against it
	// first: a scheduled rotation keeps that key listed until the credential has expired.
	if o.Issuer, err = admin.CredsIssuer(ctx, m, url, now.Add(o.TTL)); err != nil {
		return fmt.Errorf("%s not written: %w", *out, err)
	}
	issued, err := admin.IssueCreds(m, o, now)
	if err != nil {
		return err
	}
	// No record, no credential: the file is written only once its `minted` record is.
	if err := admin.RecordCreds(ctx, m, url, issued); err != nil {
		return fmt.Errorf("%s not written: its minted record could not be: %w", *out, err)
	}
	if err := space.EnsureDir(filepath.Dir(*out)); err != nil {
		return err
	}
	if err := space.WriteAtomic(*out, issued.Data, space.Private); err != nil {
		return err
	}
	if o.Role == admin.RoleAuditor {
		fmt.Fprintf(stdout, "wrote %s for auditor %s of space %q (expires in %s)\n", *out, *actor, m.Space, o.TTL)
		fmt.Fprintf(stdout, "use it with: nats --creds %s --inbox-prefix %s --js-api-prefix %s stream view %s\n",
			*out, subjects.AuditorInboxPrefix(*actor), subjects.AuditorAPIPrefix(m.Space, *actor), subjects.AuditStream(m.Space))
		return nil
	}
	fmt.Fprintf(stdout, "wrote %s for %s, role %s (expires in %s)\n", *out, subjects.Principal(*owner, *actor), *role, o.TTL)
	fmt.Fprintf(stdout, "use it with: nats --creds %s --inbox-prefix %s …\n", *out, subjects.InboxPrefix(*owner, *actor))
	return nil
}

func grant(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("grant", "[flags]", stderr)
	l := locateFlags(fs)
	owner, actor := principalFlags(fs)
	var scopeFlag given
	fs.Var(&scopeFlag, "scope", "a comma-separated `list` of scopes: supervise, admin, platform-admin (required; '' clears them)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if !scopeFlag.set {
		return fmt.Errorf("--scope is required (use --scope '' to clear a principal's scopes)")
	}
	var scope []string
	for _, s := range strings.Split(scopeFlag.value, ",") {
		if s = strings.TrimSpace(s); s != "" {
			scope = append(scope, s)
		}
	}
	m, url, err := located(l)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	row, err := admin.Grant(ctx, m, url, *owner, *actor, scope)
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
	fs := newFlags("nkeys", "[flags]", stderr)
	out := fs.String("out", "", "directory for the five seeds (0600) and prepare.json; in a git work tree, only where git ignores it")
	spaceName := fs.String("space", "default", "space name")
	actor := fs.String("actor", "cli", "the actor of the principal that will send the prepare")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *out == "" {
		return fmt.Errorf("--out is required")
	}
	if err := secretAt("--out", *out, "supervisor.nk"); err != nil {
		return err
	}
	body, err := admin.ManagerKeys(*out, *spaceName, *actor)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s\n", body)
	return nil
}

// given is a string flag that knows whether it was given: `--scope ”` is a value, not its
// absence. It has no default to show.
type given struct {
	value string
	set   bool
}

func (g *given) String() string { return g.value }

func (g *given) Set(s string) error {
	g.value, g.set = s, true
	return nil
}

// stateRoot is the directory name of authplane's default state, which it has git ignore.
const stateRoot = ".authplane"

// secretAt checks that flag's value path may hold a secret (at inside it, when path is a
// directory): in a git work tree, git must ignore it. A .authplane directory on the way is
// made and marked ignored first. A path git would not ignore is refused, saying where to write
// instead.
func secretAt(flag, path, inside string) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	for dir := abs; filepath.Dir(dir) != dir; dir = filepath.Dir(dir) {
		if filepath.Base(dir) == stateRoot {
			if err := space.MarkIgnored(dir); err != nil {
				return err
			}
			break
		}
	}
	err = space.CheckIgnored(filepath.Join(path, inside))
	if errors.Is(err, space.ErrCommittable) {
		return fmt.Errorf("%s %s: %w; write the secret outside the work tree, or under %s/ (%s %s), which authplane has git ignore",
			flag, path, err, stateRoot, flag, filepath.Join(stateRoot, filepath.Base(path)))
	}
	return err
}
