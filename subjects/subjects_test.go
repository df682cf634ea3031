package subjects

import (
	"crypto/sha256"
	"encoding/base32"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const (
	testOwner = "u_aaaaaaaaaaaaaaaaaaaaaaaaaa"
	otherUser = "u_bbbbbbbbbbbbbbbbbbbbbbbbbb"
	testIID   = "abcdefghijklmnopqrstuvwxyz"
	testRunID = "run-0123456789abcdef0123456789abcdef"
)

func TestParseEndpointSubject(t *testing.T) {
	tests := []struct {
		name                   string
		subject                string
		endpoint, owner, actor string
		ok                     bool
	}{
		{"a user owner", "cotal.default.auth.manager-authority." + testOwner + ".cli", EndpointManagerAuthority, testOwner, "cli", true},
		{"a platform owner", "cotal.default.auth.supervisor-end.p_aaaaaaaaaaaaaaaaaaaaaaaaaa.Admin_1", EndpointSupervisorEnd, "p_aaaaaaaaaaaaaaaaaaaaaaaaaa", "Admin_1", true},
		{"a 64-character actor", "cotal.default.auth.run-revoke." + testOwner + "." + strings.Repeat("a", 64), EndpointRunRevoke, testOwner, strings.Repeat("a", 64), true},
		{"another space", "cotal.other.auth.manager-authority." + testOwner + ".cli", "", "", "", false},
		{"a space that extends ours", "cotal.default2.auth.manager-authority." + testOwner + ".cli", "", "", "", false},
		{"not the auth prefix", "cotal.default.authx.manager-authority." + testOwner + ".cli", "", "", "", false},
		{"no actor", "cotal.default.auth.manager-authority." + testOwner, "", "", "", false},
		{"an extra token", "cotal.default.auth.manager-authority." + testOwner + ".cli.x", "", "", "", false},
		{"an owner with upper case", "cotal.default.auth.manager-authority.u_AAAAAAAAAAAAAAAAAAAAAAAAAA.cli", "", "", "", false},
		{"an owner too short", "cotal.default.auth.manager-authority.u_aaaa.cli", "", "", "", false},
		{"an owner of another kind", "cotal.default.auth.manager-authority.x_aaaaaaaaaaaaaaaaaaaaaaaaaa.cli", "", "", "", false},
		{"an owner with a digit outside base32", "cotal.default.auth.manager-authority.u_aaaaaaaaaaaaaaaaaaaaaaaaa1.cli", "", "", "", false},
		{"a wildcard owner", "cotal.default.auth.manager-authority.*.cli", "", "", "", false},
		{"a wildcard actor", "cotal.default.auth.manager-authority." + testOwner + ".*", "", "", "", false},
		{"a full wildcard actor", "cotal.default.auth.manager-authority." + testOwner + ".>", "", "", "", false},
		{"an actor with a dash", "cotal.default.auth.manager-authority." + testOwner + ".a-b", "", "", "", false},
		{"a 65-character actor", "cotal.default.auth.manager-authority." + testOwner + "." + strings.Repeat("a", 65), "", "", "", false},
		{"empty", "", "", "", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, o, a, ok := ParseEndpointSubject("default", tt.subject)
			if ok != tt.ok || e != tt.endpoint || o != tt.owner || a != tt.actor {
				t.Errorf("ParseEndpointSubject(%q): got %q %q %q %v, want %q %q %q %v", tt.subject, e, o, a, ok, tt.endpoint, tt.owner, tt.actor, tt.ok)
			}
		})
	}
}

