package main

import (
	"bytes"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/internal/bench"
)

// A command called wrong prints one line: what was wrong, and how to get help; then exits 2.
// The usage is for -h: printed after an error, it scrolls the error away.
func TestACommandCalledWrongSaysWhatOnOneLineAndWhereHelpIs(t *testing.T) {
	type call struct {
		args       []string
		what, help string
	}
	calls := []call{
		{[]string{"frobnicate"}, `unknown command "frobnicate"`, "authplane --help"},
		{[]string{"--frob"}, "-frob", "authplane serve -h"},
		{[]string{"keys", "frob"}, `unknown action "frob"`, "authplane keys -h"},
		{[]string{"keys"}, "want an action", "authplane keys -h"},
		{[]string{"keys", "retire"}, "KID", "authplane keys -h"},
		{[]string{"identity", "frob"}, `unknown action "frob"`, "authplane identity -h"},
		{[]string{"identity"}, "want an action", "authplane identity -h"},
		{[]string{"creds", "--ttl"}, "-ttl", "authplane creds -h"},
	}
	for _, c := range commands {
		args := []string{c.name, "--no-such-flag"}
		if c.name == "identity" {
			args = []string{c.name, "migrate", "--no-such-flag"}
		}
		calls = append(calls, call{args, "-no-such-flag", "authplane " + c.name + " -h"},
			call{append(args[:len(args)-1:len(args)-1], "stray"), `unexpected argument "stray"`, "authplane " + c.name + " -h"})
	}
	for _, c := range calls {
		if c.args[0] == "keys" && c.args[len(c.args)-1] == "stray" {
			c.args, c.what = []string{"keys", "list", "stray"}, `unexpected argument "stray"`
		}
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(c.args, &stdout, &stderr)
			got := stderr.String()
			if code != 2 || strings.Count(got, "\n") != 1 || !strings.HasSuffix(got, "\n") || !strings.Contains(got, c.what) || !strings.Contains(got, "run '"+c.help+"'") || stdout.Len() > 0 {
				t.Errorf("authplane %s: got exit %d, stdout %q, stderr %q; want 2 and one line saying %q and %q", strings.Join(c.args, " "), code, stdout.String(), got, c.what, c.help)
			}
		})
	}
}

// A numeric flag's range in its help: "(A to B…)", "(at least A…)" or "(A, B or C…)", each
// bound a literal of the flag's type (with KiB, MiB or GiB for bytes) or another --flag.
var (
	rangeTo      = regexp.MustCompile(`\((?:each )?(\S+(?: [KMG]iB)?) to ([^\s,;)]+(?: [KMG]iB)?)[\s,;)]`)
	rangeAtLeast = regexp.MustCompile(`\(at least (\S+?(?: [KMG]iB)?)[,;)]`)
	rangeOneOf   = regexp.MustCompile(`\(((?:-?\d+, )*-?\d+) or (-?\d+)[,;)]`)
	flagLine     = regexp.MustCompile(`^  -(\S+)(?: (\S+))?$`)
	defaultOf    = regexp.MustCompile(`\(default ([^)]+)\)$`)
)

// unsafeArgs are what each command is given besides the flag under test, so that it fails
// even if it took an out-of-range value: it never starts a plane or waits long.
var unsafeArgs = map[string][]string{
	"serve": {"--space", "Bad Space"},
	"wait":  {"--url", "http://127.0.0.1:1"},
	"bench": {"--phases", "none"},
}

// numericFlags reads `authplane <command> -h`: each flag of a numeric type (int, int64, uint,
// float, duration) with its type and usage.
func numericFlags(t *testing.T, command string) map[string][2]string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	args := []string{command, "-h"}
	if command == "identity" {
		args = []string{command, "migrate", "-h"}
	}
	if code := run(args, &stdout, &stderr); code != 0 {
		t.Fatalf("authplane %s -h: exit %d\n%s", command, code, stderr.String())
	}
	flags := map[string][2]string{}
	name, typ := "", ""
	for _, line := range strings.Split(stderr.String(), "\n") {
		if m := flagLine.FindStringSubmatch(line); m != nil {
			name, typ = m[1], m[2]
			continue
		}
		if usage, ok := strings.CutPrefix(line, "    \t"); ok && name != "" && slices.Contains([]string{"int", "int64", "uint", "uint64", "float", "duration"}, typ) {
			flags[name] = [2]string{typ, strings.TrimSpace(flags[name][1] + " " + usage)}
		}
	}
	return flags
}

// parseBound reads a literal bound of a flag of type typ as a float64 (a duration in
// nanoseconds); ok is false for a bound that names another flag.
func parseBound(t *testing.T, typ, s string) (v float64, ok bool) {
	t.Helper()
	if strings.HasPrefix(s, "--") {
		return 0, false
	}
	if typ == "duration" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("bound %q: %v", s, err)
		}
		return float64(d), true
	}
	unit := 1.0
	for suffix, u := range map[string]float64{" KiB": 1 << 10, " MiB": 1 << 20, " GiB": 1 << 30} {
		if n, found := strings.CutSuffix(s, suffix); found {
			s, unit = n, u
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatalf("bound %q: %v", s, err)
	}
	return f * unit, true
}

