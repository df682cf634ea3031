package subjects

import (
	"strings"
	"testing"

	"github.com/nats-io/nkeys"
)

// FuzzParseRunStart checks ParseRunStart on any space and subject: a subject it refuses gives
// the zero RunStart; one it parses has every token on its grammar, and its Subject is the
// subject parsed, byte for byte.
func FuzzParseRunStart(f *testing.F) {
	uid := strings.Repeat("u", 26)
	nonce := strings.Repeat("n", 16)
	one := RunStart{Space: "default", Route: RouteOne, Owner: testOwner, Actor: "cli", UID: uid, Generation: "1", Nonce: nonce}
	inst := one
	inst.Route, inst.Instance = RouteInst, testIID
	all := RunStart{Space: "default", Route: RouteAll, Owner: testOwner, Actor: "cli", UID: uid, Generation: "42", Nonce: nonce}
	// TestRunStartSubjectsParseOnlyOnTheirGrammar's subjects.
	for _, s := range []string{
		one.Subject(), inst.Subject(), all.Subject(),
		strings.Replace(one.Subject(), "cotal.default.", "cotal.other.", 1),
		strings.Replace(one.Subject(), ".1."+nonce, ".0."+nonce, 1),
		strings.Replace(one.Subject(), ".1."+nonce, ".01."+nonce, 1),
		strings.Replace(one.Subject(), nonce, "n", 1),
		strings.Replace(one.Subject(), ".one.", ".inst.", 1),
		strings.Replace(inst.Subject(), ".inst.", ".one.", 1),
		strings.Replace(one.Subject(), testOwner, "x_y", 1),
		one.Subject() + ".x",
		strings.TrimSuffix(one.Subject(), "."+nonce),
		strings.Replace(one.Subject(), "run-start", "run-stop", 1),
		strings.Replace(one.Subject(), ".manager.", ".agent.", 1),
		strings.Replace(one.Subject(), ".ep.v1.", ".ep.v0.", 1),
		strings.Replace(one.Subject(), uid, strings.ToUpper(uid), 1),
		strings.Replace(one.Subject(), nonce, "*", 1),
	} {
		f.Add("default", s)
	}
	f.Add("", "cotal..ep.v1.one.manager.run-start."+testOwner+".cli."+uid+".1."+nonce)
	f.Add("a.b", "cotal.a.b.ep.v1.one.manager.run-start."+testOwner+".cli."+uid+".1."+nonce)
	f.Fuzz(func(t *testing.T, space, subject string) {
		r, ok := ParseRunStart(space, subject)
		if !ok {
			if r != (RunStart{}) {
				t.Fatalf("a refused subject came back as %+v", r)
			}
			return
		}
		if r.Space != space || r.Subject() != subject {
			t.Fatalf("%q parsed as %+v, which is %q", subject, r, r.Subject())
		}
		switch {
		case r.Route != RouteOne && r.Route != RouteAll && r.Route != RouteInst,
			(r.Route == RouteInst) != (r.Instance != ""),
			r.Instance != "" && !ValidUID(r.Instance),
			!ValidOwner(r.Owner), !ValidActor(r.Actor), !ValidUID(r.UID),
			!generationRe.MatchString(r.Generation), !nonceRe.MatchString(r.Nonce):
			t.Fatalf("%q parsed with a token off its grammar: %+v", subject, r)
		}
		if again, ok := ParseRunStart(space, r.Subject()); !ok || again != r {
			t.Fatalf("%q: parsed again as %+v, %v", subject, again, ok)
		}
		if !strings.HasPrefix(WitnessMarkerKey(subject), "witness.v1.") {
			t.Fatalf("the witness marker of %q is %q", subject, WitnessMarkerKey(subject))
		}
	})
}