func TestEndpointSubjectRoundTrips(t *testing.T) {
	for _, e := range Endpoints {
		s := EndpointSubject("default", e, testOwner, "cli")
		ge, go_, ga, ok := ParseEndpointSubject("default", s)
		if !ok || ge != e || go_ != testOwner || ga != "cli" {
			t.Errorf("ParseEndpointSubject(EndpointSubject(%s)): got %q %q %q %v, want %s %s cli true", e, ge, go_, ga, ok, e, testOwner)
		}
		if want := AuthPrefix("default") + "." + EndpointPattern(e); !subjectMatches(want, s) {
			t.Errorf("endpoint pattern %q does not match its subject %q", want, s)
		}
		if !subjectMatches(callerSubjects("default", testOwner, "cli"), s) {
			t.Errorf("caller grant %q does not allow its own subject %q", callerSubjects("default", testOwner, "cli"), s)
		}
		if subjectMatches(callerSubjects("default", testOwner, "cli"), EndpointSubject("default", e, otherUser, "cli")) {
			t.Errorf("caller grant of %s allows another owner's subject", testOwner)
		}
	}
}

func TestReplyAllowedOnlyUnderTheCallersOwnInbox(t *testing.T) {
	in := InboxPrefix(testOwner, "cli")
	tests := []struct {
		name  string
		reply string
		ok    bool
	}{
		{"a token under its inbox", in + ".abc", true},
		{"several tokens under its inbox", in + ".abc.1", true},
		{"what nats.go makes with the custom prefix", in + ".Fz3kG1aNq2.12", true},
		{"its inbox prefix alone", in, false},
		{"its inbox prefix and a dot", in + ".", false},
		{"an empty token first", in + "..x", false},
		{"an empty token between", in + ".x..y", false},
		{"an empty token last", in + ".x.", false},
		{"an actor that extends its own", "_INBOX." + testOwner + ".cliX.y", false},
		{"an actor that extends its own, no dot", "_INBOX." + testOwner + ".cliX", false},
		{"an actor it extends", "_INBOX." + testOwner + ".cl.i", false},
		{"an owner that extends its own", "_INBOX." + testOwner + "x.cli.y", false},
		{"another owner's inbox", InboxPrefix(otherUser, "cli") + ".x", false},
		{"another actor of its owner", InboxPrefix(testOwner, "ops") + ".x", false},
		{"a generic inbox", "_INBOX.abc", false},
		{"a lowercase inbox", "_inbox." + testOwner + ".cli.x", false},
		{"a wildcard token", in + ".*", false},
		{"a full wildcard", in + ".>", false},
		{"a wildcard after a token", in + ".x.>", false},
		{"a space", in + ".a b", false},
		{"a tab", in + ".a\tb", false},
		{"a newline", in + ".a\r\nPUB x 1", false},
		{"a KV subject", "$KV.cotal_auth_default.epgate.auth.x", false},
		{"a JetStream API subject", "$JS.API.STREAM.DELETE.KV_cotal_auth_default", false},
		{"a system subject", "$SYS.REQ.SERVER.PING", false},
		{"a plane subject", EndpointSubject("default", EndpointSupervisorEnd, testOwner, "cli"), false},
		{"empty", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ReplyAllowed(tt.reply, testOwner, "cli"); got != tt.ok {
				t.Errorf("ReplyAllowed(%q, %s, cli): got %v, want %v", tt.reply, testOwner, got, tt.ok)
			}
		})
	}
}

// ownerToken matches a token shaped like an owner.
var ownerToken = regexp.MustCompile(`^[up]_[a-z2-7]{26}$`)

