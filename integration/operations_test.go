package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/subjects"
)

// TestOperationsGuideWorksAsWritten runs every shell line of docs/OPERATIONS.md in order (see
// docRun), and checks between its sections that what the guide says happened did.
func TestOperationsGuideWorksAsWritten(t *testing.T) {
	t.Parallel()
	r := newDocRun(t)
	g := &guideChecks{r: r}
	before := map[string]func(docSection){"## Revoke a run": g.prepareRun}
	after := map[string]func(){
		"## Bootstrap a cluster": g.clusterServes,
		"## Grant scopes":        g.scopesGranted,
		"## Revoke a run":        g.runRevoked,
		// Its figures are checked where they are made: the bound by
		// TestARevokedKeyLeavesTheSetOnceEveryCredentialItRevokedHasExpiredAndNeverBefore, the
		// ceiling by TestTheRevocationSetsCapacityIsWhatOneBrokerMessageCarries.
		"## End a supervised lifecycle":                  func() {},
		"## Read the audit trail":                        g.trailRead,
		"## Read the metrics":                            g.metricsRead,
		"## Connections":                                 g.connectionsCounted,
		"## Rotate bearer keys":                          g.keysRotated,
		"## Back up and restore":                         g.restored,
		"## Move a plane":                                g.planesMoved,
		"## What not to do":                              func() {},
		"## What each refusal code means to an operator": func() {},
	}
	var seen []string
	for _, s := range docSections(t, filepath.Join("..", "docs", "OPERATIONS.md")) {
		if h, ok := before[s.heading]; ok {
			h(s)
		}
		for _, block := range s.blocks {
			for _, line := range block {
				r.run(line)
			}
		}
		if s.heading == "" {
			continue
		}
		check, ok := after[s.heading]
		if !ok {
			t.Fatalf("OPERATIONS.md section %q: this test has no check for it; add one", s.heading)
		}
		check()
		seen = append(seen, s.heading)
	}
	for h := range after {
		if !slices.Contains(seen, h) {
			t.Errorf("OPERATIONS.md has no section %q", h)
		}
	}
}

// guideChecks are the checks between the guide's sections, and what they carry from one to
// the next.
type guideChecks struct {
	r     *docRun
	runID string
}

// plane1 is the guide's first replica as the tests reach it.
func (g *guideChecks) plane1() *testPlane {
	return binaryPlane(g.r.t, readServiceInfo(g.r.t, filepath.Join(g.r.dir, "plane1"), 30*time.Second))
}

// started returns the background authplane processes started with --dir dir, in order.
func (g *guideChecks) started(dir string) []*process {
	var out []*process
	for _, p := range g.r.started {
		if i := slices.Index(p.cmd.Args, "--dir"); i > 0 && p.cmd.Args[i+1] == filepath.Join(g.r.dir, dir) {
			out = append(out, p)
		}
	}
	return out
}

// clusterServes: two replicas of two instances serve on a cluster whose stores are R3.
func (g *guideChecks) clusterServes() {
	t := g.r.t
	p1, p2 := g.started("plane1"), g.started("plane2")
	if len(p1) != 1 || len(p2) != 1 {
		t.Fatalf("started %d plane1 and %d plane2 replicas, want one each", len(p1), len(p2))
	}
	iid1, e1 := summaryInstance(t, p1[0])
	iid2, e2 := summaryInstance(t, p2[0])
	if iid1 == iid2 || e1 != 0 || e2 != 0 {
		t.Errorf("replicas %s (epoch %d) and %s (epoch %d): want two instances at epoch 0", iid1, e1, iid2, e2)
	}
	p := g.plane1()
	groups := byInstance(serviceInstances(t, p.Ops(t)))
	if len(groups[iid1]) == 0 || len(groups[iid2]) == 0 {
		t.Errorf("service instances by plane: %v, want %s and %s", keys(groups), iid1, iid2)
	}
	info, err := streamInfo(t, p, subjects.AuthBucket(testSpace))
	if err != nil || info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
		t.Errorf("the fences' stream: got %+v %v, want 3 replicas on the cluster", info, err)
	}
}

