// Package admin is the plane's administration, apart from the running plane: `init` writes a
// space's material and its servers' configuration, `creds` writes a principal's credential,
// `grant` writes a principal's scopes, `nkeys` generates a manager's keys. Each finds the space
// and its broker from a plane's state directory, or is told them; none takes the state lock.
package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/internal/capability/instance"
	"github.com/cotal-ai/authplane/internal/capability/manager"
	"github.com/cotal-ai/authplane/internal/core/audit"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/internal/core/store"
	"github.com/cotal-ai/authplane/internal/platform/broker"
	"github.com/cotal-ai/authplane/internal/platform/space"
	"github.com/cotal-ai/authplane/subjects"
)

// Locate is how `creds` and `grant` find a plane: the space material and the broker, from the
// state directory's auth-service.json unless given explicitly.
type Locate struct {
	Dir      string
	SpaceDir string
	NATSURL  string
}

// ServiceInfoFile is the readiness file a serving plane keeps in its state directory.
const ServiceInfoFile = instance.ServiceInfoFile

// ServiceInfo is the content of a serving plane's auth-service.json.
type ServiceInfo = instance.ServiceInfo

// ReadServiceInfo reads the service info a serving plane keeps in its state directory dir.
func ReadServiceInfo(dir string) (*ServiceInfo, error) { return instance.ReadServiceInfo(dir) }

// Keys loads the space material: --space-dir, else the running plane's, else <dir>/space.
func (l Locate) Keys() (*space.Keys, error) {
	dir := l.SpaceDir
	if dir == "" {
		if info, err := instance.ReadServiceInfo(l.Dir); err == nil && info.SpaceDir != "" {
			dir = info.SpaceDir
		} else {
			dir = filepath.Join(l.Dir, "space")
		}
	}
	m, err := space.Load(dir)
	if errors.Is(err, space.ErrNotFound) {
		return nil, fmt.Errorf("no space material in %s: run 'authplane serve --dir %s' or 'authplane init' first, or pass --space-dir", dir, l.Dir)
	}
	return m, err
}

// URL returns the broker URL: --nats-url, else the running plane's.
func (l Locate) URL() (string, error) {
	if l.NATSURL != "" {
		return l.NATSURL, nil
	}
	info, err := instance.ReadServiceInfo(l.Dir)
	if errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("no plane is running with --dir %s (no %s): start one, or pass --nats-url", l.Dir, ServiceInfoFile)
	}
	if err != nil {
		return "", err
	}
	return info.NATSURL, nil
}

// Role is what a `.creds` file lets its holder do (docs/PROTOCOL.md, "What each credential may do").
type Role string

// The roles `authplane creds --role` writes.
const (
	// RoleCaller calls the plane and publishes its own run-starts.
	RoleCaller Role = "caller"
	// RoleOps is a caller that may also discover the service: `nats micro ls|info|stats|ping`.
	RoleOps Role = "ops"
	// RoleAuditor reads the minted and audit streams (`nats stream info|get|view` with
	// subjects.AuditorAPIPrefix) and nothing else; its name is the actor's, its principal
	// `auditor.<name>`.
	RoleAuditor Role = "auditor"
)

// CredsOptions say whose credential `authplane creds` writes, and what it may do.
type CredsOptions struct {
	Role  Role
	Owner string
	Actor string
	TTL   time.Duration
	// MaxSubscriptions and MaxPayload bound the user, as every credential the plane mints is.
	MaxSubscriptions int64
	MaxPayload       int64
	// Issuer signs it: the data account's signing key that signs now (CredsIssuer); nil is
	// the material's (generation 0, before any rotation).
	Issuer *issue.Issuer
}

// DefaultCreds are the options `authplane creds` starts from: a caller for a day, with the
// plane's default user limits.
func DefaultCreds() CredsOptions {
	return CredsOptions{Role: RoleCaller, TTL: 24 * time.Hour, MaxSubscriptions: issue.DefaultLimits.Subs, MaxPayload: issue.DefaultLimits.Payload}
}

// Creds mints a `.creds` file (user JWT and a fresh seed) with the permissions of o's role,
// valid for its TTL: for a caller or an operator, the principal of o; for an auditor,
// `auditor.<its name>`.
// Every role is a data-account user, signed with that account's signing key.
func Creds(m *space.Keys, o CredsOptions, now time.Time) ([]byte, error) {
	c, err := IssueCreds(m, o, now)
	return c.Data, err
}

// IssuedCreds is a credential IssueCreds signed: the `.creds` file, and what its `minted`
// record names (never the seed or the JWT).
type IssuedCreds struct {
	Data []byte
	// Name is the user's name: the principal.
	Name string
	Role Role
	NKey string
	Exp  time.Time
}

// Validate returns every problem with o at once: its role and principal, its TTL (1m to 720h)
// and its user limits.
func (o CredsOptions) Validate() error {
	_, _, err := credsGrant("default", o)
	p := []error{err, (issue.Limits{Subs: o.MaxSubscriptions, Payload: o.MaxPayload}).Validate()}
	if o.TTL < time.Minute || o.TTL > 30*24*time.Hour {
		p = append(p, fmt.Errorf("--ttl %s: want 1m to 720h", o.TTL))
	}
	return errors.Join(p...)
}

