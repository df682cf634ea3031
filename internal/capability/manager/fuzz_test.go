package manager

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/internal/core/audit"
	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/subjects"
)

// fuzzKey is a fixed public nkey of prefix, the n-th: seeds stay the same from run to run.
func fuzzKey(tb testing.TB, prefix nkeys.PrefixByte, n byte) string {
	tb.Helper()
	kp, err := nkeys.FromRawSeed(prefix, bytes.Repeat([]byte{n}, 32))
	if err != nil {
		tb.Fatal(err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		tb.Fatal(err)
	}
	return pub
}

// fuzzEnvelope is the envelope of this package's table tests: instance, lifecycle and request
// id on their grammar, five fixed duty keys, and, for current, the proof, account and epoch
// of a renewal.
func fuzzEnvelope(tb testing.TB, kind string, current bool) map[string]any {
	b := map[string]any{
		"v": 1, "kind": kind, "space": "default", "actor": "cli",
		"instanceId": strings.Repeat("i", 26), "managerLifecycleUid": strings.Repeat("l", 26),
		"requestId": strings.Repeat("r", 22), "identities": client.Identities{
			Supervisor: client.Identity{ID: fuzzKey(tb, nkeys.PrefixByteUser, 1)}, Executor: client.Identity{ID: fuzzKey(tb, nkeys.PrefixByteUser, 2)},
			Serve: client.Identity{ID: fuzzKey(tb, nkeys.PrefixByteUser, 3)}, GoalWriter: client.Identity{ID: fuzzKey(tb, nkeys.PrefixByteUser, 4)},
			SessionLedger: client.Identity{ID: fuzzKey(tb, nkeys.PrefixByteUser, 5)},
		},
	}
	if current {
		with(b, "registrationProof", "sha256:"+strings.Repeat("0", 64), "accountPublicKey", fuzzKey(tb, nkeys.PrefixByteAccount, 6), "processEpoch", 0)
	}
	return b
}

func marshalSeed(tb testing.TB, v any) []byte {
	tb.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		tb.Fatal(err)
	}
	return data
}

// hostileSeeds are bodies of the integration suite's hostile callers that stay small.
func hostileSeeds(good string) []string {
	seeds := []string{``, ` `, `null`, ` null `, `[]`, `[{}]`, `"kind"`, `1`, `true`, `{`, `}`, `{}{}`, "\x00",
		`{"kind":"manager-service-authority"}{}`, `{"kind":"manager-service-authority",}`, `{"kind":"x"}`,
		`{"kind":"manager-run-attempt"}`, `{"kind":"manager-run-status","v":1,"space":"default","runId":"x"}`,
		strings.Repeat(`{"kind":`, 64) + `1` + strings.Repeat(`}`, 64),
		`{"kind":"manager-service-authority","identities":` + strings.Repeat(`[`, 64) + strings.Repeat(`]`, 64) + `}`,
	}
	for _, v := range []string{`1e999`, `-0`, `1.0`, `-1`, `18446744073709551616`, `"1"`, `true`} {
		seeds = append(seeds, strings.Replace(good, `"v":1`, `"v":`+v, 1))
	}
	for _, s := range []string{`\u0000`, `\u2028`, `<script>`, `\ud800`, `a\nb`, `*`, `>`, `a.b`, `é`} {
		seeds = append(seeds, strings.Replace(good, `"cli"`, `"`+s+`"`, 1))
	}
	return append(seeds, strings.Replace(good, `"cli"`, "\"cli\xff\"", 1), strings.Replace(good, `{`, `{"`+strings.Repeat("<", 300)+`":1,`, 1))
}

// fuzzEngine is an engine over empty in-memory stores, with no pipeline: a request that passes
// its parse is refused at its authorization (no ledger row, no admission), before anything is
// signed.
func fuzzEngine() *Engine {
	return &Engine{Space: "default", Gates: testkit.NewKV(), Ledger: testkit.NewKV(), Admissions: testkit.NewKV(),
		Statuses: testkit.NewKV(), Witness: witnessAll{}, MaxInstancesPerOwner: 3}
}

