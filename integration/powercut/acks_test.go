package powercut

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/subjects"
)

// What the plane acknowledged, kept outside the mount: in memory, for the checks, and as JSON
// lines in a file of the test's temp folder (no seed, JWT or bearer in it), to read after a
// failure. An answer counts as an acknowledgement only if it was read before the cut began.
// A write sent and not acknowledged (an end under way, a grant whose answer was lost) is kept as
// pending: after the cut it may or may not have landed, and what the restart shows settles it.

// The kinds of acknowledged writes, as the log and the loss reports name them.
const (
	kindCredential = "credential" // a credential the client received: its minted record and claim
	kindEpoch      = "epoch"      // a prepare's process epoch on the instance's gate
	kindAdmission  = "admission"  // a run admitted
	kindAttempt    = "attempt"    // a run fence advanced by an attempt
	kindRunRevoke  = "run revocation"
	kindAssign     = "assignment"
	kindEnd        = "end"   // an assignment ended and its gate retired, its keys refused
	kindScope      = "scope" // a ledger row's scope (`authplane grant`)
	kindAgent      = "agent" // an agent's secret set or revoked
)

// cred is a credential the client received, and what it takes to connect with it.
type cred struct {
	NKey     string `json:"nkey"`
	Instance string `json:"instance"`
	Duty     string `json:"duty"`
	Exp      int64  `json:"exp"`
	Trial    int    `json:"trial"`
	jwt      string
	seed     []byte
}

// mgr is a manager the load registered: its keys and its current proof. ok says its state is
// known: its last prepare was acknowledged and it was activated since.
type mgr struct {
	m    client.Manager
	keys map[subjects.Duty]nkeys.KeyPair
	cur  client.Renewal
	ok   bool
}

// epochAck is the newest process epoch acknowledged for an instance, and the proof that was
// current before it (nil for a first prepare): a renewal with it must be refused after.
type epochAck struct {
	Instance string `json:"instance"`
	Epoch    uint64 `json:"epoch"`
	Trial    int    `json:"trial"`
	mgr      *mgr
	old      *client.Renewal
}

// runAck is an admitted run, its newest acknowledged takeover and whether its revocation was
// acknowledged.
type runAck struct {
	RunID    string `json:"runId"`
	Instance string `json:"instance"`
	Epoch    uint64 `json:"epoch"` // the run fence's, 0 before an attempt
	Token    uint64 `json:"fencingToken"`
	Trial    int    `json:"trial"`
	mgr      *mgr
}

// endAck is an assignment and its end.
type endAck struct {
	Owner     string `json:"owner"`
	Instance  string `json:"instance"`
	Lifecycle string `json:"lifecycle"`
	Trial     int    `json:"trial"`
}

// scopeAck is a principal's scope as last acknowledged, and those sent since whose answer did
// not come (any of them may have landed).
type scopeAck struct {
	Scope   []string `json:"scope"`
	Trial   int      `json:"trial"`
	pending [][]string
}

// agentAck is an agent's secret as last acknowledged ("" once revoked) and a bearer it was
// given; pending says a set or revoke was sent since without an answer (any secret may be there).
type agentAck struct {
	Revoked bool `json:"revoked"`
	Trial   int  `json:"trial"`
	secret  string
	bearer  harness.Exchanged
	pending bool
}

// acks is the log of what the plane acknowledged.
type acks struct {
	mu      sync.Mutex
	cutting bool
	trial   int
	file    *os.File
	path    string

	creds    map[string]*cred     // by nkey
	epochs   map[string]*epochAck // by instance
	runs     map[string]*runAck   // admitted runs, by run id
	revoked  map[string]*runAck   // revoked runs, by run id
	assigned map[string]*endAck   // by instance
	ends     map[string]*endAck   // ended, by instance
	underway map[string]*endAck   // ends sent and not acknowledged, by instance
	scopes   map[string]*scopeAck // by principal
	agents   map[string]*agentAck // by principal
	// counts are the acknowledgements of the current trial, by kind.
	counts map[string]int
	// refusals are the load's refusals and failures before the cut, by operation and code.
	refusals map[string]int
}

func newAcks(t *testing.T) *acks {
	t.Helper()
	path := t.TempDir() + "/acknowledged.jsonl"
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return &acks{file: f, path: path, creds: map[string]*cred{}, epochs: map[string]*epochAck{}, runs: map[string]*runAck{},
		revoked: map[string]*runAck{}, assigned: map[string]*endAck{}, ends: map[string]*endAck{}, underway: map[string]*endAck{},
		scopes: map[string]*scopeAck{}, agents: map[string]*agentAck{}, counts: map[string]int{}, refusals: map[string]int{}}
}

// beginTrial starts counting the acknowledgements of trial n (the cut that ends it is cut n).
func (a *acks) beginTrial(n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.trial, a.cutting, a.counts, a.refusals = n, false, map[string]int{}, map[string]int{}
}

// beginCut stops counting: an answer read from now on is not an acknowledgement.
func (a *acks) beginCut() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.cutting = true
}

// ack records one acknowledgement of kind with apply, unless the cut has begun; it reports
// whether it counted.
func (a *acks) ack(kind string, entry any, apply func()) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cutting {
		return false
	}
	apply()
	a.counts[kind]++
	line, _ := json.Marshal(map[string]any{"trial": a.trial, "kind": kind, "ack": entry})
	fmt.Fprintf(a.file, "%s\n", line)
	return true
}

// refused counts a refusal or failure of the load's operation op before the cut.
func (a *acks) refused(op string, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cutting {
		return
	}
	code := client.CodeOf(err)
	if code == "" {
		code = "no answer"
	}
	a.refusals[op+" "+code]++
}

// material records the credentials of mat, minted for manager m, as received.
func (a *acks) material(m client.Manager, keys map[subjects.Duty]nkeys.KeyPair, creds map[string]client.Credential) bool {
	received := map[string]*cred{}
	for duty, c := range creds {
		uc, err := jwt.DecodeUserClaims(c.JWT)
		if err != nil {
			continue // checked by the flows' tests; here it would only be unusable
		}
		var seed []byte
		if kp := keys[subjects.Duty(duty)]; kp != nil {
			seed, _ = kp.Seed()
		}
		received[uc.Subject] = &cred{NKey: uc.Subject, Instance: m.InstanceID, Duty: duty, Exp: c.Exp, jwt: c.JWT, seed: seed}
	}
	return a.ack(kindCredential, slices.Sorted(maps.Keys(received)), func() {
		for k, c := range received {
			c.Trial = a.trial
			a.creds[k] = c
		}
		a.counts[kindCredential] += len(received) - 1
	})
}

// summary says what the current trial acknowledged, and what the load had refused or failed,
// by kind.
func (a *acks) summary() (acked, refused string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return counted(a.counts), counted(a.refusals)
}

// acked counts the current trial's acknowledgements.
func (a *acks) acked() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, c := range a.counts {
		n += c
	}
	return n
}

// counted writes counts by key, sorted, as "key ×n".
func counted(counts map[string]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		if counts[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s ×%d", k, counts[k]))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
