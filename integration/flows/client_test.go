package flows

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/subjects"
)

// A manager process drives the whole flow with the client package alone: prepare, activate,
// renew, renewStandingBundle, and a refusal it can branch on by code.
func TestClientDrivesTheManagerFlowAndCarriesRefusalCodes(t *testing.T) {
	t.Parallel()
	p := harness.StartPlane(t, nil)
	harness.Grant(t, p, harness.OwnerA, "cli", "supervise")
	c, err := client.Connect(p.NATSURL(), harness.TestSpace, harness.OwnerA, "cli", nats.UserCredentials(harness.WriteCallerCreds(t, p.Keys(), harness.OwnerA, "cli")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if inbox := c.Conn().NewRespInbox(); !strings.HasPrefix(inbox, subjects.InboxPrefix(harness.OwnerA, "cli")+".") {
		t.Fatalf("Connect: got inbox %s, want the principal's prefix", inbox)
	}
	m, keys, err := client.NewManager()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()

	prep, err := c.Prepare(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	act, err := c.Activate(ctx, m, prep.RegistrationProof)
	if err != nil {
		t.Fatal(err)
	}
	renewed, err := c.Renew(ctx, m, act.Renewal())
	if err != nil {
		t.Fatal(err)
	}
	bundle, err := c.RenewStandingBundle(ctx, m, act.Renewal())
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		name   string
		m      *client.Material
		duties []subjects.Duty
	}{
		{"prepare", prep, []subjects.Duty{subjects.DutySupervisor, subjects.DutyExecutor}},
		{"activate", act, []subjects.Duty{subjects.DutyServe, subjects.DutyGoalWriter, subjects.DutySessionLedger}},
		{"renew", renewed, []subjects.Duty{subjects.DutySupervisor, subjects.DutyExecutor}},
		{"renewStandingBundle", bundle, subjects.StandingDuties},
	} {
		if len(step.m.Credentials) != len(step.duties) || step.m.InstanceID != m.InstanceID || step.m.AccountPublicKey != p.Account() {
			t.Errorf("%s: got %d credentials for %s on %s, want %d for %s on %s", step.name, len(step.m.Credentials),
				step.m.InstanceID, step.m.AccountPublicKey, len(step.duties), m.InstanceID, p.Account())
		}
		for _, d := range step.duties {
			claims, err := jwt.DecodeUserClaims(step.m.Credentials[string(d)].JWT)
			if err != nil {
				t.Fatalf("%s %s: %v", step.name, d, err)
			}
			pub, err := keys[d].PublicKey()
			if err != nil {
				t.Fatal(err)
			}
			if claims.Subject != pub {
				t.Errorf("%s %s: got a credential for %s, want the manager's key %s", step.name, d, claims.Subject, pub)
			}
		}
	}

	stale := act.Renewal()
	stale.Epoch++
	_, err = c.Renew(ctx, m, stale)
	var refusal *client.Refusal
	if !errors.As(err, &refusal) || refusal.Code != "conflict" || refusal.Numeric != 409 || client.CodeOf(err) != "conflict" {
		t.Fatalf("renew at another epoch: got %v, want a *client.Refusal conflict 409", err)
	}
}

func TestClientNewRefusesAConnectionWhoseInboxIsNotThePrincipals(t *testing.T) {
	t.Parallel()
	p := harness.StartPlane(t, nil)
	path := harness.WriteCallerCreds(t, p.Keys(), harness.OwnerA, "cli")
	plain, err := nats.Connect(p.NATSURL(), nats.UserCredentials(path))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(plain.Close)
	if _, err := client.New(plain, harness.TestSpace, harness.OwnerA, "cli"); err == nil {
		t.Fatal("client.New on a connection with the default inbox prefix: got a client, want an error (no answer could reach it)")
	}
	if _, err := client.New(harness.ConnectCreds(t, p.NATSURL(), path, harness.OwnerA, "cli"), harness.TestSpace, harness.OwnerA, "cli"); err != nil {
		t.Fatalf("client.New with the principal's inbox prefix: %v", err)
	}
	if _, err := client.Connect(p.NATSURL(), harness.TestSpace, harness.OwnerA, "a.b"); err == nil {
		t.Fatal("client.Connect as an actor off its grammar: got a client, want an error")
	}
}