// checkAbout checks what a request's records say of it: only what passed its grammar.
func checkAbout(t *testing.T, about audit.Request) {
	t.Helper()
	if about.InstanceID != "" && !subjects.ValidUID(about.InstanceID) ||
		about.RequestID != "" && !subjects.ValidRequestID(about.RequestID) ||
		about.RunID != "" && !subjects.ValidRunID(about.RunID) ||
		about.Operation != "" && !knownOperations[about.Operation] {
		t.Fatalf("the records would carry a value off its grammar: %+v", about)
	}
}

// checkEnvelope checks, apart from the parse, that an accepted envelope is on its grammar.
func checkEnvelope(t *testing.T, e *client.Envelope, kind string, current bool) {
	t.Helper()
	if e.V != 1 || e.Kind != kind || !subjects.ValidSpace(e.Space) || !subjects.ValidActor(e.Actor) || !subjects.ValidUID(e.InstanceID) ||
		!subjects.ValidUID(e.ManagerLifecycleUID) || !subjects.ValidRequestID(e.RequestID) || e.Identities == nil {
		t.Fatalf("accepted an envelope off its grammar: %+v", e)
	}
	seen := map[string]bool{}
	for _, d := range subjects.StandingDuties {
		id := e.Identities.Of(d)
		if !subjects.ValidUserNKey(id) || seen[id] {
			t.Fatalf("accepted identity %s %q: a valid user nkey %v, seen before %v", d, id, subjects.ValidUserNKey(id), seen[id])
		}
		seen[id] = true
	}
	if current && (e.RegistrationProof == nil || !subjects.ValidProof(*e.RegistrationProof) ||
		e.AccountPublicKey == nil || !subjects.ValidAccountNKey(*e.AccountPublicKey) || e.ProcessEpoch == nil) {
		t.Fatalf("accepted a request past activate without its proof, account and epoch: %+v", e)
	}
}