// FuzzParseEndpointSubject checks ParseEndpointSubject on any space and subject: one it
// parses names an endpoint and a valid principal, and EndpointSubject builds it back.
func FuzzParseEndpointSubject(f *testing.F) {
	// TestParseEndpointSubject's subjects.
	for _, s := range []string{
		"cotal.default.auth.manager-authority." + testOwner + ".cli",
		"cotal.default.auth.supervisor-end.p_aaaaaaaaaaaaaaaaaaaaaaaaaa.Admin_1",
		"cotal.default.auth.run-revoke." + testOwner + "." + strings.Repeat("a", 64),
		"cotal.other.auth.manager-authority." + testOwner + ".cli",
		"cotal.default2.auth.manager-authority." + testOwner + ".cli",
		"cotal.default.authx.manager-authority." + testOwner + ".cli",
		"cotal.default.auth.manager-authority." + testOwner,
		"cotal.default.auth.manager-authority." + testOwner + ".cli.x",
		"cotal.default.auth.manager-authority.u_AAAAAAAAAAAAAAAAAAAAAAAAAA.cli",
		"cotal.default.auth.manager-authority.u_aaaa.cli",
		"cotal.default.auth.manager-authority.x_aaaaaaaaaaaaaaaaaaaaaaaaaa.cli",
		"cotal.default.auth.manager-authority.u_aaaaaaaaaaaaaaaaaaaaaaaaa1.cli",
		"cotal.default.auth.manager-authority.*.cli",
		"cotal.default.auth.manager-authority." + testOwner + ".*",
		"cotal.default.auth.manager-authority." + testOwner + ".>",
		"cotal.default.auth.manager-authority." + testOwner + ".a-b",
		"cotal.default.auth.manager-authority." + testOwner + "." + strings.Repeat("a", 65),
		"",
	} {
		f.Add("default", s)
	}
	f.Fuzz(func(t *testing.T, space, subject string) {
		e, o, a, ok := ParseEndpointSubject(space, subject)
		if !ok {
			if e != "" || o != "" || a != "" {
				t.Fatalf("a refused subject came back as %q %q %q", e, o, a)
			}
			return
		}
		if e == "" || strings.Contains(e, ".") || !ValidOwner(o) || !ValidActor(a) {
			t.Fatalf("%q parsed as endpoint %q, principal %q.%q", subject, e, o, a)
		}
		if got := EndpointSubject(space, e, o, a); got != subject {
			t.Fatalf("%q parsed as %q %q %q, which builds %q", subject, e, o, a, got)
		}
		if po, pa, ok := SplitPrincipal(Principal(o, a)); !ok || po != o || pa != a {
			t.Fatalf("the principal of %q does not split back: %q %q %v", subject, po, pa, ok)
		}
	})
}

// FuzzSplitPrincipal checks SplitPrincipal on any string: one it splits is two valid tokens
// that join back into it.
func FuzzSplitPrincipal(f *testing.F) {
	// TestKeysAndBucketsNameTheirSpace's principals.
	for _, p := range []string{Principal(testOwner, "cli"), testOwner, testOwner + ".", ".cli", testOwner + ".a.b", "x.cli",
		"p_aaaaaaaaaaaaaaaaaaaaaaaaaa.Admin_1", testOwner + "." + strings.Repeat("a", 65)} {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, p string) {
		o, a, ok := SplitPrincipal(p)
		if !ok {
			if o != "" || a != "" {
				t.Fatalf("a refused principal came back as %q %q", o, a)
			}
			return
		}
		if !ValidOwner(o) || !ValidActor(a) || Principal(o, a) != p {
			t.Fatalf("%q split as %q %q", p, o, a)
		}
		if !ReplyAllowed(InboxPrefix(o, a)+".x", o, a) {
			t.Fatalf("%q may not receive on its own inbox", p)
		}
	})
}

// FuzzReplyAllowed checks ReplyAllowed on any reply subject, for the callers of the table:
// a reply it allows lies under the caller's own inbox, in tokens none of which is empty, a
// wildcard or holds a space.
func FuzzReplyAllowed(f *testing.F) {
	in := InboxPrefix(testOwner, "cli")
	// TestReplyAllowedOnlyUnderTheCallersOwnInbox's replies.
	for _, r := range []string{
		in + ".abc", in + ".abc.1", in + ".Fz3kG1aNq2.12", in, in + ".", in + "..x", in + ".x..y", in + ".x.",
		"_INBOX." + testOwner + ".cliX.y", "_INBOX." + testOwner + ".cliX", "_INBOX." + testOwner + ".cl.i",
		"_INBOX." + testOwner + "x.cli.y", InboxPrefix(otherUser, "cli") + ".x", InboxPrefix(testOwner, "ops") + ".x",
		"_INBOX.abc", "_inbox." + testOwner + ".cli.x", in + ".*", in + ".>", in + ".x.>", in + ".a b", in + ".a\tb",
		in + ".a\r\nPUB x 1", "$KV.cotal_auth_default.epgate.auth.x", "$JS.API.STREAM.DELETE.KV_cotal_auth_default",
		"$SYS.REQ.SERVER.PING", EndpointSubject("default", EndpointSupervisorEnd, testOwner, "cli"), "",
	} {
		f.Add(r, false)
	}
	f.Add(InboxPrefix(otherUser, "ops")+".x", true)
	f.Fuzz(func(t *testing.T, reply string, other bool) {
		owner, actor := testOwner, "cli"
		if other {
			owner, actor = otherUser, "ops"
		}
		if !ReplyAllowed(reply, owner, actor) {
			return
		}
		rest, ok := strings.CutPrefix(reply, InboxPrefix(owner, actor)+".")
		if !ok {
			t.Fatalf("%q is allowed, outside the inbox of %s.%s", reply, owner, actor)
		}
		for _, tok := range strings.Split(rest, ".") {
			if tok == "" || tok == "*" || tok == ">" || strings.ContainsAny(tok, "*> \t\r\n") {
				t.Fatalf("%q is allowed with token %q", reply, tok)
			}
		}
	})
}