func TestPermissionsGiveEachDutyOnlyItsOwnPrincipal(t *testing.T) {
	duties := append(slices.Clone(StandingDuties), DutyDriver, DutyMediator, DutyCaller, DutyOps)
	for _, d := range duties {
		t.Run(string(d), func(t *testing.T) {
			h := Holder{Space: "default", Owner: testOwner, Actor: "cli", Instance: testIID, RunID: testRunID}
			actor, g, err := PermissionsOf(d, h)
			if err != nil {
				t.Fatalf("Permissions: %v", err)
			}
			wantActor := DutyActor(d, testIID, testRunID)
			if d == DutyCaller || d == DutyOps {
				wantActor = "cli"
			}
			// Only an operator may send micro's own verbs, whose answers go wherever the
			// request says.
			srv := slices.ContainsFunc(g.Pub, func(e string) bool { return strings.HasPrefix(e, "$SRV") })
			if srv != (d == DutyOps) {
				t.Errorf("publish %v: $SRV rights %v, want them for ops only", g.Pub, srv)
			}
			if actor != wantActor {
				t.Errorf("actor: got %q, want %q", actor, wantActor)
			}
			if len(g.Pub) == 0 || len(g.Sub) == 0 {
				t.Fatalf("grant %+v: want non-empty allow lists (an empty list allows everything)", g)
			}
			if !slices.Contains(g.Pub, callerSubjects("default", testOwner, actor)) {
				t.Errorf("publish %v: want its own plane subjects %q", g.Pub, callerSubjects("default", testOwner, actor))
			}
			if !slices.Contains(g.Sub, InboxPrefix(testOwner, actor)+".>") {
				t.Errorf("subscribe %v: want its own inbox %q", g.Sub, InboxPrefix(testOwner, actor)+".>")
			}
			for _, list := range []struct {
				verb string
				subs []string
			}{{"publish", g.Pub}, {"subscribe", g.Sub}} {
				for _, entry := range list.subs {
					checkEntry(t, list.verb, entry, actor)
				}
			}
			// No entry lets it act as another principal.
			for _, other := range []string{
				EndpointSubject("default", EndpointManagerAuthority, otherUser, actor),
				EndpointSubject("default", EndpointManagerAuthority, testOwner, actor+"x"),
				EndpointSubject("default", EndpointManagerAuthority, testOwner, "other"),
			} {
				for _, entry := range g.Pub {
					if subjectMatches(entry, other) {
						t.Errorf("publish %q allows another principal's subject %q", entry, other)
					}
				}
			}
			for _, other := range []string{InboxPrefix(otherUser, actor) + ".x", InboxPrefix(testOwner, actor+"x") + ".x", "_INBOX.x"} {
				for _, entry := range g.Sub {
					if subjectMatches(strings.Fields(entry)[0], other) {
						t.Errorf("subscribe %q reads another principal's inbox %q", entry, other)
					}
				}
			}
		})
	}
}

// checkEntry checks one permission entry: no bare `>`, nothing of JetStream or the system,
// well-formed tokens, and every principal token literal and the holder's.
func checkEntry(t *testing.T, verb, entry, actor string) {
	t.Helper()
	subject, queue, hasQueue := strings.Cut(entry, " ")
	if verb == "publish" && hasQueue {
		t.Errorf("%s %q: a publish entry has no queue group", verb, entry)
	}
	if hasQueue && (queue == "" || strings.ContainsAny(queue, " *>")) {
		t.Errorf("%s %q: malformed queue group", verb, entry)
	}
	switch {
	case subject == ">" || subject == "*" || subject == "*.>":
		t.Errorf("%s %q: a wildcard over everything", verb, entry)
	case strings.HasPrefix(subject, "$JS.") || strings.HasPrefix(subject, "$SYS.") || strings.HasPrefix(subject, "$KV."):
		t.Errorf("%s %q: reaches JetStream or the system account", verb, entry)
	case strings.HasPrefix(subject, "_INBOX.") && !strings.HasPrefix(subject, InboxPrefix(testOwner, actor)+"."):
		t.Errorf("%s %q: an inbox that is not its own", verb, entry)
	}
	tokens := strings.Split(subject, ".")
	for i, tok := range tokens {
		switch {
		case tok == "":
			t.Errorf("%s %q: empty token", verb, entry)
		case tok == ">" && i != len(tokens)-1:
			t.Errorf("%s %q: `>` before the last token", verb, entry)
		case ownerToken.MatchString(tok) && tok != testOwner:
			t.Errorf("%s %q: names owner %s, want only the holder's %s", verb, entry, tok, testOwner)
		}
	}
	if tokens[0] == "$SRV" {
		return
	}
	// Every entry is either scoped to the holder's owner (and then, where an actor follows,
	// to its actor or a tail wildcard), or to the holder's instance or run.
	at := slices.Index(tokens, testOwner)
	if at < 0 {
		if !slices.Contains(tokens, testIID) && !slices.Contains(tokens, testRunID) {
			t.Errorf("%s %q: scoped to no owner, instance or run of the holder", verb, entry)
		}
		return
	}
	if at+1 < len(tokens) {
		if next := tokens[at+1]; next != actor && next != ">" {
			t.Errorf("%s %q: actor token %q after the owner, want %q or a tail `>`", verb, entry, next, actor)
		}
	}
	if at > 0 && tokens[at-1] == "*" && tokens[0] == "_INBOX" {
		t.Errorf("%s %q: wildcard before the owner of an inbox", verb, entry)
	}
}