// FuzzServiceAuthority checks the manager-service-authority door on any body, as its caller
// cli.* sends it: every refusal of the body is a bounded bad-request (or unimplemented, for
// the original's operations and keys, or permission-denied past the parse); the records keep
// only what passed its grammar; a body Parse accepts is on every grammar, with each
// operation's keys and no others, and what the client encodes of it parses back the same.
func FuzzServiceAuthority(f *testing.F) {
	proofValue := "sha256:" + strings.Repeat("0", 64)
	account := fuzzKey(f, nkeys.PrefixByteAccount, 6)
	base := func(op string) map[string]any { return with(fuzzEnvelope(f, Kind, false), "operation", op) }
	hold := client.RunHold{RunID: "run-" + strings.Repeat("0", 32), TakeoverID: strings.Repeat("a", 16), Epoch: 1, FencingToken: 1,
		Holder: fuzzKey(f, nkeys.PrefixByteUser, 1) + "." + strings.Repeat("a", 16), DriverID: fuzzKey(f, nkeys.PrefixByteUser, 7), MediatorID: fuzzKey(f, nkeys.PrefixByteUser, 8)}
	// The cases of TestParseKeysPerOperation, and a renewRunDriver.
	for _, b := range []map[string]any{
		base(OpPrepare),
		with(base(OpActivate), "registrationProof", proofValue),
		with(base(OpRenew), "registrationProof", proofValue, "accountPublicKey", account, "processEpoch", 0),
		with(base(OpActivate), "registrationProof", proofValue, "processEpoch", 0),
		with(base(OpActivate), "registrationProof", proofValue, "accountPublicKey", account),
		with(base(OpRenew), "registrationProof", proofValue, "processEpoch", 0),
		with(base(OpRenew), "registrationProof", proofValue, "accountPublicKey", fuzzKey(f, nkeys.PrefixByteUser, 9), "processEpoch", 0),
		with(base(OpPrepare), "run", map[string]any{}),
		with(base("retire"), "registrationProof", proofValue),
		with(base(OpPrepare), "transferReader", map[string]any{}),
		with(base(OpRenewRunDriver), "registrationProof", proofValue, "accountPublicKey", account, "processEpoch", 0, "run", hold),
	} {
		f.Add(marshalSeed(f, b))
	}
	for _, s := range hostileSeeds(string(marshalSeed(f, base(OpPrepare)))) {
		f.Add([]byte(s))
	}
	e := fuzzEngine()
	caller := Caller{Owner: testOwner, Actor: "cli"}
	f.Fuzz(func(t *testing.T, data []byte) {
		reply, about, err := e.ServiceAuthority(ctx(t), caller, audit.Request{}, data)
		checkAbout(t, about)
		if err == nil {
			t.Fatalf("an engine with no ledger row served %T", reply)
		}
		req, perr := Parse(data)
		if perr != nil {
			r := testkit.Refused(t, perr, data, fault.BadRequest, fault.Unimplemented)
			if got := fault.As(err); got.Code != r.Code || got.Message != r.Message {
				t.Fatalf("the door refused %v, Parse %v", err, perr)
			}
			if r.Code == fault.Unimplemented {
				var back Request
				if fault.Decode(data, &back) != nil || back.Session == nil && back.Retirement == nil && back.ContractArtifacts == nil &&
					back.TransferReader == nil && !slices.Contains([]string{"session", "retire", "transferReader"}, back.Operation) {
					t.Fatalf("unimplemented for a body that names none of the original's operations or keys: %q", short(data))
				}
			}
			return
		}
		// Past the parse, the caller's actor and space, then its scope: this engine has no
		// ledger row.
		testkit.Refused(t, err, data, fault.BadRequest, fault.PermissionDenied)
		checkEnvelope(t, &req.Envelope, Kind, req.Operation != OpPrepare && req.Operation != OpActivate)
		first := req.Operation == OpPrepare || req.Operation == OpActivate
		switch {
		case !slices.Contains([]string{OpPrepare, OpActivate, OpRenew, OpRenewStandingBundle, OpRenewRunDriver}, req.Operation):
			t.Fatalf("accepted operation %q", req.Operation)
		case req.Session != nil || req.Retirement != nil || req.ContractArtifacts != nil || req.TransferReader != nil:
			t.Fatal("accepted a key of the original this plane does not implement")
		case req.Operation == OpPrepare && req.RegistrationProof != nil:
			t.Fatal("accepted a prepare with a proof")
		case req.Operation == OpActivate && (req.RegistrationProof == nil || !subjects.ValidProof(*req.RegistrationProof)):
			t.Fatal("accepted an activate without a proof")
		case first && (req.AccountPublicKey != nil || req.ProcessEpoch != nil):
			t.Fatalf("accepted a %s with a renewal's keys", req.Operation)
		case (req.Operation == OpRenewRunDriver) != (req.Run != nil):
			t.Fatalf("accepted a %s with run %v", req.Operation, req.Run)
		case req.Run != nil && (!subjects.ValidRunID(req.Run.RunID) || !subjects.ValidTakeoverID(req.Run.TakeoverID) || req.Run.Epoch < 1 ||
			req.Run.FencingToken < 1 || req.Run.Holder != req.Identities.Supervisor.ID+"."+req.Run.TakeoverID):
			t.Fatalf("accepted a run hold off its grammar: %+v", req.Run)
		}
		again, err := Parse(marshalSeed(t, req.ServiceAuthority))
		if err != nil || !reflect.DeepEqual(again, req) {
			t.Fatalf("what the client encodes of an accepted request parses as %+v, %v; want %+v", again, err, req)
		}
	})
}