// IssueCreds is Creds, with what the credential's record names.
func IssueCreds(m *space.Keys, o CredsOptions, now time.Time) (IssuedCreds, error) {
	if err := o.Validate(); err != nil {
		return IssuedCreds{}, err
	}
	name, perms, err := credsGrant(m.Space, o)
	if err != nil {
		return IssuedCreds{}, err
	}
	limits := issue.Limits{Subs: o.MaxSubscriptions, Payload: o.MaxPayload}
	iss := o.Issuer
	if iss == nil {
		if iss, err = issue.NewIssuer(m.Data.Public(), m.Data.Signer, func() time.Time { return now }); err != nil {
			return IssuedCreds{}, err
		}
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		return IssuedCreds{}, err
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return IssuedCreds{}, err
	}
	exp := now.Add(o.TTL)
	token, err := iss.Sign(issue.User{Name: name, Key: pub, Permissions: perms, Expires: exp, Limits: limits})
	if err != nil {
		return IssuedCreds{}, err
	}
	seed, err := kp.Seed()
	if err != nil {
		return IssuedCreds{}, err
	}
	data, err := jwt.FormatUserConfig(token, seed)
	if err != nil {
		return IssuedCreds{}, err
	}
	return IssuedCreds{Data: data, Name: name, Role: o.Role, NKey: pub, Exp: time.Unix(exp.Unix(), 0)}, nil
}

// EndpointCreds names `authplane creds` in the records of the credentials it writes.
const EndpointCreds = "creds"

// RecordCreds writes the `minted` record of a credential IssueCreds signed, in the minted
// stream of the plane at natsURL (under no instance: `cotal.<space>.minted._.<digest of the key>`), and
// waits for its ack: `authplane creds` writes no file whose record is not written. The plane
// must have created its streams (it has run once).
func RecordCreds(ctx context.Context, m *space.Keys, natsURL string, c IssuedCreds) error {
	nc, err := ConnectPlaneAccount(m, natsURL, "creds")
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	w := audit.New(m.Space, store.Appender{JS: js}, slog.New(slog.DiscardHandler), time.Now)
	req := audit.Request{Endpoint: EndpointCreds, Caller: c.Name, Kind: string(c.Role)}
	cred := audit.Credential{Duty: string(c.Role), NKey: c.NKey, Exp: c.Exp.Unix()}
	// A caller's key belongs to no manager instance: its record is filed under none
	// (subjects.NoInstance), and no end revokes it.
	if err := w.Minted(ctx, "", req, []audit.Credential{cred}, subjects.NewSecret(12)); err != nil {
		if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) {
			return fmt.Errorf("%w: no minted stream on %s: start the plane against this broker once first", err, broker.RedactURL(natsURL))
		}
		return err
	}
	return nil
}

// credsGrant is the JWT name and the permissions of o's role (docs/PROTOCOL.md, "What each credential may do").
func credsGrant(space string, o CredsOptions) (string, subjects.Permissions, error) {
	if o.Role == RoleAuditor {
		if o.Owner != "" || !subjects.ValidActor(o.Actor) {
			return "", subjects.Permissions{}, fmt.Errorf("--role auditor names the auditor with --actor ([A-Za-z0-9_]{1,64}) and no --owner")
		}
		return subjects.AuditorPrincipal(o.Actor), subjects.AuditorPermissions(space, o.Actor), nil
	}
	duty := map[Role]subjects.Duty{RoleCaller: subjects.DutyCaller, RoleOps: subjects.DutyOps}[o.Role]
	if duty == "" {
		return "", subjects.Permissions{}, fmt.Errorf("--role %q: want caller, ops or auditor", o.Role)
	}
	if !subjects.ValidOwner(o.Owner) {
		return "", subjects.Permissions{}, fmt.Errorf("--owner %q: want u_ or p_ followed by 26 base32-lower characters", o.Owner)
	}
	if !subjects.ValidActor(o.Actor) {
		return "", subjects.Permissions{}, fmt.Errorf("--actor %q: want [A-Za-z0-9_]{1,64}", o.Actor)
	}
	_, perms, err := subjects.PermissionsOf(duty, subjects.Holder{Space: space, Owner: o.Owner, Actor: o.Actor})
	return subjects.Principal(o.Owner, o.Actor), perms, err
}

// Grant writes principal owner.actor's ledger row with exactly scope (`authplane grant`),
// connecting to natsURL as a short-lived plane-account user. The plane must have created its
// buckets (it has run once).
func Grant(ctx context.Context, m *space.Keys, natsURL, owner, actor string, scope []string) (manager.ActorRow, error) {
	kv, done, err := openBucket(ctx, m, natsURL, "grant", subjects.ActorsBucket(m.Space))
	if err != nil {
		return manager.ActorRow{}, err
	}
	defer done()
	return manager.SetScope(ctx, kv, owner, actor, scope, time.Now())
}

