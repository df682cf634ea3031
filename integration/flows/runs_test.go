package flows

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/nats-io/jwt/v2"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/subjects"
)

// The whole life of a run: a caller starts it, the manager admits it, takes it over (1,1), its
// driver reports running and renews; a second takeover (2,2) fences the first holder out of its
// renewals and its reports.
func TestARunIsAdmittedTakenOverRenewedAndTakenOverAgain(t *testing.T) {
	t.Parallel()
	env := harness.NewRunEnv(t, harness.StartPlane(t, nil))
	runID := client.NewRunID()
	subject := env.RunStart(subjects.RouteOne, "")
	adm, err := env.Cli.Admit(env.Ctx(), env.M.Manager, env.Cur, runID, subject)
	if err != nil {
		t.Fatal(err)
	}
	if adm.Admission.InstanceID != env.M.Iid || adm.Admission.Caller.Owner != harness.OwnerA || adm.Admission.Caller.Actor != "starter" || adm.Admission.Subject != subject {
		t.Fatalf("got admission %+v, want this instance, ownerA.starter and the subject", adm.Admission)
	}
	again, err := env.Cli.Admit(env.Ctx(), env.M.Manager, env.Cur, runID, subject)
	if err != nil || again.Revision != adm.Revision || again.Admission != adm.Admission {
		t.Fatalf("an identical admission again: got %+v, %v; want the first as it is", again, err)
	}

	first := env.NewTakeover(runID, 1, 1)
	rm := env.MustAttempt(first)
	if len(rm.Credentials) != 2 || rm.Hold.Epoch != 1 || rm.Hold.Holder != env.M.Pub(t, subjects.DutySupervisor)+"."+first.Attempt.TakeoverID {
		t.Fatalf("attempt (1,1): got %+v", rm)
	}
	for duty, key := range map[string]string{"driver": first.Attempt.DriverID, "mediator": first.Attempt.MediatorID} {
		c, err := jwt.DecodeUserClaims(rm.Credentials[duty].JWT)
		if err != nil {
			t.Fatal(err)
		}
		if c.Subject != key || c.Name != subjects.Principal(harness.OwnerA, subjects.RunActor(runID)) {
			t.Errorf("%s: got a credential for %s named %s, want %s as %s", duty, c.Subject, c.Name, key, subjects.RunActor(runID))
		}
	}
	driver := env.Driver(rm, first)
	if _, err := env.Report(driver, rm, client.RunRunning); err != nil {
		t.Fatalf("report running: %v", err)
	}
	renewed, err := env.RenewDriver(rm.Hold)
	if err != nil || len(renewed.Credentials) != 2 || renewed.Hold != rm.Hold {
		t.Fatalf("renewRunDriver: got %+v, %v; want the same hold's two credentials", renewed, err)
	}

	second := env.NewTakeover(runID, 2, 2)
	rm2 := env.MustAttempt(second)
	if rm2.Hold.Epoch != 2 || rm2.Hold.FencingToken != 2 {
		t.Fatalf("attempt (2,2): got hold %+v", rm2.Hold)
	}
	_, err = env.RenewDriver(rm.Hold)
	harness.WantRefusal(t, err, "conflict", "authority moved")
	_, err = env.Report(driver, rm, client.RunRunning)
	harness.WantRefusal(t, err, "permission-denied", "fenced-out")

	// A takeover that is not the next one learns the fence as it is.
	_, err = env.Attempt(env.NewTakeover(runID, 2, 2))
	var r *client.Refusal
	var current client.RunFence
	if !errors.As(err, &r) || r.Code != "conflict" || json.Unmarshal(r.Details, &current) != nil ||
		current != (client.RunFence{Epoch: 2, FencingToken: 2, Holder: rm2.Hold.Holder}) {
		t.Fatalf("a stale takeover: got %v with details %s, want conflict carrying epoch 2, token 2 and the holder", err, detailsOf(r))
	}

	// The new holder reports and renews.
	driver2 := env.Driver(rm2, second)
	if _, err := env.Report(driver2, rm2, client.RunRunning); err != nil {
		t.Fatalf("the new holder's report: %v", err)
	}
	if _, err := env.RenewDriver(rm2.Hold); err != nil {
		t.Fatalf("the new holder's renewal: %v", err)
	}
}