// scopesGranted: the ledger holds exactly the scopes the guide granted and cleared.
func (g *guideChecks) scopesGranted() {
	t := g.r.t
	p := g.plane1()
	for principal, want := range map[string][]string{
		"u_aaaaaaaaaaaaaaaaaaaaaaaaaa.cli": {"supervise"}, "u_bbbbbbbbbbbbbbbbbbbbbbbbbb.oncall": {"admin"},
		"u_cccccccccccccccccccccccccc.leaver": nil,
	} {
		var row struct{ Scope []string }
		readRecord(t, p, subjects.ActorsBucket(testSpace), "$KV."+subjects.ActorsBucket(testSpace)+".actor."+principal, &row)
		if !slices.Equal(row.Scope, want) {
			t.Errorf("ledger row of %s: scope %v, want %v", principal, row.Scope, want)
		}
	}
}

// prepareRun admits a run of a manager on the guide's cluster, leaves a refusal on record, and
// writes the guide's revoke body for it to $D/revoke.json.
func (g *guideChecks) prepareRun(s docSection) {
	t := g.r.t
	if len(s.json) != 1 {
		t.Fatalf("%s: want one json block (the body), got %d", s.heading, len(s.json))
	}
	p := g.plane1()
	env := newRunEnv(t, p)
	g.runID = env.admitted()
	if o := ask(t, callerConn(t, p, ownerB, "nobody"), ownerB, "nobody", subjects.EndpointManagerAuthority, "{}"); o.code != "bad-request" {
		t.Fatalf("a request to leave a refusal on record: got %q %q", o.code, o.message)
	}
	ids, err := json.Marshal(env.m.Identities)
	if err != nil {
		t.Fatal(err)
	}
	body := strings.NewReplacer("IID", env.m.iid, "UID", env.m.uid, "IDENTITIES", string(ids), "PROOF", env.cur.Proof,
		"ACCOUNT", env.cur.Account, "EPOCH", fmt.Sprint(env.cur.Epoch), "RUN", g.runID).Replace(s.json[0])
	if err := os.WriteFile(filepath.Join(g.r.dir, "revoke.json"), []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

// runRevoked: the guide's request revoked the run, by the admin principal, and the marker holds.
func (g *guideChecks) runRevoked() {
	t := g.r.t
	reply := g.r.last.reply
	if reply == nil || reply.Header.Get("Nats-Service-Error") != "" {
		t.Fatalf("the guide's revoke: got %v, want the revocation", reply)
	}
	var got struct {
		Revocation json.RawMessage
	}
	var marker struct{ RunID, By string }
	if err := json.Unmarshal(reply.Data, &got); err != nil || json.Unmarshal(got.Revocation, &marker) != nil ||
		marker.RunID != g.runID || marker.By != "u_bbbbbbbbbbbbbbbbbbbbbbbbbb.oncall" {
		t.Errorf("the guide's revoke: got %s, want run %s revoked by the oncall admin", reply.Data, g.runID)
	}
	if m := markerOf(t, g.plane1(), g.runID); string(m) != string(got.Revocation) {
		t.Errorf("the stored marker %s, want the reply's %s", m, got.Revocation)
	}
}

// trailRead: the auditor's views held the refusal and the mints.
func (g *guideChecks) trailRead() {
	t := g.r.t
	var all []string
	for _, res := range g.r.results {
		for _, rec := range res.records {
			all = append(all, string(rec))
		}
	}
	joined := strings.Join(all, "\n")
	if !strings.Contains(joined, `"decision":"refused"`) || !strings.Contains(joined, `"caller":"u_bbbbbbbbbbbbbbbbbbbbbbbbbb.nobody"`) {
		t.Errorf("the audit views: want the refusal left on record, got:\n%s", joined)
	}
	if !strings.Contains(joined, `"duty":"supervisor"`) || !strings.Contains(joined, `"duty":"serve"`) {
		t.Errorf("the minted views: want the mints of the run's manager, got:\n%s", joined)
	}
}

// restored: after the cold backup and restore, the scopes and the revocation are still there.
func (g *guideChecks) restored() {
	t := g.r.t
	g.scopesGranted()
	if markerOf(t, g.plane1(), g.runID) == nil {
		t.Errorf("after the restore: run %s has no revocation marker, want the one from before the backup", g.runID)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := g.plane1().JS(t).Stream(ctx, subjects.AuditStream(testSpace)); err != nil {
		t.Errorf("after the restore: the audit stream: %v", err)
	}
}

// planesMoved: each moved plane is the same instance, one epoch on.
func (g *guideChecks) planesMoved() {
	t := g.r.t
	for _, moved := range [][2]string{{"plane3", "plane3-new-host"}, {"solo", "solo-new-place"}} {
		from, to := g.started(moved[0]), g.started(moved[1])
		if len(from) != 1 || len(to) != 1 {
			t.Fatalf("started %d %s and %d %s, want one each", len(from), moved[0], len(to), moved[1])
		}
		iid, epoch := summaryInstance(t, from[0])
		again, next := summaryInstance(t, to[0])
		if again != iid || next != epoch+1 {
			t.Errorf("%s moved to %s: got instance %s epoch %d, want %s epoch %d", moved[0], moved[1], again, next, iid, epoch+1)
		}
	}
}

// metricsRead: each replica's scrape says its epoch, and the two together counted the guide's
// calls (the queue group gives each call to either replica).
func (g *guideChecks) metricsRead() {
	t := g.r.t
	scrapes := g.r.curls[len(g.r.curls)-2:]
	calls := 0.0
	for _, scrape := range scrapes {
		body := string(scrape.Body)
		for _, want := range []string{"authplane_process_epoch 0", "authplane_fenced 0"} {
			if !strings.Contains(body, want) {
				t.Errorf("/metrics: want %q in:\n%s", want, body)
			}
		}
		for _, line := range strings.Split(body, "\n") {
			if !strings.HasPrefix(line, "authplane_requests_total{") {
				continue
			}
			n, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			if err != nil {
				t.Fatalf("/metrics: %q: %v", line, err)
			}
			calls += n
		}
	}
	if calls < 1 {
		t.Errorf("/metrics: the two replicas counted %v calls, want the guide's revocation at least", calls)
	}
}

// connectionsCounted: each replica counts the data account's connections of the whole space,
// as the guide says: both replicas' serving users are the plane's own on each scrape of the
// metrics section.
func (g *guideChecks) connectionsCounted() {
	t := g.r.t
	for i, scrape := range g.r.curls[len(g.r.curls)-2:] {
		plane := -1.0
		for _, line := range strings.Split(string(scrape.Body), "\n") {
			if v, ok := strings.CutPrefix(line, `authplane_data_connections{who="plane"} `); ok {
				var err error
				if plane, err = strconv.ParseFloat(v, 64); err != nil {
					t.Fatalf("/metrics: %q: %v", line, err)
				}
			}
		}
		if plane < 2 {
			t.Errorf("replica %d's /metrics: the plane's own connections counted %v, want both replicas' serving users", i+1, plane)
		}
	}
}

// keysRotated: after the rotation two keys are listed and published, and the new one signs.
func (g *guideChecks) keysRotated() {
	t := g.r.t
	lines := strings.Split(strings.TrimSpace(g.r.out), "\n")
	if len(lines) != 2 || !strings.HasSuffix(lines[1], "signs") && !strings.HasSuffix(lines[0], "signs") ||
		!strings.Contains(g.r.out, "may retire from") {
		t.Errorf("keys list after the rotation: got %q, want the new key signing and the old one stopped", g.r.out)
	}
	var set struct {
		Keys []struct {
			KID string `json:"kid"`
		} `json:"keys"`
	}
	if err := json.Unmarshal(g.r.got.Body, &set); err != nil || len(set.Keys) != 2 {
		t.Errorf("/jwks after the rotation: got %s (%v), want both keys published", g.r.got.Body, err)
	}
	for _, k := range set.Keys {
		if !strings.Contains(g.r.out, k.KID) {
			t.Errorf("/jwks publishes %s, which keys list does not show", k.KID)
		}
	}
}