// runKinds are the run requests of manager-authority, each through its entry point.
var runKinds = []struct {
	kind  string
	serve func(e *Engine, ctx context.Context, caller Caller, data []byte) (audit.Request, error)
	parse func() runRequest
}{
	{client.KindRunAdmission, func(e *Engine, ctx context.Context, c Caller, data []byte) (audit.Request, error) {
		_, about, err := e.Admit(ctx, c, audit.Request{}, data)
		return about, err
	}, func() runRequest { return new(admissionRequest) }},
	{client.KindRunAttempt, func(e *Engine, ctx context.Context, c Caller, data []byte) (audit.Request, error) {
		_, about, err := e.Attempt(ctx, c, audit.Request{}, data)
		return about, err
	}, func() runRequest { return new(attemptRequest) }},
	{client.KindRunRevoke, func(e *Engine, ctx context.Context, c Caller, data []byte) (audit.Request, error) {
		_, about, err := e.RevokeRun(ctx, c, audit.Request{}, data)
		return about, err
	}, func() runRequest { return new(revokeRequest) }},
	{client.KindRunStatus, func(e *Engine, ctx context.Context, c Caller, data []byte) (audit.Request, error) {
		_, about, err := e.ReportStatus(ctx, c, audit.Request{}, data)
		return about, err
	}, nil},
}

// FuzzRunRequests checks the run doors (admission, attempt, revoke, status) on any body: every
// refusal of the body is a bounded bad-request (permission-denied only once the body parsed:
// another space, or the authorization this engine of empty stores cannot give); the records keep
// only what passed its grammar; an accepted body is on every grammar, and what the client
// encodes of it parses back the same.
func FuzzRunRequests(f *testing.F) {
	runID := "run-" + strings.Repeat("0", 32)
	attempt := client.Attempt{RunID: runID, TakeoverID: strings.Repeat("a", 15) + "1", Epoch: 1, FencingToken: 1,
		DriverID: fuzzKey(f, nkeys.PrefixByteUser, 7), MediatorID: fuzzKey(f, nkeys.PrefixByteUser, 8)}
	subject := subjects.RunStart{Space: "default", Route: subjects.RouteOne, Owner: testOwner, Actor: "starter",
		UID: strings.Repeat("u", 26), Generation: "1", Nonce: runID[4:20]}.Subject()
	// The bodies of runs_test.go, each of its own kind.
	bodies := []map[string]any{
		with(fuzzEnvelope(f, client.KindRunAdmission, true), "run", client.RunStart{RunID: runID, Subject: subject}),
		with(fuzzEnvelope(f, client.KindRunAttempt, true), "attempt", attempt),
		with(fuzzEnvelope(f, client.KindRunRevoke, true), "revoke", client.Revoke{RunID: runID, Reason: "stop"}),
		{"v": 1, "kind": client.KindRunStatus, "space": "default", "runId": runID, "state": client.RunRunning,
			"holder": fuzzKey(f, nkeys.PrefixByteUser, 1) + "." + attempt.TakeoverID, "epoch": 1, "fencingToken": 1},
	}
	for i, b := range bodies {
		good := marshalSeed(f, b)
		f.Add(uint8(i), good)
		for _, s := range hostileSeeds(string(good)) {
			f.Add(uint8(i), []byte(s))
		}
	}
	f.Add(uint8(2), marshalSeed(f, with(fuzzEnvelope(f, client.KindRunRevoke, true), "revoke", client.Revoke{RunID: runID, Reason: " "})))
	f.Add(uint8(0), marshalSeed(f, with(fuzzEnvelope(f, client.KindRunAdmission, true), "space", "other", "run", client.RunStart{RunID: runID, Subject: subject})))
	e := fuzzEngine()
	caller := Caller{Owner: testOwner, Actor: "cli"}
	f.Fuzz(func(t *testing.T, which uint8, data []byte) {
		rk := runKinds[int(which)%len(runKinds)]
		about, err := rk.serve(e, ctx(t), caller, data)
		checkAbout(t, about)
		r := testkit.Refused(t, err, data, fault.BadRequest, fault.PermissionDenied)
		if rk.parse == nil { // status: its own body
			var s client.RunStatus
			if r.Code == fault.PermissionDenied && (fault.Decode(data, &s) != nil || s.V != 1 || s.Kind != client.KindRunStatus ||
				!subjects.ValidRunID(s.RunID) || !validState(s.State) || !holderRe.MatchString(s.Holder) || s.Epoch < 1 || s.FencingToken < 1) {
				t.Fatalf("permission-denied for a status off its grammar: %q", short(data))
			}
			return
		}
		req := rk.parse()
		if _, err := e.parseRun(caller, audit.Request{}, data, rk.kind, req); err != nil {
			if p := testkit.Refused(t, err, data, fault.BadRequest, fault.PermissionDenied); p.Code != r.Code || p.Message != r.Message {
				t.Fatalf("the door refused %v, its parse %v", r, p)
			}
			if p := fault.As(err); p.Code == fault.PermissionDenied && req.envelope().Space == e.Space {
				t.Fatalf("permission-denied from the parse of a body of this space: %v", p)
			}
			return
		}
		if r.Code != fault.PermissionDenied {
			t.Fatalf("a body that parses was refused %v", r)
		}
		env := req.envelope()
		checkEnvelope(t, env, rk.kind, true)
		if env.Actor != caller.Actor || env.Space != e.Space || !subjects.ValidRunID(req.runID()) {
			t.Fatalf("accepted a run request of actor %q, space %q, run %q", env.Actor, env.Space, req.runID())
		}
		again := rk.parse()
		if _, err := e.parseRun(caller, audit.Request{}, marshalSeed(t, req), rk.kind, again); err != nil || !reflect.DeepEqual(again, req) {
			t.Fatalf("what the client encodes of an accepted request parses as %+v, %v; want %+v", again, err, req)
		}
	})
}

