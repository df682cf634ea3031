package faces

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// secretShape is what any token or seed looks like: a compact JWS or JWT (its header is JSON,
// so its base64url begins eyJ), or an nkey seed (S, the key's type, 56 base32 characters).
var secretShape = regexp.MustCompile(`eyJ[A-Za-z0-9_-]{8,}\.|S[ANOUCXP][A-Z2-7]{56}`)

// TestNoSeedBearerProofOrJWTReachesTheLogOrTheRecords: a plane logging everything makes every
// kind of decision (a manager registered and renewed; a renewal refused for a wrong proof; a run
// admitted, taken over, renewed and revoked; a supervised lifecycle assigned, registered and
// ended; a person's IdP token exchanged for a bearer that connects through the callout). Then
// neither its log nor any record of the audit and minted streams holds a credential it issued,
// a proof, the bearer, the IdP token or any seed of the space or the managers: not the strings
// themselves, and nothing shaped like a JWT or a seed (docs/SECURITY.md, "What is proven").
func TestNoSeedBearerProofOrJWTReachesTheLogOrTheRecords(t *testing.T) {
	t.Parallel()
	logs := &harness.SyncBuffer{}
	ip := testkit.NewIdP(t)
	p := harness.StartFacesPlane(t, ip, func(c *service.Config) { c.Logger = harness.NewTextLogger(logs) })
	var secrets []string
	keep := func(s ...string) {
		for _, v := range s {
			if v != "" {
				secrets = append(secrets, v)
			}
		}
	}
	material := func(creds map[string]client.Credential, proofs ...string) {
		for _, c := range creds {
			keep(c.JWT)
		}
		keep(proofs...)
	}
	seeds := func(kps ...nkeys.KeyPair) {
		for _, kp := range kps {
			if kp == nil {
				continue
			}
			seed, err := kp.Seed()
			if err != nil {
				t.Fatal(err)
			}
			keep(string(seed))
		}
	}

	// A manager, its renewal, and a renewal with a proof of the right shape that is not its.
	env := harness.NewRunEnv(t, p)
	keep(env.Cur.Proof)
	m, err := env.Cli.Renew(env.Ctx(), env.M.Manager, env.Cur)
	if err != nil {
		t.Fatal(err)
	}
	material(m.Credentials)
	wrong := env.Cur
	wrong.Proof = "sha256:" + strings.Repeat("0", 64)
	keep(wrong.Proof)
	if _, err := env.Cli.Renew(env.Ctx(), env.M.Manager, wrong); client.CodeOf(err) != "permission-denied" {
		t.Fatalf("a renewal with another proof: got %v, want permission-denied", err)
	}
	// A run taken over, renewed and revoked.
	rm, tk, _ := env.Running()
	material(rm.Credentials)
	renewed, err := env.RenewDriver(rm.Hold)
	if err != nil {
		t.Fatal(err)
	}
	material(renewed.Credentials)
	if _, err := env.Revoke(env.Revoker(harness.OwnerA, "owner"), rm.RunID, "done"); err != nil {
		t.Fatal(err)
	}
	// A supervised lifecycle, ended.
	pa := harness.NewPlatformAdmin(t, p, "admin")
	s := pa.Assign(time.Now().Add(time.Hour))
	pa.Register(s)
	material(s.Prep.Credentials, s.Prep.RegistrationProof)
	material(s.Act.Credentials, s.Act.NextRegistrationProof)
	if _, err := pa.End(s); err != nil {
		t.Fatal(err)
	}
	// A person's bearer, used through the callout.
	owner := harness.HumanOwner(t, p, ip, "dora")
	harness.Grant(t, p, owner, "cli")
	idToken := ip.Token(t, ip.Claims("dora", time.Hour))
	ex := harness.Exchange(t, p.PublicURL(), map[string]any{"idpToken": idToken, "actor": "cli"})
	keep(idToken, ex.Token)
	if _, err := harness.BearerConnect(t, harness.FetchBundle(t, p.PublicURL()), ex.Token, owner, "cli"); err != nil {
		t.Fatalf("connect with the bearer: %v", err)
	}
	// Every seed there is: the space's, the managers' and the run's.
	k := p.Keys()
	seeds(k.Operator, k.OperatorSigner, k.CalloutXKey, k.CalloutUser)
	for _, a := range []struct{ key, signer nkeys.KeyPair }{{k.System.Key, k.System.Signer}, {k.Data.Key, k.Data.Signer},
		{k.Plane.Key, k.Plane.Signer}, {k.Callout.Key, k.Callout.Signer}} {
		seeds(a.key, a.signer)
	}
	for _, keys := range []*harness.ManagerKeys{env.M, s.M} {
		for _, kp := range keys.Keys {
			seeds(kp)
		}
	}
	seeds(tk.Driver, tk.Mediator)

	texts := map[string]string{"the log": logs.String()}
	for _, stream := range []string{subjects.AuditStream(harness.TestSpace), subjects.MintedStream(harness.TestSpace)} {
		msgs := harness.ReadAll(t, p.JS(t), stream, ">")
		if len(msgs) == 0 {
			t.Fatalf("%s holds no record", stream)
		}
		for _, msg := range msgs {
			texts[stream+" "+msg.Subject()] = string(msg.Data())
		}
	}
	for _, want := range []string{"msg=minted", "msg=refused", "msg=ended", "msg=exchanged"} {
		if !strings.Contains(texts["the log"], want) {
			t.Errorf("the log has no %s line: the flow did not make that decision", want)
		}
	}
	for where, text := range texts {
		for i, secret := range secrets {
			if strings.Contains(text, secret) {
				t.Errorf("%s holds secret %d of %d (%.12s…)", where, i+1, len(secrets), secret)
			}
		}
		if found := secretShape.FindString(text); found != "" {
			t.Errorf("%s holds something shaped like a token or a seed: %.24s…", where, found)
		}
	}
}