// Each refusal of the run doors has its code and its text, mints nothing and moves no fence.
func TestRunRefusalsHaveTheirCodeAndTextAndWriteNothing(t *testing.T) {
	t.Parallel()
	p := harness.StartPlane(t, nil)
	env := harness.NewRunEnv(t, p)
	other := harness.NewRunEnv(t, p) // another instance of the same owner
	other.M = harness.NewManagerKeys(t)
	_, act := harness.Registered(t, other.Cli.Conn(), harness.OwnerA, "cli", other.M)
	other.Cur = act.Renewal()

	consumed := env.RunStart(subjects.RouteOne, "")
	if _, err := env.Cli.Admit(env.Ctx(), env.M.Manager, env.Cur, client.NewRunID(), consumed); err != nil {
		t.Fatal(err)
	}
	fresh := env.Admitted()
	held, _, heldDriver := env.Running()
	unreported := env.MustAttempt(env.NewTakeover(env.Admitted(), 1, 1))
	done, _, doneDriver := env.Running()
	if _, err := env.Report(doneDriver, done, client.RunCompleted); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name, code, text string
		call             func() error
	}{
		{"an unwitnessed subject", "permission-denied", "not witnessed", func() error {
			unwitnessed := subjects.RunStart{Space: harness.TestSpace, Route: subjects.RouteOne, Owner: harness.OwnerA, Actor: "starter",
				UID: env.M.Uid, Generation: "1", Nonce: "neverpublished00"}.Subject()
			_, err := env.Cli.Admit(env.Ctx(), env.M.Manager, env.Cur, client.NewRunID(), unwitnessed)
			return err
		}},
		{"a consumed witness", "permission-denied", "already consumed", func() error {
			_, err := env.Cli.Admit(env.Ctx(), env.M.Manager, env.Cur, client.NewRunID(), consumed)
			return err
		}},
		{"another instance's subject", "permission-denied", "another manager instance", func() error {
			_, err := env.Cli.Admit(env.Ctx(), env.M.Manager, env.Cur, client.NewRunID(), env.RunStart(subjects.RouteInst, other.M.Iid))
			return err
		}},
		{"a subject off its grammar", "permission-denied", "not a run-start subject", func() error {
			_, err := env.Cli.Admit(env.Ctx(), env.M.Manager, env.Cur, client.NewRunID(), "cotal.default.ep.v1.one.manager.run-start.x")
			return err
		}},
		{"epoch 2 on a new run", "conflict", "next recorded epoch", func() error {
			_, err := env.Attempt(env.NewTakeover(fresh, 2, 2))
			return err
		}},
		{"epoch 0 on a new run", "bad-request", "attempt.epoch", func() error {
			_, err := env.Attempt(env.NewTakeover(fresh, 0, 1))
			return err
		}},
		{"the same epoch again", "conflict", "next recorded epoch", func() error {
			_, err := env.Attempt(env.NewTakeover(held.RunID, 1, 1))
			return err
		}},
		{"an epoch two ahead", "conflict", "next recorded epoch", func() error {
			_, err := env.Attempt(env.NewTakeover(held.RunID, 3, 3))
			return err
		}},
		{"a fencing token behind", "conflict", "next recorded epoch", func() error {
			_, err := env.Attempt(env.NewTakeover(held.RunID, 2, 1))
			return err
		}},
		{"a fencing token ahead", "conflict", "next recorded epoch", func() error {
			_, err := env.Attempt(env.NewTakeover(held.RunID, 2, 3))
			return err
		}},
		{"a completed run", "failed-precondition", "terminal run gets no new attempt", func() error {
			_, err := env.Attempt(env.NewTakeover(done.RunID, 2, 2))
			return err
		}},
		{"a foreign admission", "permission-denied", "another manager instance", func() error {
			_, err := other.Attempt(other.NewTakeover(fresh, 1, 1))
			return err
		}},
		{"no admission", "permission-denied", "no admission record", func() error {
			_, err := env.Attempt(env.NewTakeover(client.NewRunID(), 1, 1))
			return err
		}},
		{"a foreign driver's report", "permission-denied", "only the driver", func() error {
			_, err := heldDriver.ReportStatus(env.Ctx(), client.RunStatus{RunID: unreported.RunID, State: client.RunRunning,
				Holder: unreported.Hold.Holder, Epoch: 1, FencingToken: 1})
			return err
		}},
		{"a report with another holder", "permission-denied", "fenced-out", func() error {
			_, err := heldDriver.ReportStatus(env.Ctx(), client.RunStatus{RunID: held.RunID, State: client.RunRunning, Holder: "someone.else", Epoch: 1, FencingToken: 1})
			return err
		}},
		{"a renewal before running is reported", "conflict", "not running", func() error {
			_, err := env.RenewDriver(unreported.Hold)
			return err
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			authBefore, mintedBefore := harness.LastSeq(t, p, subjects.AuthBucket(harness.TestSpace)), harness.LastSeq(t, p, subjects.MintedStream(harness.TestSpace))
			harness.WantRefusal(t, c.call(), c.code, c.text)
			if after := harness.LastSeq(t, p, subjects.AuthBucket(harness.TestSpace)); after != authBefore {
				t.Errorf("the fence bucket moved from %d to %d; a refusal moves no fence", authBefore, after)
			}
			if after := harness.LastSeq(t, p, subjects.MintedStream(harness.TestSpace)); after != mintedBefore {
				t.Errorf("the minted stream moved from %d to %d; a refusal mints nothing", mintedBefore, after)
			}
		})
	}
}

