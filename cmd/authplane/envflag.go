package main

// parseEnv and its helpers parse a command's flags and their environment twins: every flag `--name`
// also reads PREFIX_NAME (upper case, dashes to underscores), and a flag given on the command
// line wins. A bad value does not stop the parse: every one is reported at once, and a secret
// flag's value is never repeated.

import (
	"errors"
	"flag"
	"fmt"
	"strings"
)

// envName is the environment variable of flag name: prefix, `_`, and the name in upper case
// with dashes turned to underscores (`nats-url` → `AUTHPLANE_NATS_URL`).
func envName(prefix, name string) string {
	return prefix + "_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// envOptions say where a command's flags come from besides its arguments.
type envOptions struct {
	// Prefix names the environment variables (see envName).
	Prefix string
	// Lookup reads an environment variable: os.LookupEnv.
	Lookup func(string) (string, bool)
	// Secret reports whether a flag's value must never be repeated (in an error); nil: none.
	Secret func(name string) bool
}

// parseEnv parses args into fs, then sets every flag the command line did not set from its
// environment variable. usage is a usage error as the flag package reports it (an unknown
// flag, a flag without its value, `-h`), returned alone and already printed with the flags'
// usage; bad is every value that does not parse, from the command line or the environment,
// each naming its flag or variable.
func parseEnv(fs *flag.FlagSet, args []string, o envOptions) (bad []error, usage error) {
	secret := func(name string) bool { return o.Secret != nil && o.Secret(name) }
	// While the flag package parses, each value records its failure and reports success, so the
	// parse goes on to the next flag. Help and usage errors print the flags as they are.
	original := map[string]flag.Value{}
	fs.VisitAll(func(f *flag.Flag) {
		original[f.Name] = f.Value
		f.Value = lenient{Value: f.Value, what: "--" + f.Name, secret: secret(f.Name), bad: &bad}
	})
	restore := func() { fs.VisitAll(func(f *flag.Flag) { f.Value = original[f.Name] }) }
	printUsage := fs.Usage
	fs.Usage = func() {
		restore()
		if printUsage != nil {
			printUsage()
			return
		}
		fmt.Fprintf(fs.Output(), "Usage of %s:\n", fs.Name())
		fs.PrintDefaults()
	}
	usage = fs.Parse(args)
	restore()
	fs.Usage = printUsage
	if usage != nil {
		return nil, usage
	}

	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	fs.VisitAll(func(f *flag.Flag) {
		env := envName(o.Prefix, f.Name)
		v, ok := o.Lookup(env)
		if given[f.Name] || !ok {
			return
		}
		setValue(f.Value, env, v, secret(f.Name), &bad)
	})
	return bad, nil
}

// lenient is a flag's value during the parse: a value that does not parse is recorded, not
// returned, so every bad value is found in one parse.
type lenient struct {
	flag.Value
	what   string
	secret bool
	bad    *[]error
}

func (l lenient) Set(s string) error {
	setValue(l.Value, l.what, s, l.secret, l.bad)
	return nil
}

// set sets v to s. A value that does not parse is recorded in bad and v keeps what it held (the
// flag package's numbers zero themselves on a failed parse, which would be reported again).
func setValue(v flag.Value, what, s string, secret bool, bad *[]error) {
	prev := v.String()
	if err := v.Set(s); err != nil {
		*bad = append(*bad, badValue(what, s, secret, err))
		if err := v.Set(prev); err != nil {
			*bad = append(*bad, fmt.Errorf("%s: its previous value does not parse again: %w", what, errBadValue))
		}
	}
}

// IsBoolFlag keeps a boolean flag a flag without a value.
func (l lenient) IsBoolFlag() bool {
	b, ok := l.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

func (l lenient) String() string {
	if l.Value == nil {
		return ""
	}
	return l.Value.String()
}

// errBadValue marks a value that does not parse, in every report of one.
var errBadValue = errors.New("invalid value")

// badValue reports value v of what (a flag or a variable): quoted, unless it is a secret, whose
// value and parse error (which may quote it) are never repeated.
func badValue(what, v string, secret bool, err error) error {
	if secret {
		return fmt.Errorf("%s: %w (not shown: it is a secret)", what, errBadValue)
	}
	return fmt.Errorf("%s %q: %w: %w", what, v, errBadValue, err)
}