func TestPermissionsRefuseAnUnknownDuty(t *testing.T) {
	if _, g, err := PermissionsOf("root", Holder{Space: "default", Owner: testOwner, Actor: "cli"}); err == nil {
		t.Errorf("PermissionsOf(root): got %+v, want an error", g)
	}
}

func TestServingAndStorePermissionssStayOutOfTheOtherPlaces(t *testing.T) {
	s := ServingPermissions("default")
	if !slices.Equal(s.Pub, []string{"_INBOX.>"}) {
		t.Errorf("serving publish: got %v, want only _INBOX.>", s.Pub)
	}
	for _, sub := range s.Sub {
		if sub != AuthPrefix("default")+".>" && !strings.HasPrefix(sub, "$SRV.") {
			t.Errorf("serving subscribe %q: want only the plane's requests and $SRV", sub)
		}
	}
	st := StorePermissions("default")
	if !slices.Equal(st.Sub, []string{"_INBOX.>"}) {
		t.Errorf("store subscribe: got %v, want only _INBOX.>", st.Sub)
	}
	for _, p := range st.Pub {
		if p == ">" || strings.HasPrefix(p, "$SYS.") || strings.HasPrefix(p, "_INBOX.") || strings.HasPrefix(p, AuthPrefix("default")) {
			t.Errorf("store publish %q: want only JetStream, KV and the record streams", p)
		}
	}
}

func TestKeysAndBucketsNameTheirSpace(t *testing.T) {
	for _, name := range []string{AuthBucket("s1"), ActorsBucket("s1"), IssuedBucket("s1"), AcceptedBucket("s1"),
		AdmissionBucket("s1"), RecordsBucket("s1"), PlatformBucket("s1"), KeysBucket("s1"), SecretsBucket("s1"),
		SharedWitnessStream("s1"), MintedStream("s1"), AuditStream("s1")} {
		if !strings.HasPrefix(name, "cotal_") || !strings.HasSuffix(name, "_s1") {
			t.Errorf("bucket %q: want cotal_<family>_s1", name)
		}
	}
	if got, want := GateKey(GateEndpointAuth, testIID), "epgate.auth."+testIID; got != want {
		t.Errorf("GateKey: got %q, want %q", got, want)
	}
	if got, want := ActorKey(testOwner, "cli"), "actor."+testOwner+".cli"; got != want {
		t.Errorf("ActorKey: got %q, want %q", got, want)
	}
	if got, want := AuditSubject("s1", "refused", testOwner, "cli"), "cotal.s1.audit.refused."+testOwner+".cli"; got != want {
		t.Errorf("AuditSubject: got %q, want %q", got, want)
	}
	if !subjectMatches(AuditStreamSubjects("s1"), AuditSubject("s1", "refused", testOwner, "cli")) {
		t.Errorf("the audit stream does not capture its records")
	}
	if !subjectMatches(MintedInstanceFilter("s1", testIID), MintedSubject("s1", testIID, []string{"UKEY"})) ||
		!subjectMatches(MintedStreamSubjects("s1"), MintedSubject("s1", testIID, []string{"UKEY"})) {
		t.Errorf("the minted stream or instance filter does not capture its records")
	}
	if got := MintedSubject("s1", "", []string{"UKEY"}); !strings.HasPrefix(got, "cotal.s1.minted._.") || !subjectMatches(MintedStreamSubjects("s1"), got) || ValidUID(NoInstance) {
		t.Errorf("a mint for no instance: got subject %q, want cotal.s1.minted._.<digest> in the stream, under no instance id", got)
	}
}

