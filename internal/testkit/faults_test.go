package testkit

import (
	"strings"
	"testing"
)

func TestEchoFindsOnlyRunsLongerThanTheBound(t *testing.T) {
	value := strings.Repeat("abcdefgh", 10) // 80 bytes
	for _, c := range []struct {
		name, msg, input string
		n                int
		want             bool
	}{
		{"a whole echo", "field x: " + value + " is wrong", `{"x":"` + value + `"}`, 72, true},
		{"an echo of the bound", "field x: " + value[:72] + "…", `{"x":"` + value + `"}`, 72, false},
		{"an echo at the end of the input", "got " + value, "zz" + value, 72, true},
		{"an echo at the start of the input", value + " is wrong", value, 72, true},
		{"no echo", "field x: want a string", `{"x":"` + value + `"}`, 72, false},
		{"a message shorter than the bound", "no", value, 72, false},
		{"an input shorter than the bound", value, "abc", 72, false},
		{"a one-byte bound", "xyz", "ayzb", 1, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			run, got := Echo(c.msg, []byte(c.input), c.n)
			if got != c.want || (got && (len(run) != c.n+1 || !strings.Contains(c.msg, run) || !strings.Contains(c.input, run))) {
				t.Fatalf("Echo: got %q, %v; want %v", run, got, c.want)
			}
		})
	}
}
