// Command authplane is the Cotal authority plane: `authplane serve` (the default) runs it;
// `init`, `creds`, `grant` and `nkeys` set up a space and its principals; `wait` and `stop`
// follow a running plane; `bench` measures it.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// command is one subcommand: its name, what its usage line shows after the name, what it
// does, and what runs it.
type command struct {
	name, args, what string
	run              func(args []string, stdout, stderr io.Writer) error
}

// commands are the subcommands, in the order the usage lists them.
var commands = []command{
	{"serve", "[flags]", "run the plane (the default; embedded NATS unless --nats-url)", serve},
	{"wait", "[flags]", "wait until a plane answers /health ok", waitCmd},
	{"stop", "[flags]", "stop the plane of a state directory and wait until it has exited", stopCmd},
	{"init", "[flags]", "write space material and a nats-server.conf", initSpace},
	{"creds", "[flags]", "write a .creds file for a principal", creds},
	{"grant", "[flags]", "write a principal's ledger row (its scopes)", grant},
	{"nkeys", "[flags]", "generate a manager's five duty nkeys and a prepare body", nkeysCmd},
	{"owner", "[flags]", "print the u_ owner an IdP subject derives in this space", owner},
	{"agent", "[flags]", "give a managed agent a (reusable) exchange secret, or revoke it", agent},
	{"keys", "list|rotate|retire KID|signing|rotate-signing", "list, rotate or retire the bearer keys /jwks publishes; show or rotate the data account's signing keys", keys},
	{"identity", "migrate [flags]", "move a file identity into the store (then --identity-store kv)", identityCmd},
	{"version", "", "print the release, module version and VCS revision", versionCmd},
	{"bench", "[flags]", "measure a plane against its echo and mint ceilings", benchCmd},
}

// usage lists the commands.
func usage() string {
	var b strings.Builder
	b.WriteString("authplane: the authority plane of a Cotal mesh\n\nusage:\n")
	for _, c := range commands {
		line := "authplane " + c.name
		if c.name == "serve" {
			line = "authplane [serve]"
		}
		if c.args != "" {
			line += " " + c.args
		}
		if len(line) > 30 {
			fmt.Fprintf(&b, "  %s\n  %-30s %s\n", line, "", c.what)
			continue
		}
		fmt.Fprintf(&b, "  %-30s %s\n", line, c.what)
	}
	b.WriteString("\nRun 'authplane <command> -h' for a command's flags. Every flag --name also reads\nAUTHPLANE_NAME from the environment; a flag on the command line wins.\n")
	return b.String()
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// usageError is a command called wrong (an unknown command, action or flag, a stray
// argument): run prints it on one line with where to find the usage, and exits 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// badUsage is a usageError saying what was wrong.
func badUsage(format string, args ...any) error {
	return usageError{fmt.Sprintf(format, args...)}
}

// isHelp reports whether arg asks for help.
func isHelp(arg string) bool {
	return arg == "-h" || arg == "-help" || arg == "--help" || arg == "help"
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && isHelp(args[0]) {
		fmt.Fprint(stdout, usage())
		return 0
	}
	name := "serve"
	if len(args) > 0 && args[0] != "" && args[0][0] != '-' {
		name, args = args[0], args[1:]
	}
	var cmd *command
	for i := range commands {
		if commands[i].name == name {
			cmd = &commands[i]
		}
	}
	if cmd == nil {
		fmt.Fprintf(stderr, "authplane: unknown command %q; run 'authplane --help' for the commands\n", name)
		return 2
	}
	err := cmd.run(args, stdout, stderr)
	var bad usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &bad):
		fmt.Fprintf(stderr, "authplane %s: %s; run 'authplane %s -h' for its usage\n", name, bad.msg, name)
		return 2
	}
	fmt.Fprintf(stderr, "authplane %s: %v\n", name, err)
	return 1
}

// newFlags returns the flag set of command name, writing to stderr, whose usage line says how
// the command is called.
func newFlags(name, args string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: authplane %s\n", strings.TrimSpace(name+" "+args))
		hasFlags := false
		fs.VisitAll(func(*flag.Flag) { hasFlags = true })
		if hasFlags {
			fmt.Fprint(stderr, "\nflags:\n")
			fs.PrintDefaults()
		}
	}
	return fs
}

// isFlag reports whether arg is one of fs's flags (-name, --name, -name=value), or help.
func isFlag(fs *flag.FlagSet, arg string) bool {
	name, ok := strings.CutPrefix(arg, "-")
	if !ok {
		return false
	}
	name = strings.TrimPrefix(name, "-")
	name, _, _ = strings.Cut(name, "=")
	return name == "" || fs.Lookup(name) != nil || name == "h" || name == "help" // "", of "-" or "--"
}

// parse parses a subcommand's flags and their AUTHPLANE_<FLAG> environment twins: a usage
// error (an unknown flag, a stray argument) is a usageError, `-h` prints the usage and is
// flag.ErrHelp, and every value that does not parse is reported at once.
func parse(fs *flag.FlagSet, args []string) error {
	bad, err := parseValues(fs, args)
	if err != nil {
		return err
	}
	return errors.Join(bad...)
}

// parseValues is parse for a command that reports the values that do not parse together with
// the rest of its configuration's problems.
func parseValues(fs *flag.FlagSet, args []string) ([]error, error) {
	// The flag package prints its error and the whole usage; the usage is for -h alone.
	out, printUsage := fs.Output(), fs.Usage
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	bad, err := parseEnv(fs, args, envOptions{Prefix: envPrefix, Lookup: os.LookupEnv})
	fs.SetOutput(out)
	fs.Usage = printUsage
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.Usage()
		return nil, err
	case err != nil:
		return nil, badUsage("%v", err)
	case fs.NArg() > 0:
		return nil, badUsage("unexpected argument %q", fs.Arg(0))
	}
	return bad, nil
}

// envPrefix names the environment twin of every flag: `--nats-url` reads AUTHPLANE_NATS_URL.
const envPrefix = "AUTHPLANE"