// TestMintedDigestNamesTheSetOfKeys: a mint's record is filed under its set of keys, whatever
// their order, and no other set shares it: a renewal of {A,C} must not replace the record of
// {A,B}, or B would never be revoked. The digest is one subject token of fixed length, and is
// SHA-256 over the sorted keys joined by "," (docs/PROTOCOL.md, "Records"), so an auditor can
// compute it.
func TestMintedDigestNamesTheSetOfKeys(t *testing.T) {
	a, b, c := "UA"+strings.Repeat("A", 54), "UB"+strings.Repeat("B", 54), "UC"+strings.Repeat("C", 54)
	ab, ba := MintedDigest([]string{a, b}), MintedDigest([]string{b, a, b})
	if ab != ba {
		t.Errorf("the same set in another order, or a key twice, has another digest: %s, %s", ab, ba)
	}
	for name, other := range map[string][]string{"{A,C}": {a, c}, "{A}": {a}, "{B}": {b}, "{A,B,C}": {a, b, c}} {
		if d := MintedDigest(other); d == ab {
			t.Errorf("%s has the digest of {A,B}: %s", name, d)
		}
	}
	if len(ab) != MintedDigestLen || strings.Trim(ab, "abcdefghijklmnopqrstuvwxyz234567") != "" {
		t.Errorf("digest %q: want %d characters of lower-case base32", ab, MintedDigestLen)
	}
	sum := sha256.Sum256([]byte(a + "," + b))
	if want := strings.ToLower(base32.StdEncoding.EncodeToString(sum[:]))[:MintedDigestLen]; ab != want {
		t.Errorf("digest of {A,B}: got %s, want %s, the documented recipe", ab, want)
	}
	if got, want := MintedSubject("s1", testIID, []string{b, a}), "cotal.s1.minted."+testIID+"."+ab; got != want {
		t.Errorf("MintedSubject: got %q, want %q", got, want)
	}
	if got, want := RunActor(testRunID), "wf_0123456789abcdef0123456789abcdef"; got != want {
		t.Errorf("RunActor: got %q, want %q", got, want)
	}
	if o, a, ok := SplitPrincipal(Principal(testOwner, "cli")); !ok || o != testOwner || a != "cli" {
		t.Errorf("SplitPrincipal(Principal): got %q %q %v", o, a, ok)
	}
	for _, bad := range []string{testOwner, testOwner + ".", "." + "cli", testOwner + ".a.b", "x.cli"} {
		if _, _, ok := SplitPrincipal(bad); ok {
			t.Errorf("SplitPrincipal(%q): got ok, want refused", bad)
		}
	}
}

// subjectMatches reports whether NATS subject pattern matches the literal subject.
func subjectMatches(pattern, subject string) bool {
	p, s := strings.Split(pattern, "."), strings.Split(subject, ".")
	for i, tok := range p {
		switch {
		case tok == ">":
			return len(s) > i
		case i >= len(s):
			return false
		case tok != "*" && tok != s[i]:
			return false
		}
	}
	return len(p) == len(s)
}

