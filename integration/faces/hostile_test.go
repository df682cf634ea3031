package faces

import (
	"encoding/base32"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// hostileCase is one body a hostile caller sends, and the code it must get.
type hostileCase struct {
	name string
	body []byte
	code string
}

// hostileBodies returns the bodies of the hostile-callers table: oversized, deeply nested,
// duplicate and case-variant keys, escapes, huge numbers, invalid UTF-8, non-canonical keys,
// wrong types and grammars, on every operation's envelope.
func hostileBodies(t *testing.T) []hostileCase {
	m := harness.NewManagerKeys(t)
	pub := m.Pub(t, "supervisor")
	base := func() map[string]any { return m.Body(t, "prepare", "cli") }
	raw := func(b map[string]any) string { return harness.Marshal(t, b) }
	var cases []hostileCase
	add := func(name, body, code string) { cases = append(cases, hostileCase{name, []byte(body), code}) }
	bad := func(name, body string) { add(name, body, "bad-request") }

	big := strings.Repeat("<", 60000)
	digits := strings.Repeat("9", 60000)
	bad("an unknown kind of 60,000 angle brackets", `{"kind":"`+big+`"}`)
	bad("a 60,000-digit version", strings.Replace(raw(base()), `"v":1`, `"v":`+digits, 1))
	bad("a 60,000-digit epoch", raw(harness.With(base(), "processEpoch", json.Number(digits))))
	bad("an unknown key of 60,000 bytes", strings.Replace(raw(base()), `{`, `{"`+big+`":1,`, 1))
	bad("a body one byte over 64 KiB", `{"kind":"`+strings.Repeat("a", 64<<10)+`"}`)
	bad("a body of exactly 64 KiB that is not an object", `"`+strings.Repeat("a", 64<<10-2)+`"`)
	bad("a 60,000-byte actor", raw(harness.With(base(), "actor", big)))
	bad("a 60,000-byte requestId", raw(harness.With(base(), "requestId", big)))
	bad("a 60,000-byte operation", raw(harness.With(base(), "operation", big)))
	bad("a 60,000-byte nkey", raw(harness.With(base(), "identities", map[string]any{"supervisor": map[string]any{"id": big}})))
	bad("a 60,000-byte proof", raw(harness.With(m.Body(t, "activate", "cli"), "registrationProof", big)))
	for _, depth := range []int{64, 1000, 10000} {
		bad(fmt.Sprintf("objects nested %d deep", depth), strings.Repeat(`{"kind":`, depth)+`1`+strings.Repeat(`}`, depth))
		bad(fmt.Sprintf("arrays nested %d deep", depth), `{"kind":"manager-service-authority","identities":`+strings.Repeat(`[`, depth)+strings.Repeat(`]`, depth)+`}`)
		bad(fmt.Sprintf("identities nested %d deep", depth), strings.Replace(raw(base()), `"identities":{`, `"identities":{"x":`+strings.Repeat(`{"a":`, depth)+`1`+strings.Repeat(`}`, depth)+`,`, 1))
	}
	for _, key := range []string{"v", "kind", "operation", "space", "actor", "instanceId", "managerLifecycleUid", "requestId", "identities"} {
		body := raw(base())
		i := strings.Index(body, `"`+key+`":`)
		end := i + len(key) + 3
		for depth := 0; end < len(body); end++ {
			c := body[end]
			if depth == 0 && (c == ',' || c == '}') {
				break
			}
			switch c {
			case '{', '[':
				depth++
			case '}', ']':
				depth--
			}
		}
		member := body[i:end]
		bad("a duplicate "+key, strings.Replace(body, member, member+","+member, 1))
		bad("a case variant of "+key, strings.Replace(body, `"`+key+`":`, `"`+strings.ToUpper(key[:1])+key[1:]+`":`, 1)+"")
		bad("an upper-case "+key, strings.Replace(body, `"`+key+`":`, `"`+strings.ToUpper(key)+`":`, 1))
		bad("a null "+key, strings.Replace(body, member, `"`+key+`":null`, 1))
		bad("an array for "+key, strings.Replace(body, member, `"`+key+`":[1,2]`, 1))
		bad("an object for "+key, strings.Replace(body, member, `"`+key+`":{"a":1}`, 1))
		bad("an escaped name of "+key, strings.Replace(body, `"`+key+`":`, `"\u00`+fmt.Sprintf("%02x", key[0])+key[1:]+`":1,"`+key+`":`, 1))
		bad("a trailing-space name of "+key, strings.Replace(body, `"`+key+`":`, `"`+key+` ":`, 1))
	}
	for _, v := range []string{`1e999`, `-0`, `1.0`, `1e0`, `-1`, `18446744073709551616`, `0x1`, `Infinity`, `NaN`, `"1"`, `true`} {
		bad("version "+v, strings.Replace(raw(base()), `"v":1`, `"v":`+v, 1))
		bad("epoch "+v, strings.Replace(raw(harness.With(m.Body(t, "renew", "cli"), "registrationProof", "sha256:"+strings.Repeat("0", 64), "accountPublicKey", harness.NewAccountKey(t), "processEpoch", "PLACEHOLDER")), `"PLACEHOLDER"`, v, 1))
	}
	for _, s := range []string{`\u0000`, `\u2028`, `<script>`, `\ud800`, `\udfff`, `a\nb`, `../../etc`, `*`, `>`, `a.b`, ` `, `\t`, `é`, `\u00e9`} {
		for _, key := range []string{"actor", "space", "instanceId", "requestId", "kind"} {
			bad(fmt.Sprintf("%s %q", key, s), strings.Replace(raw(harness.With(base(), key, "PLACEHOLDER")), `"PLACEHOLDER"`, `"`+s+`"`, 1))
		}
	}
	for _, b := range [][]byte{{0xff}, {0xc3, 0x28}, {0xed, 0xa0, 0x80}, {0xf4, 0x90, 0x80, 0x80}, {0x80}} {
		bad(fmt.Sprintf("invalid UTF-8 % x", b), strings.Replace(raw(base()), `"cli"`, `"cli`+string(b)+`"`, 1))
	}
	for _, suffix := range []string{"A", "7", "Q", "AAA", "QQQ"} {
		ids := map[string]any{}
		for i, d := range subjects.StandingDuties {
			ids[string(d)] = map[string]any{"id": pub + strings.Repeat(suffix, 1+i%2)}
		}
		bad("five spellings of one nkey ending "+suffix, raw(harness.With(base(), "identities", ids)))
	}
	for i, d := range subjects.StandingDuties {
		ids := m.IdentityMap(t)
		ids[string(d)] = map[string]any{"id": m.Pub(t, subjects.StandingDuties[(i+1)%5]) + "A"}
		bad("a 57-character spelling of another duty's key as "+string(d), raw(harness.With(base(), "identities", ids)))
	}
	for _, body := range []string{``, ` `, `null`, ` null `, `[]`, `[{}]`, `"kind"`, `1`, `true`, `{`, `}`, `{}{}`, `{"kind":"manager-service-authority"}{}`, "\x00", `{"kind":"manager-service-authority",}`} {
		bad(fmt.Sprintf("the body %q", body), body)
	}
	add("an operation of the original", raw(harness.With(base(), "operation", "retire", "registrationProof", "sha256:"+strings.Repeat("0", 64))), "unimplemented")
	add("a key of the original", raw(harness.With(base(), "contractArtifacts", []any{})), "unimplemented")
	bad("a run kind and nothing else", `{"kind":"manager-run-attempt"}`)
	bad("a run status of another kind", `{"kind":"manager-run-status","v":1,"space":"default","runId":"x"}`)
	if len(cases) < 150 {
		t.Fatalf("got %d hostile bodies, want at least 150", len(cases))
	}
	return cases
}

// owners returns n distinct owners.
func owners(n int) []string {
	enc := base32.StdEncoding.WithPadding(base32.NoPadding)
	out := make([]string, n)
	for i := range out {
		tok := strings.ToLower(enc.EncodeToString(fmt.Appendf(nil, "hostile%09d", i)))
		out[i] = "u_" + (tok + strings.Repeat("a", 26))[:26]
	}
	return out
}

// Every hostile body is refused with its code, carries no credential, and leaves a reply, a
// record and log lines of bounded size: what one caller sends cannot grow into what others read.
func TestHostileBodiesAreRefusedWithBoundedEchoes(t *testing.T) {
	t.Parallel()
	logs := &harness.SyncBuffer{}
	p := harness.StartPlane(t, func(c *service.Config) {
		c.Rate = 0
		c.Logger = harness.NewTextLogger(logs)
	})
	cases := hostileBodies(t)
	who := owners(len(cases))
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			owner := who[i]
			nc := harness.CallerConn(t, p, owner, "cli")
			o := harness.Ask(t, nc, owner, "cli", subjects.EndpointManagerAuthority, c.body)
			if o.Code != c.code {
				t.Errorf("got %q %q, want %s", o.Code, o.Message, c.code)
			}
			if len(o.Material.Credentials) != 0 || strings.Contains(string(o.Msg.Data), `"jwt"`) {
				t.Errorf("a refusal carried credentials: %.200s", o.Msg.Data)
			}
			size := len(o.Msg.Data)
			for k, vs := range o.Msg.Header {
				size += len(k) + len(strings.Join(vs, ""))
			}
			if size >= 2<<10 {
				t.Errorf("reply of %d bytes, want under 2 KiB: %.200s", size, o.Msg.Data)
			}
			rec, err := harness.LastMsg(t, p, subjects.AuditStream(harness.TestSpace), subjects.AuditSubject(harness.TestSpace, "refused", owner, "cli"))
			if err != nil {
				t.Fatalf("refused record: %v", err)
			}
			if len(rec.Data) >= 1<<10 {
				t.Errorf("refused record of %d bytes, want under 1 KiB: %.200s", len(rec.Data), rec.Data)
			}
		})
	}
	for _, line := range strings.Split(logs.String(), "\n") {
		if len(line) >= 2<<10 {
			t.Errorf("a log line of %d bytes, want under 2 KiB: %.300s", len(line), line)
		}
	}
	// Discovery still fits in one message for everyone (micro's last_error holds a code only).
	for _, m := range harness.CollectN(t, p.Ops(t), "$SRV.STATS."+subjects.ServiceName, nil, 1, 3*time.Second) {
		if len(m.Data) > 8<<10 {
			t.Errorf("a $SRV.STATS answer of %d bytes, want a few KiB", len(m.Data))
		}
	}
}