// format writes v as a value of a flag of type typ.
func format(typ string, v float64) string {
	switch typ {
	case "duration":
		return time.Duration(v).String()
	case "float":
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
	return strconv.FormatInt(int64(v), 10)
}

// Every numeric flag of every command states its range in its help, its default is in it, and
// the command refuses a value just outside it, naming the flag, before it does anything.
func TestEveryNumericFlagStatesItsRangeAndIsHeldToIt(t *testing.T) {
	for _, c := range commands {
		for name, f := range numericFlags(t, c.name) {
			typ, usage := f[0], f[1]
			t.Run(c.name+" --"+name, func(t *testing.T) {
				var outside []float64
				var lo, hi float64
				hasLo, hasHi := false, false
				switch {
				case rangeTo.MatchString(usage):
					m := rangeTo.FindStringSubmatch(usage)
					lo, hasLo = parseBound(t, typ, m[1])
					hi, hasHi = parseBound(t, typ, m[2])
				case rangeAtLeast.MatchString(usage):
					lo, hasLo = parseBound(t, typ, rangeAtLeast.FindStringSubmatch(usage)[1])
				case rangeOneOf.MatchString(usage):
					m := rangeOneOf.FindStringSubmatch(usage)
					var listed []float64
					for _, s := range append(strings.Split(m[1], ", "), m[2]) {
						v, _ := parseBound(t, typ, s)
						listed = append(listed, v)
					}
					lo, hi, hasLo, hasHi = slices.Min(listed), slices.Max(listed), true, true
					for v := lo + 1; v < hi; v++ {
						if !slices.Contains(listed, v) {
							outside = append(outside, v)
						}
					}
				default:
					t.Fatalf("usage %q: want its range, (A to B), (at least A) or (A, B or C)", usage)
				}
				step := 1.0
				if typ == "duration" {
					step = float64(time.Millisecond)
				}
				if hasLo {
					outside = append(outside, lo-step)
				}
				if hasHi {
					outside = append(outside, hi+step)
				}
				if !hasLo && !hasHi {
					t.Fatalf("usage %q: want a literal bound at least", usage)
				}
				if m := defaultOf.FindStringSubmatch(usage); m != nil {
					if d, ok := parseBound(t, typ, m[1]); ok && (hasLo && d < lo || hasHi && d > hi) {
						t.Errorf("default %s is outside the range of %q", m[1], usage)
					}
				}
				for _, v := range outside {
					args := append([]string{c.name}, unsafeArgs[c.name]...)
					if c.name == "identity" {
						args = append(args, "migrate")
					}
					args = append(args, "--"+name+"="+format(typ, v), "--dir", t.TempDir())
					done := make(chan string, 1)
					go func() {
						var stdout, stderr bytes.Buffer
						code := run(args, &stdout, &stderr)
						done <- fmt.Sprintf("exit %d: %s", code, stderr.String())
					}()
					select {
					case got := <-done:
						if strings.HasPrefix(got, "exit 0") || !strings.Contains(got, "--"+name+" ") {
							t.Errorf("authplane %s: got %s; want it refused, naming --%s", strings.Join(args, " "), got, name)
						}
					case <-time.After(20 * time.Second):
						t.Errorf("authplane %s: still running after 20 s; want it refused at once", strings.Join(args, " "))
					}
				}
			})
		}
	}
}

// A rate that is negative or not a number is refused, as is a burst below 1: only --rate 0
// means no limit: a negative one taken as none would lift the limit silently.
func TestServeRefusesARateOrBurstOffItsRange(t *testing.T) {
	for _, c := range [][2]string{{"rate", "-1"}, {"rate", "-0.5"}, {"rate", "NaN"}, {"rate", "+Inf"}, {"rate", "-Inf"}, {"burst", "-1"}, {"burst", "0"}} {
		var stdout, stderr bytes.Buffer
		code := run([]string{"serve", "--" + c[0], c[1], "--space", "Bad Space"}, &stdout, &stderr)
		if code == 0 || !strings.Contains(stderr.String(), "--"+c[0]+" ") {
			t.Errorf("serve --%s %s: got exit %d, %q; want it refused, naming --%s", c[0], c[1], code, stderr.String(), c[0])
		}
	}
}

// A bench whose every request of an operation was refused measured nothing: it says so and
// fails, after printing its report.
func TestABenchThatMeasuredNothingFails(t *testing.T) {
	r := &bench.Report{Operations: []bench.Phase{{Op: "renew", Requests: 10}, {Op: "prepare", Refused: map[string]int{"unavailable": 3}}}}
	if err := unmeasured(r); err == nil || !strings.Contains(err.Error(), "prepare: no request was answered") || strings.Contains(err.Error(), "renew") {
		t.Errorf("got %v, want prepare named as measuring nothing, and renew not", err)
	}
	r.Operations = r.Operations[:1]
	if err := unmeasured(r); err != nil {
		t.Errorf("a bench that measured: got %v, want nil", err)
	}
}