// An auditor's consumer creation reaches JetStream's create API of the minted and audit
// streams only, and creates the auditor's own consumer, whatever name it asked for (its filter
// kept); a deletion is the plane's too; an auditor's info and pulls are mapped to its own
// consumer.
func TestAnAuditorsCreationMakesItsOwnConsumerOfTheAuditedStreamsOnly(t *testing.T) {
	api := AuditorAPIPrefix("default", "alice")
	audit, minted := AuditStream("default"), MintedStream("default")
	for subject, want := range map[string]string{
		api + ".CONSUMER.CREATE." + audit + ".pager":                                           "$JS.API.CONSUMER.CREATE." + audit + ".alice",
		api + ".CONSUMER.CREATE." + audit + ".pager.>":                                         "$JS.API.CONSUMER.CREATE." + audit + ".alice.>",
		api + ".CONSUMER.CREATE." + minted + ".bob":                                            "$JS.API.CONSUMER.CREATE." + minted + ".alice",
		api + ".CONSUMER.CREATE." + audit:                                                      "",
		api + ".CONSUMER.DELETE." + audit + ".alice":                                           "",
		api + ".CONSUMER.CREATE.KV_cotal_auth_default.x":                                       "",
		AuditorAPIPrefix("other", "alice") + ".CONSUMER.CREATE." + AuditStream("other") + ".x": "",
		"cotal.default.auditor.CONSUMER.CREATE." + audit + ".x":                                "",
		"$JS.API.CONSUMER.CREATE." + audit + ".x":                                              "",
		api + ".CONSUMER.CREATE." + audit + "." + strings.Repeat("n", MaxConsumerName+1):       "",
		api + ".CONSUMER.CREATE." + audit + "." + strings.Repeat("n", MaxConsumerName):         "$JS.API.CONSUMER.CREATE." + audit + ".alice",
	} {
		name, st, asked, got, ok := AuditorCreate("default", subject)
		if got != want || ok != (want != "") || (ok && (name != "alice" || asked == "" || !strings.HasPrefix(want, "$JS.API.CONSUMER.CREATE."+st+"."))) {
			t.Errorf("AuditorCreate(%q): got %q %q %q %q %v, want %q", subject, name, st, asked, got, ok, want)
		}
	}
	if name, st, asked, _, _ := AuditorCreate("default", api+".CONSUMER.CREATE."+audit+".pager.>"); name != "alice" || st != audit || asked != "pager" {
		t.Errorf("AuditorCreate of alice's pager: got %q %q %q, want alice, the audit stream, pager", name, st, asked)
	}
	for subject, want := range map[string]string{
		api + ".CONSUMER.DELETE." + audit + ".pager":                 "pager",
		api + ".CONSUMER.DELETE." + minted + ".x":                    "x",
		api + ".CONSUMER.DELETE." + audit + ".pager.x":               "",
		api + ".CONSUMER.DELETE." + audit:                            "",
		api + ".CONSUMER.CREATE." + audit + ".pager":                 "",
		api + ".CONSUMER.DELETE.KV_cotal_auth_default.x":             "",
		"cotal.default.auditor.CONSUMER.DELETE." + audit + ".x":      "",
		"cotal.default.auditor.alice.CONSUMER.DELETE." + audit + ".": "",
	} {
		name, st, named, ok := AuditorDelete("default", subject)
		if named != want || ok != (want != "") || (ok && (name != "alice" || !strings.Contains(subject, "."+st+"."))) {
			t.Errorf("AuditorDelete(%q): got %q %q %q %v, want %q", subject, name, st, named, ok, want)
		}
	}
	m := AuditorMappings("default")
	if got := m["cotal.default.auditor.*.CONSUMER.MSG.NEXT."+audit+".*"]; got != "$JS.API.CONSUMER.MSG.NEXT."+audit+".{{wildcard(1)}}" {
		t.Errorf("the pull's mapping: got %q, want the auditor's own consumer", got)
	}
	if got, ok := m["cotal.default.auditor.*.CONSUMER.DELETE."+audit+".*"]; ok {
		t.Errorf("the delete's mapping: got %q, want none (the plane takes it)", got)
	}
	if len(m) != 8 {
		t.Errorf("%d mappings, want 4 for each of the two streams", len(m))
	}
}
