// Command authplane is the Cotal authority plane: `authplane serve` (the default) runs it;
// `init`, `creds`, `grant` and `nkeys` set up a space and its principals; `bench` measures it.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/cotal-ai/authplane/internal/envflag"
)

const usage = `authplane: the authority plane of a Cotal mesh

usage:
  authplane [serve] [flags]      run the plane (embedded NATS unless --nats-url)
  authplane init [flags]         write space material and a nats-server.conf
  authplane creds [flags]        write a .creds file for a principal
  authplane grant [flags]        write a principal's ledger row (its scopes)
  authplane nkeys [flags]        generate a manager's five duty nkeys and a prepare body
  authplane owner [flags]        print the u_ owner an IdP subject derives in this space
  authplane agent [flags]        give a managed agent a (reusable) exchange secret, or revoke it
  authplane keys list|rotate|retire KID
                                 list, rotate or retire the bearer keys /jwks publishes
  authplane identity migrate     move a file identity into the store (then --identity-store kv)
  authplane version              print the release, module version and VCS revision
  authplane bench [flags]        measure a plane against its echo and mint ceilings

Run 'authplane <command> -h' for a command's flags.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// errUsage marks an error already explained by a usage message.
var errUsage = errors.New("usage")

func run(args []string, stdout, stderr io.Writer) int {
	cmd := "serve"
	if len(args) > 0 && args[0] != "" && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	var err error
	switch cmd {
	case "serve":
		err = serve(args, stdout, stderr)
	case "init":
		err = initSpace(args, stdout, stderr)
	case "creds":
		err = creds(args, stdout, stderr)
	case "grant":
		err = grant(args, stdout, stderr)
	case "nkeys":
		err = nkeysCmd(args, stdout, stderr)
	case "owner":
		err = owner(args, stdout, stderr)
	case "agent":
		err = agent(args, stdout, stderr)
	case "keys":
		err = keys(args, stdout, stderr)
	case "identity":
		err = identityCmd(args, stdout, stderr)
	case "version":
		err = versionCmd(args, stdout, stderr)
	case "bench":
		err = benchCmd(args, stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "authplane: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	}
	fmt.Fprintf(stderr, "authplane %s: %v\n", cmd, err)
	return 1
}

// parse parses a subcommand's flags and their AUTHPLANE_<FLAG> environment twins: a usage
// error (an unknown flag, a stray argument) is errUsage, `-h` is flag.ErrHelp, and every value
// that does not parse is reported at once.
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
	bad, err := envflag.Parse(fs, args, envflag.Options{Prefix: envPrefix, Lookup: os.LookupEnv})
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "unexpected argument %q\n", fs.Arg(0))
		return nil, errUsage
	}
	return bad, nil
}

// envPrefix names the environment twin of every flag: `--nats-url` reads AUTHPLANE_NATS_URL.
const envPrefix = "AUTHPLANE"