// detailsOf is a refusal's details, for messages.
func detailsOf(r *client.Refusal) string {
	if r == nil {
		return ""
	}
	return string(r.Details)
}

// A run's driver and mediator may publish their run's journal and their instance's replies,
// and nothing of JetStream, of the buckets, of discovery or of another run: the broker refuses
// each, a permissions violation seen.
func TestRunCredentialsAreConfinedByTheBroker(t *testing.T) {
	t.Parallel()
	env := harness.NewRunEnv(t, harness.StartPlane(t, nil))
	rm, tk, _ := env.Running()
	other := client.NewRunID()
	for _, duty := range []string{"driver", "mediator"} {
		t.Run(duty, func(t *testing.T) {
			errs := &harness.AsyncErrors{}
			kp := tk.Driver
			if duty == "mediator" {
				kp = tk.Mediator
			}
			nc := env.RunUser(rm.RunID, rm.Credentials[duty].JWT, kp, errs.Option()).Conn()
			own := map[string]string{
				"driver":   "cotal." + harness.TestSpace + ".wfj." + rm.RunID,
				"mediator": "cotal." + harness.TestSpace + ".ep.reply.manager." + env.M.Iid + ".x",
			}[duty]
			if err := nc.Publish(own, []byte("{}")); err != nil {
				t.Fatal(err)
			}
			for _, subject := range []string{
				"$KV." + subjects.AuthBucket(harness.TestSpace) + "." + subjects.RunFenceKey(rm.RunID),
				"$JS.API.STREAM.INFO.KV_" + subjects.AuthBucket(harness.TestSpace),
				"$SRV.INFO",
				"$SRV.STATS." + subjects.ServiceName,
				"cotal." + harness.TestSpace + ".wfj." + other,
				subjects.EndpointSubject(harness.TestSpace, subjects.EndpointManagerAuthority, harness.OwnerA, subjects.RunActor(other)),
				"cotal." + harness.TestSpace + ".ep.reply.manager." + harness.NewManagerKeys(t).Iid + ".x",
			} {
				if subject == own {
					continue
				}
				if err := nc.Publish(subject, []byte("{}")); err != nil {
					t.Fatal(err)
				}
				if err := nc.Flush(); err != nil {
					t.Fatal(err)
				}
				errs.WaitViolation(t, "Publish", subject)
			}
			if err := errs.Violation(own); err != nil {
				t.Errorf("its own subject %s: got %v, want it allowed", own, err)
			}
		})
	}
}
