package main

import (
	"bytes"
	"errors"
	"flag"
	"strings"
	"testing"
	"time"
)

// flagCommand is a flag set like a subcommand's, with a secret.
type flagCommand struct {
	fs      *flag.FlagSet
	out     bytes.Buffer
	workers int
	timeout time.Duration
	url     string
	token   string
	verbose bool
}

func newFlagCommand() *flagCommand {
	c := &flagCommand{fs: flag.NewFlagSet("serve", flag.ContinueOnError)}
	c.fs.SetOutput(&c.out)
	c.fs.IntVar(&c.workers, "workers", 4, "workers")
	c.fs.DurationVar(&c.timeout, "request-timeout", 5*time.Second, "timeout")
	c.fs.StringVar(&c.url, "nats-url", "", "url")
	c.fs.StringVar(&c.token, "bearer-token", "", "a secret")
	c.fs.BoolVar(&c.verbose, "verbose", false, "say more")
	return c
}

func (c *flagCommand) parse(args []string, env map[string]string) ([]error, error) {
	return parseEnv(c.fs, args, envOptions{
		Prefix: "AUTHPLANE",
		Lookup: func(k string) (string, bool) { v, ok := env[k]; return v, ok },
		Secret: func(name string) bool { return name == "bearer-token" },
	})
}

func TestEveryFlagReadsItsEnvironmentTwinAndTheCommandLineWins(t *testing.T) {
	c := newFlagCommand()
	bad, err := c.parse([]string{"--workers", "8", "--verbose"}, map[string]string{
		"AUTHPLANE_WORKERS":         "2", // the command line wins
		"AUTHPLANE_REQUEST_TIMEOUT": "250ms",
		"AUTHPLANE_NATS_URL":        "nats://a:4222",
		"AUTHPLANE_BEARER_TOKEN":    "s3cret",
		"AUTHPLANE_UNKNOWN":         "ignored",
	})
	if err != nil || len(bad) != 0 {
		t.Fatalf("got %v %v, want a clean parse", bad, err)
	}
	if c.workers != 8 || c.timeout != 250*time.Millisecond || c.url != "nats://a:4222" || c.token != "s3cret" || !c.verbose {
		t.Errorf("got workers %d, timeout %s, url %q, token %q, verbose %v; want 8, 250ms, nats://a:4222, s3cret, true",
			c.workers, c.timeout, c.url, c.token, c.verbose)
	}
	env := map[string]string{"AUTHPLANE_VERBOSE": "true"}
	c = newFlagCommand()
	if _, err := c.parse(nil, env); err != nil || !c.verbose {
		t.Errorf("a boolean from the environment: got %v %v, want true", c.verbose, err)
	}
}

func TestEveryBadValueIsReportedAtOnceAndNoSecretIsRepeated(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want []string // each must be reported
	}{
		{"two bad flags", []string{"--workers", "many", "--request-timeout", "soon"}, nil,
			[]string{`--workers "many"`, `--request-timeout "soon"`}},
		{"bad flags and bad variables", []string{"--workers=x"}, map[string]string{"AUTHPLANE_REQUEST_TIMEOUT": "later", "AUTHPLANE_VERBOSE": "maybe"},
			[]string{`--workers "x"`, `AUTHPLANE_REQUEST_TIMEOUT "later"`, `AUTHPLANE_VERBOSE "maybe"`}},
		{"a bad variable behind a good flag is not read", []string{"--workers", "3"}, map[string]string{"AUTHPLANE_WORKERS": "x", "AUTHPLANE_REQUEST_TIMEOUT": "x"},
			[]string{`AUTHPLANE_REQUEST_TIMEOUT "x"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newFlagCommand()
			bad, err := c.parse(tt.args, tt.env)
			if err != nil {
				t.Fatalf("got usage error %v, want the bad values reported", err)
			}
			if len(bad) != len(tt.want) {
				t.Fatalf("got %d problems %v, want %d", len(bad), bad, len(tt.want))
			}
			if c.workers != 4 && c.workers != 3 || c.timeout != 5*time.Second {
				t.Errorf("got workers %d, timeout %s: a value that does not parse must leave the flag as it was", c.workers, c.timeout)
			}
			all := errors.Join(bad...)
			for _, w := range tt.want {
				if !strings.Contains(all.Error(), w) || !errors.Is(all, errBadValue) {
					t.Errorf("got %q, want it to report %s", all, w)
				}
			}
		})
	}

	// A secret's value is never repeated, whatever fails around it.
	secretValue := &failingValue{}
	c := newFlagCommand()
	c.fs.Var(secretValue, "bearer-secret", "a secret that does not parse")
	bad, err := parseEnv(c.fs, []string{"--bearer-secret", "hunter2", "--workers", "x"}, envOptions{
		Prefix: "AUTHPLANE", Lookup: func(string) (string, bool) { return "", false },
		Secret: func(name string) bool { return name == "bearer-secret" },
	})
	if err != nil || len(bad) != 2 {
		t.Fatalf("got %v %v, want two bad values", bad, err)
	}
	if all := errors.Join(bad...).Error(); strings.Contains(all, "hunter2") || !strings.Contains(all, "--bearer-secret") {
		t.Errorf("got %q, want --bearer-secret named and its value not repeated", all)
	}
}

// failingValue refuses every value but its empty default, quoting it as many parsers do.
type failingValue struct{}

func (*failingValue) String() string { return "" }
func (*failingValue) Set(s string) error {
	if s == "" {
		return nil
	}
	return errors.New("cannot parse " + s)
}

func TestHelpAndUsageErrorsPrintTheFlagsAsDeclaredAndNoEnvironmentValue(t *testing.T) {
	c := newFlagCommand()
	_, err := c.parse([]string{"-h"}, map[string]string{"AUTHPLANE_BEARER_TOKEN": "hunter2", "AUTHPLANE_NATS_URL": "nats://u:hunter2@h"})
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: got %v, want flag.ErrHelp", err)
	}
	help := c.out.String()
	for _, want := range []string{"-workers int", "-request-timeout duration", "-verbose\n", "(default 4)"} {
		if !strings.Contains(help, want) {
			t.Errorf("help %q: want it to show %q", help, want)
		}
	}
	if strings.Contains(help, "hunter2") {
		t.Errorf("help %q repeats a value from the environment", help)
	}

	c = newFlagCommand()
	if _, err := c.parse([]string{"--no-such-flag"}, nil); err == nil || !strings.Contains(c.out.String(), "-workers int") {
		t.Errorf("an unknown flag: got %v and output %q, want a usage error with the flags", err, c.out.String())
	}
	if c.fs.Lookup("workers").Value.String() != "4" {
		t.Errorf("after parsing, the flags keep their own values")
	}
}