// storedRows are the rows this package decodes from the stores, each read the way the engine
// reads it: the run fence, the run status, the admission and the owner's instances.
var storedRows = []struct {
	name string
	put  func(e *Engine, data []byte)
	// read returns the row read, or nil and the error.
	read func(ctx context.Context, e *Engine) (any, error)
	// check checks what the decoder promises of a row it accepts.
	check func(row any) bool
}{
	{"run fence", func(e *Engine, data []byte) { e.Gates.(*testkit.KV).Put(subjects.RunFenceKey(fuzzRunID), data) },
		func(ctx context.Context, e *Engine) (any, error) {
			o, err := e.observeRunFence(ctx, fuzzRunID)
			if err != nil {
				return nil, err
			}
			return o.Row, nil
		},
		func(row any) bool { f := row.(runFence); return f.V == 1 && f.RunID == fuzzRunID && f.Nonce != "" }},
	{"run status", func(e *Engine, data []byte) { e.Statuses.(*testkit.KV).Put(subjects.RunStatusKey(fuzzRunID), data) },
		func(ctx context.Context, e *Engine) (any, error) {
			o, err := e.readStatus(ctx, fuzzRunID)
			if err != nil {
				return nil, err
			}
			return o.Row, nil
		},
		func(row any) bool { s := row.(status); return s.V == 1 && validState(s.State) }},
	{"admission", func(e *Engine, data []byte) { e.Admissions.(*testkit.KV).Put(subjects.AdmissionKey(fuzzRunID), data) },
		func(ctx context.Context, e *Engine) (any, error) {
			a, _, err := e.readAdmission(ctx, fuzzRunID)
			switch {
			case a != nil && err != nil:
				return a, err // a half-filled row: refused below
			case a == nil:
				return nil, err
			}
			return *a, err
		},
		func(row any) bool { a := row.(admission); return a.Version == 1 && a.RunID == fuzzRunID }},
	{"instances", func(e *Engine, data []byte) { e.Gates.(*testkit.KV).Put(subjects.InstancesKey(testOwner), data) },
		func(ctx context.Context, e *Engine) (any, error) {
			o, err := instancesOf(e.Gates, testOwner).Observe(ctx)
			if err != nil {
				return nil, e.checkQuota(ctx, testOwner) // what a registration answers
			}
			return o.Row, nil
		},
		func(row any) bool {
			r := row.(instances)
			return r.V == 1 && r.Owner == testOwner && slices.IsSorted(r.IDs)
		}},
}