// One owner flooding 64 KiB refusals at the rate limit cannot evict another owner's record
// written before the flood: an owner gets 60 full refused records a minute, each at most 1 KiB.
func TestAFloodOfRefusalsCannotEvictAnotherOwnersRecord(t *testing.T) {
	t.Parallel()
	p := harness.StartPlane(t, func(c *service.Config) { c.AuditBytes = 1 << 20 })
	victim := harness.CallerConn(t, p, harness.OwnerB, "cli")
	if o := harness.Ask(t, victim, harness.OwnerB, "cli", subjects.EndpointManagerAuthority, `{"kind":"x"}`); o.Code != "bad-request" {
		t.Fatalf("the victim's request: got %q, want bad-request", o.Code)
	}
	before, err := harness.LastMsg(t, p, subjects.AuditStream(harness.TestSpace), subjects.AuditSubject(harness.TestSpace, "refused", harness.OwnerB, "cli"))
	if err != nil {
		t.Fatal(err)
	}

	// The flood: 400 bodies of 64 KiB as fast as the connection takes them. The rate limit
	// serves the first 200 (its burst) and a hundred a second after; the rest are throttled.
	flooder := harness.CallerConn(t, p, harness.OwnerA, "flood")
	body := []byte(`{"kind":"` + strings.Repeat("<", 64<<10-12) + `"}`)
	const sent = 400
	inbox := flooder.NewRespInbox()
	for range sent {
		if err := flooder.PublishRequest(subjects.EndpointSubject(harness.TestSpace, subjects.EndpointManagerAuthority, harness.OwnerA, "flood"), inbox, body); err != nil {
			t.Fatal(err)
		}
	}
	if err := flooder.Flush(); err != nil {
		t.Fatal(err)
	}
	// Until the plane has answered them all, or answered none for a second: the endpoint's
	// pending limit (8 MiB) drops what is past it, as it should a flood of 25 MiB.
	var answered, still int
	testkit.CheckFor(t, 20*time.Second, 200*time.Millisecond, func() error {
		c := harness.Counters(t, p, subjects.EndpointManagerAuthority)
		if c.Requests >= sent+1 {
			return nil
		}
		if c.Requests != answered {
			answered, still = c.Requests, 0
		} else if still++; still >= 5 {
			return nil
		}
		return fmt.Errorf("the plane has answered %d of %d requests, and goes on", c.Requests, sent+1)
	})

	after, err := harness.LastMsg(t, p, subjects.AuditStream(harness.TestSpace), subjects.AuditSubject(harness.TestSpace, "refused", harness.OwnerB, "cli"))
	if err != nil || after.Sequence != before.Sequence {
		t.Fatalf("owner B's record after %d requests of the flood: got %v, %v; want it still there at %d", sent, after, err, before.Sequence)
	}
	info, err := harness.StreamInfo(t, p, subjects.AuditStream(harness.TestSpace))
	if err != nil {
		t.Fatal(err)
	}
	flood := info.State.Subjects[subjects.AuditSubject(harness.TestSpace, "refused", harness.OwnerA, "flood")]
	if flood > 60 {
		t.Errorf("got %d full refused records of the flooding owner, want at most 60 in the minute", flood)
	}
	t.Logf("sent %d refusals of 64 KiB; %d full records kept, audit stream at %d bytes", sent, flood, info.State.Bytes)
}