// FuzzGrammar checks every Valid* function on any string against a spelled-out reading of its
// grammar (docs/PROTOCOL.md, "Subjects and callers"), and the nkey checks against the nkeys library's own, on 56 characters.
func FuzzGrammar(f *testing.F) {
	user, err := nkeys.FromRawSeed(nkeys.PrefixByteUser, make([]byte, 32))
	if err != nil {
		f.Fatal(err)
	}
	pub, err := user.PublicKey()
	if err != nil {
		f.Fatal(err)
	}
	account, err := nkeys.FromRawSeed(nkeys.PrefixByteAccount, make([]byte, 32))
	if err != nil {
		f.Fatal(err)
	}
	acct, err := account.PublicKey()
	if err != nil {
		f.Fatal(err)
	}
	// TestOnlyTheCanonicalSpellingOfAnNKeyIsValid's keys, and a value of every grammar.
	for _, s := range []string{pub, acct, pub + "A", pub + "AAA", pub + "=", pub[:55], pub[:55] + "!", "X" + pub[1:], "",
		"default", "a-b_c", testOwner, "p_aaaaaaaaaaaaaaaaaaaaaaaaaa", "cli", strings.Repeat("a", 64), testIID,
		strings.Repeat("r", 22), testRunID, "0123456789abcdef", "sha256:" + strings.Repeat("0", 64), "run-", "é"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, g := range []struct {
			name  string
			valid func(string) bool
			want  bool
		}{
			{"space", ValidSpace, len(s) >= 1 && len(s) <= 32 && in(s[:1], lower+digits) && in(s, lower+digits+"_-")},
			{"owner", ValidOwner, len(s) == 28 && (s[:2] == "u_" || s[:2] == "p_") && in(s[2:], lower+"234567")},
			{"user owner", ValidUserOwner, len(s) == 28 && s[:2] == "u_" && in(s[2:], lower+"234567")},
			{"actor", ValidActor, len(s) >= 1 && len(s) <= 64 && in(s, lower+upper+digits+"_")},
			{"uid", ValidUID, len(s) >= 26 && len(s) <= 32 && in(s, lower+digits)},
			{"request id", ValidRequestID, len(s) >= 22 && len(s) <= 64 && in(s, lower+upper+digits+"_-")},
			{"run id", ValidRunID, len(s) == 36 && s[:4] == "run-" && in(s[4:], hexDigits)},
			{"takeover id", ValidTakeoverID, len(s) == 16 && in(s, hexDigits)},
			{"proof", ValidProof, len(s) == 71 && s[:7] == "sha256:" && in(s[7:], hexDigits)},
			{"user nkey", ValidUserNKey, len(s) == 56 && nkeys.IsValidPublicUserKey(s)},
			{"account nkey", ValidAccountNKey, len(s) == 56 && nkeys.IsValidPublicAccountKey(s)},
		} {
			if got := g.valid(s); got != g.want {
				t.Fatalf("%s %q: got valid %v, want %v", g.name, s, got, g.want)
			}
		}
	})
}

const (
	lower     = "abcdefghijklmnopqrstuvwxyz"
	upper     = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
	digits    = "0123456789"
	hexDigits = "0123456789abcdef"
)

// in reports whether every byte of s is one of chars.
func in(s, chars string) bool {
	for i := range len(s) {
		if !strings.ContainsRune(chars, rune(s[i])) {
			return false
		}
	}
	return true
}