const fuzzRunID = "run-0123456789abcdef0123456789abcdef"

// FuzzStoredRows checks the decoders of the rows this package reads from the stores on any
// stored bytes: a row that does not parse is an error (internal, fence.ErrMalformed in its
// chain) and no row; a row that parses keeps the decoder's promises, and written back as the
// fence writes it (marshalled), parses again to the same bytes.
func FuzzStoredRows(f *testing.F) {
	nonce := strings.Repeat("n", 22)
	seeds := []any{
		runFence{V: 1, RunID: fuzzRunID, InstanceID: strings.Repeat("i", 26), Holder: "h.t", TakeoverID: "t", Epoch: 1, FencingToken: 1, DriverID: "d", MediatorID: "m", Nonce: nonce},
		runFence{V: 1, RunID: fuzzRunID, InstanceID: strings.Repeat("i", 26), Revoked: true, Nonce: nonce},
		status{V: 1, State: client.RunRunning, Holder: "h.t", Epoch: 1, FencingToken: 1, At: 1},
		admission{Version: 1, Space: "default", Endpoint: subjects.GateEndpointManager, RunID: fuzzRunID, InstanceID: strings.Repeat("i", 26),
			Caller: admittedCaller{Owner: testOwner, Actor: "starter", UID: strings.Repeat("u", 26), Generation: "1"}, Subject: "s", AdmittedAt: 1},
		instances{V: 1, Owner: testOwner, IDs: []string{strings.Repeat("a", 26), strings.Repeat("b", 26)}},
	}
	for i, s := range seeds {
		which := []uint8{0, 0, 1, 2, 3}[i]
		good := marshalSeed(f, s)
		f.Add(which, good)
		for _, bad := range []string{`{"v":2}`, `not json`, `{}`, `null`, strings.Replace(string(good), `}`, `,"extra":1}`, 1),
			strings.Replace(string(good), `"v":1`, `"v":1,"v":1`, 1), strings.Replace(string(good), `1`, `-1`, 1)} {
			f.Add(which, []byte(bad))
		}
	}
	f.Fuzz(func(t *testing.T, which uint8, data []byte) {
		r := storedRows[int(which)%len(storedRows)]
		e := fuzzEngine()
		r.put(e, data)
		row, err := r.read(ctx(t), e)
		if err != nil {
			if row != nil {
				t.Fatalf("%s: a malformed row came back as %+v with %v", r.name, row, err)
			}
			if fault.CodeOf(err) != fault.Internal {
				t.Fatalf("%s: a malformed row: got %v, want internal", r.name, err)
			}
			if r.name != "admission" && !errors.Is(err, fence.ErrMalformed) {
				t.Fatalf("%s: a malformed row: got %v, want fence.ErrMalformed in its chain", r.name, err)
			}
			return
		}
		if !r.check(row) {
			t.Fatalf("%s: accepted %+v from %q", r.name, row, short(data))
		}
		written := marshalSeed(t, row)
		again := fuzzEngine()
		r.put(again, written)
		back, err := r.read(ctx(t), again)
		if err != nil {
			t.Fatalf("%s: the row %q, written back as %s, does not parse: %v", r.name, short(data), written, err)
		}
		if rewritten := marshalSeed(t, back); !bytes.Equal(rewritten, written) {
			t.Fatalf("%s: round trip: got %s, want %s", r.name, rewritten, written)
		}
	})
}

// short is at most 200 bytes of b, for a failure's message.
func short(b []byte) string { return fault.Clip(string(b), 200) }
