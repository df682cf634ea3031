package subjects

import (
	"strings"
	"testing"
)

func TestRunStartSubjectsParseOnlyOnTheirGrammar(t *testing.T) {
	uid := strings.Repeat("u", 26)
	nonce := strings.Repeat("n", 16)
	one := RunStart{Space: "default", Route: RouteOne, Owner: testOwner, Actor: "cli", UID: uid, Generation: "1", Nonce: nonce}
	inst := one
	inst.Route, inst.Instance = RouteInst, testIID
	for _, r := range []RunStart{one, inst, {Space: "default", Route: RouteAll, Owner: testOwner, Actor: "cli", UID: uid, Generation: "42", Nonce: nonce}} {
		got, ok := ParseRunStart("default", r.Subject())
		if !ok || got != r {
			t.Errorf("%s: got %+v %v, want it back", r.Subject(), got, ok)
		}
	}
	for name, subject := range map[string]string{
		"another space":       strings.Replace(one.Subject(), "cotal.default.", "cotal.other.", 1),
		"generation 0":        strings.Replace(one.Subject(), ".1."+nonce, ".0."+nonce, 1),
		"leading zero":        strings.Replace(one.Subject(), ".1."+nonce, ".01."+nonce, 1),
		"short nonce":         strings.Replace(one.Subject(), nonce, "n", 1),
		"an inst with no iid": strings.Replace(one.Subject(), ".one.", ".inst.", 1),
		"a one with an iid":   strings.Replace(inst.Subject(), ".inst.", ".one.", 1),
		"a bad owner":         strings.Replace(one.Subject(), testOwner, "x_y", 1),
		"an extra token":      one.Subject() + ".x",
		"a missing token":     strings.TrimSuffix(one.Subject(), "."+nonce),
		"another command":     strings.Replace(one.Subject(), "run-start", "run-stop", 1),
		"another endpoint":    strings.Replace(one.Subject(), ".manager.", ".agent.", 1),
		"a legacy rail":       strings.Replace(one.Subject(), ".ep.v1.", ".ep.v0.", 1),
		"an upper-case uid":   strings.Replace(one.Subject(), uid, strings.ToUpper(uid), 1),
		"a wildcard":          strings.Replace(one.Subject(), nonce, "*", 1),
	} {
		if got, ok := ParseRunStart("default", subject); ok {
			t.Errorf("%s: %s parsed as %+v, want refused", name, subject, got)
		}
	}
	if WitnessMarkerKey(one.Subject()) == WitnessMarkerKey(inst.Subject()) || !strings.HasPrefix(WitnessMarkerKey(one.Subject()), "witness.v1.") {
		t.Error("witness markers of two subjects collide or have the wrong shape")
	}
}

// Every run-start of an owner lands in that owner's witness and no other's, and every
// owner's witness lies inside what the data account exports: one owner's run-starts can fill
// only its own stream.
func TestEachRunStartIsCapturedByItsOwnersWitnessOnly(t *testing.T) {
	const other = "u_bbbbbbbbbbbbbbbbbbbbbbbbbb"
	uid, nonce := strings.Repeat("u", 26), strings.Repeat("n", 16)
	for _, r := range []RunStart{
		{Space: "default", Route: RouteOne, Owner: testOwner, Actor: "cli", UID: uid, Generation: "1", Nonce: nonce},
		{Space: "default", Route: RouteAll, Owner: testOwner, Actor: "cli", UID: uid, Generation: "1", Nonce: nonce},
		{Space: "default", Route: RouteInst, Instance: testIID, Owner: testOwner, Actor: "cli", UID: uid, Generation: "1", Nonce: nonce},
	} {
		count := func(patterns []string) int {
			n := 0
			for _, p := range patterns {
				if subjectMatches(p, r.Subject()) {
					n++
				}
			}
			return n
		}
		if got := count(OwnerRunStarts("default", testOwner)); got != 1 {
			t.Errorf("%s: matched by %d of its owner's witness subjects, want 1", r.Subject(), got)
		}
		if got := count(OwnerRunStarts("default", other)); got != 0 {
			t.Errorf("%s: matched by %d of another owner's witness subjects, want 0", r.Subject(), got)
		}
		if got := count(RunStartExports("default")); got != 1 {
			t.Errorf("%s: matched by %d exports, want 1", r.Subject(), got)
		}
	}
	if a, b := WitnessStream("default", testOwner), WitnessStream("default", other); a == b || !strings.HasPrefix(a, WitnessStreamPrefix("default")) ||
		strings.TrimPrefix(a, WitnessStreamPrefix("default")) != testOwner {
		t.Errorf("witness streams: got %s and %s, want one per owner under %s", a, b, WitnessStreamPrefix("default"))
	}
}