// openBucket opens one of the plane's buckets on natsURL as a short-lived plane-account user
// named for role; done closes the connection. A bucket that does not exist yet means no plane
// has run against this broker.
func openBucket(ctx context.Context, m *space.Keys, natsURL, role, bucket string) (kv *store.KV, done func(), err error) {
	nc, err := ConnectPlaneAccount(m, natsURL, role)
	if err != nil {
		return nil, nil, err
	}
	kv, err = store.OpenBucket(ctx, nc, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		err = fmt.Errorf("bucket %s does not exist on %s: start the plane against this broker once first", bucket, broker.RedactURL(natsURL))
	}
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return kv, nc.Close, nil
}

// ConnectPlaneAccount connects to natsURL as a fresh plane-account user with the store grant,
// valid for five minutes: how the admin tools reach the plane's buckets.
func ConnectPlaneAccount(m *space.Keys, natsURL, role string) (*nats.Conn, error) {
	iss, err := issue.NewIssuer(m.Plane.Public(), m.Plane.Signer, time.Now)
	if err != nil {
		return nil, err
	}
	auth, err := iss.Connect("plane."+role, subjects.StorePermissions(m.Space), 5*time.Minute)
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(natsURL, auth, nats.Name("authplane "+role))
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", broker.RedactURL(natsURL), err)
	}
	return nc, nil
}

// InitOptions are what `authplane init` is told.
type InitOptions struct {
	Space    string
	SpaceDir string
	// ServerConf is where to write the nats-server configuration ("" = SpaceDir/nats-server.conf).
	// Servers need only this file, never the space material's secrets.
	ServerConf string
	// ServerStore is where the servers keep their resolver and JetStream data.
	ServerStore string
	// Listen is the servers' client address.
	Listen string
}

// Init writes the space material (or reuses what exists) and a nats-server configuration for
// servers the plane does not run. It reports whether it created the material and where the
// configuration went.
func Init(o InitOptions) (created bool, conf string, err error) {
	m, created, err := space.LoadOrCreate(o.SpaceDir, o.Space)
	if err != nil {
		return false, "", err
	}
	conf = o.ServerConf
	if conf == "" {
		conf = filepath.Join(o.SpaceDir, "nats-server.conf")
	}
	if err := space.EnsureDir(filepath.Dir(conf)); err != nil {
		return false, "", err
	}
	// Not secret (public keys and JWTs), and read by servers that may run as another user.
	if err := space.WriteAtomic(conf, []byte(m.ServerConf(o.ServerStore, o.Listen)), 0o644); err != nil {
		return false, "", err
	}
	return created, conf, nil
}

// ManagerKeys generates the five duty nkeys of a new manager instance into dir (seeds 0600, one
// file per duty) and returns a ready `prepare` body for them, also written to dir/prepare.json.
func ManagerKeys(dir, spaceName, actor string) ([]byte, error) {
	if !subjects.ValidSpace(spaceName) {
		return nil, fmt.Errorf("--space %q: want [a-z0-9][a-z0-9_-]{0,31}", spaceName)
	}
	if !subjects.ValidActor(actor) {
		return nil, fmt.Errorf("--actor %q: want [A-Za-z0-9_]{1,64}", actor)
	}
	if err := space.EnsureDir(dir); err != nil {
		return nil, err
	}
	m, keys, err := client.NewManager()
	if err != nil {
		return nil, err
	}
	for _, d := range subjects.StandingDuties {
		seed, err := keys[d].Seed()
		if err != nil {
			return nil, err
		}
		if err := space.WriteAtomic(filepath.Join(dir, string(d)+".nk"), append(seed, '\n'), space.Private); err != nil {
			return nil, err
		}
	}
	identities := m.Identities
	body, err := json.Marshal(client.ServiceAuthority{Operation: client.OpPrepare, Envelope: client.Envelope{
		V: 1, Kind: client.KindServiceAuthority, Space: spaceName, Actor: actor,
		InstanceID: m.InstanceID, ManagerLifecycleUID: m.LifecycleUID, RequestID: subjects.NewRequestID(),
		Identities: &identities,
	}})
	if err != nil {
		return nil, err
	}
	return body, space.WriteAtomic(filepath.Join(dir, "prepare.json"), append(body, '\n'), 0o644)
}

// MigrateIdentity moves the file identity in the state directory dir into the space's secrets
// bucket under name (`authplane identity migrate`), then removes the file; a plane started with
// `--identity-store kv --instance-name <name>` is then the same instance. It connects to natsURL
// as a short-lived plane-account user; the plane must have created its buckets (it has run
// once).
func MigrateIdentity(ctx context.Context, m *space.Keys, natsURL, dir, name string) (instance.Identity, error) {
	if !subjects.ValidInstanceName(name) {
		return instance.Identity{}, fmt.Errorf("--instance-name %q: want [A-Za-z0-9_-]{1,64}", name)
	}
	kv, done, err := openBucket(ctx, m, natsURL, "identity", subjects.SecretsBucket(m.Space))
	if err != nil {
		return instance.Identity{}, err
	}
	defer done()
	return instance.Migrate(ctx, kv, dir, m.Space, name)
}
