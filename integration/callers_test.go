package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/internal/space"
	"github.com/cotal-ai/authplane/subjects"
)

// writeCallerCreds writes a caller `.creds` file for owner.actor, valid for an hour, as
// `authplane creds` does.
func writeCallerCreds(t testing.TB, m *space.Keys, owner, actor string) string {
	t.Helper()
	return writeCreds(t, m, admin.RoleCaller, owner, actor)
}

// writeCreds writes a `.creds` file of role for owner.actor, valid for an hour.
func writeCreds(t testing.TB, m *space.Keys, role admin.Role, owner, actor string) string {
	t.Helper()
	o := admin.DefaultCreds()
	o.Role, o.Owner, o.Actor, o.TTL = role, owner, actor, time.Hour
	creds, err := admin.Creds(m, o, time.Now())
	if err != nil {
		t.Fatalf("%s creds for %s: %v", role, subjects.Principal(owner, actor), err)
	}
	path := filepath.Join(t.TempDir(), owner+"."+actor+"."+string(role)+".creds")
	if err := os.WriteFile(path, creds, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// callerConn connects to p's broker as principal owner.actor with a caller credential (what
// `authplane creds` writes) and the principal's inbox prefix; it closes when the test ends.
func callerConn(t testing.TB, p *testPlane, owner, actor string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	return connectCreds(t, p.NATSURL(), writeCallerCreds(t, p.Keys(), owner, actor), owner, actor, opts...)
}

// opsConn connects to p's broker as principal owner.actor with an ops credential (`authplane
// creds --role ops`): a caller that may also discover the service.
func opsConn(t testing.TB, p *testPlane, owner, actor string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	return connectCreds(t, p.NATSURL(), writeCreds(t, p.Keys(), admin.RoleOps, owner, actor), owner, actor, opts...)
}

// connectCreds connects to url with the .creds file at path and owner.actor's inbox prefix.
func connectCreds(t testing.TB, url, path, owner, actor string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	all := append([]nats.Option{
		nats.UserCredentials(path),
		nats.CustomInboxPrefix(subjects.InboxPrefix(owner, actor)),
		nats.Name("test " + subjects.Principal(owner, actor)),
		nats.MaxReconnects(0),
	}, opts...)
	nc, err := nats.Connect(url, all...)
	if err != nil {
		t.Fatalf("connect as %s: %v", subjects.Principal(owner, actor), err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// grant writes owner.actor's ledger row with exactly scope, as `authplane grant` does.
func grant(t testing.TB, p *testPlane, owner, actor string, scope ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := admin.Grant(ctx, p.Keys(), p.NATSURL(), owner, actor, scope); err != nil {
		t.Fatalf("grant %v to %s: %v", scope, subjects.Principal(owner, actor), err)
	}
}

// newUserKey returns a fresh public user nkey.
func newUserKey(t testing.TB) string { return newKey(t, nkeys.CreateUser) }

// newAccountKey returns a fresh public account nkey.
func newAccountKey(t testing.TB) string { return newKey(t, nkeys.CreateAccount) }

func newKey(t testing.TB, create func() (nkeys.KeyPair, error)) string {
	t.Helper()
	kp, err := create()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

// asyncErrors collects a connection's asynchronous errors (permissions violations arrive
// this way).
type asyncErrors struct {
	mu   sync.Mutex
	errs []error
}

// option installs the collector as a connection's error handler.
func (a *asyncErrors) option() nats.Option {
	return nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.errs = append(a.errs, err)
	})
}

// violation returns the collected permissions violation that names subject, if any.
func (a *asyncErrors) violation(subject string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, err := range a.errs {
		if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), `"`+subject+`"`) {
			return err
		}
	}
	return nil
}

// all returns every collected error.
func (a *asyncErrors) all() []error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]error(nil), a.errs...)
}

// waitViolation waits until the broker has reported a permissions violation for op ("Publish"
// or "Subscription") on subject.
func (a *asyncErrors) waitViolation(t testing.TB, op, subject string) {
	t.Helper()
	checkFor(t, 3*time.Second, 10*time.Millisecond, func() error {
		err := a.violation(subject)
		if err == nil {
			return fmt.Errorf("got no permissions violation for %s to %q (errors so far: %v), want one", op, subject, a.all())
		}
		if !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(op)) {
			return fmt.Errorf("got %q, want a violation for %s", err, op)
		}
		return nil
	})
}