// One owner at its quota of live instances is refused more, while another owner's prepare and
// its own existing instance's renewals still work: what every tenant shares stays shared.
func TestAnOwnerAtItsQuotaLeavesOthersWorking(t *testing.T) {
	t.Parallel()
	p := harness.StartPlane(t, func(c *service.Config) { c.MaxInstancesPerOwner = 3; c.Rate = 0 })
	harness.Grant(t, p, harness.OwnerA, "cli", "supervise")
	harness.Grant(t, p, harness.OwnerB, "cli", "supervise")
	a, b := harness.CallerConn(t, p, harness.OwnerA, "cli"), harness.CallerConn(t, p, harness.OwnerB, "cli")
	var first *harness.ManagerKeys
	var firstAct harness.Material
	for i := range 3 {
		m := harness.NewManagerKeys(t)
		_, act := harness.Registered(t, a, harness.OwnerA, "cli", m)
		if i == 0 {
			first, firstAct = m, act
		}
	}
	mintedBefore := harness.LastSeq(t, p, subjects.MintedStream(harness.TestSpace))
	o := harness.Ask(t, a, harness.OwnerA, "cli", subjects.EndpointManagerAuthority, harness.NewManagerKeys(t).Body(t, "prepare", "cli"))
	if o.Code != "resource-exhausted" || !strings.Contains(o.Message, "--max-instances-per-owner") {
		t.Fatalf("a fourth instance of owner A: got %q %q, want resource-exhausted naming the quota", o.Code, o.Message)
	}
	if after := harness.LastSeq(t, p, subjects.MintedStream(harness.TestSpace)); after != mintedBefore {
		t.Fatalf("the refusal at the quota minted (%d → %d)", mintedBefore, after)
	}
	harness.Registered(t, b, harness.OwnerB, "cli", harness.NewManagerKeys(t))
	harness.MustMint(t, a, harness.OwnerA, "cli", harness.Renewal(first.Body(t, "renewStandingBundle", "cli"), firstAct.NextRegistrationProof, p.Account(), 0))
}
