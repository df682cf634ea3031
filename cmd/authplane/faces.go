package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/internal/platform/space"
	"github.com/cotal-ai/authplane/subjects"
)

// owner prints the u_ owner an IdP subject derives in this space.
func owner(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("owner", "[flags]", stderr)
	l := locateFlags(fs)
	issuer := fs.String("issuer", "", "the IdP's issuer, exactly as its tokens' iss (the plane's --idp-issuer)")
	sub := fs.String("sub", "", "the person's subject at the IdP (its tokens' sub)")
	if err := parse(fs, args); err != nil {
		return err
	}
	m, err := l.Keys()
	if err != nil {
		return err
	}
	o, err := admin.Owner(m, *issuer, *sub)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, o)
	return nil
}

// agent gives a managed agent a fresh secret (reusable until revoked or replaced), or revokes
// it and closes its live connections.
func agent(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("agent", "[flags]", stderr)
	l := locateFlags(fs)
	ownerFlag, actor := principalFlags(fs)
	out := fs.String("out", "", "the file to write the agent's secret to (0600; reusable: the agent exchanges it for each bearer until --revoke or a new --out); in a git work tree, only where git ignores it")
	revoke := fs.Bool("revoke", false, "revoke the agent: its next exchange and connection are refused, and its live connections closed")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *revoke == (*out != "") {
		return errors.New("give --out FILE for a new secret, or --revoke")
	}
	if *out != "" {
		if err := secretAt("--out", *out, ""); err != nil {
			return err
		}
	}
	m, err := l.Keys()
	if err != nil {
		return err
	}
	url, err := l.URL()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	principal := subjects.Principal(*ownerFlag, *actor)
	if *revoke {
		revoked, err := admin.RevokeAgent(ctx, m, url, *ownerFlag, *actor)
		if err != nil {
			return err
		}
		if revoked.Already {
			fmt.Fprintf(stdout, "agent %s was revoked already: closed %d live connections left\n", principal, revoked.Closed)
			return nil
		}
		fmt.Fprintf(stdout, "revoked agent %s: closed %d live connections\n", principal, revoked.Closed)
		return nil
	}
	secret, _, err := admin.SetAgent(ctx, m, url, *ownerFlag, *actor)
	if err != nil {
		return err
	}
	if err := space.EnsureDir(filepath.Dir(*out)); err != nil {
		return fmt.Errorf("the agent's secret is set but could not be written (run again for a new one): %w", err)
	}
	if err := space.WriteAtomic(*out, []byte(secret+"\n"), space.Private); err != nil {
		return fmt.Errorf("the agent's secret is set but could not be written (run again for a new one): %w", err)
	}
	fmt.Fprintf(stdout, "wrote the secret of agent %s to %s (reusable: exchange it for each bearer; --revoke ends it)\n", principal, *out)
	fmt.Fprintf(stdout, "exchange it: POST /exchange {\"owner\":%q,\"actor\":%q,\"actorToken\":<the secret>}\n", *ownerFlag, *actor)
	return nil
}

// keys lists, rotates or retires the space's bearer keys: `keys list|rotate [flags]`, `keys
// retire KID [flags]`.
func keys(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("keys", "list|rotate [flags]\n       authplane keys retire KID [flags]\n       authplane keys signing|rotate-signing [--emergency|--resume] [flags]", stderr)
	l := locateFlags(fs)
	action, kid := "", ""
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		action, args = args[0], args[1:]
	}
	if action == "signing" || action == "rotate-signing" {
		return signing(action, args, stdout, stderr)
	}
	// A kid is base64url and may begin with '-' (one key in 64): it is the kid unless it
	// names one of the command's flags.
	if action == "retire" && len(args) > 0 && !isFlag(fs, args[0]) {
		kid, args = args[0], args[1:]
	}
	if err := parse(fs, args); err != nil {
		return err // -h (flag.ErrHelp) included: the usage is printed
	}
	switch {
	case action == "":
		return badUsage("want an action: list, rotate or retire KID")
	case action != "list" && action != "rotate" && action != "retire":
		return badUsage("unknown action %q: want list, rotate or retire KID", action)
	case action == "retire" && kid == "":
		return badUsage("retire needs the KID of the key to retire ('authplane keys list' lists them)")
	}
	m, url, err := located(l)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	set, done, err := admin.BearerKeys(ctx, m, url)
	if err != nil {
		return err
	}
	defer done()
	switch action {
	case "list":
		list, err := set.List(ctx)
		if err != nil {
			return err
		}
		for _, k := range list {
			state := "signs"
			if !k.Active {
				state = fmt.Sprintf("stopped %s, may retire from %s", k.Stopped.UTC().Format(time.RFC3339), k.Retire.UTC().Format(time.RFC3339))
			}
			fmt.Fprintf(stdout, "%s  added %s  %s\n", k.KID, k.Added.UTC().Format(time.RFC3339), state)
		}
	case "rotate":
		kid, err := set.Rotate(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "rotated: %s signs from now on; the previous key stays published (retire it no sooner than 1200 s from now)\n", kid)
	case "retire":
		if err := set.Retire(ctx, kid); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "retired %s: the bearers it signed are refused from now on\n", kid)
	}
	return nil
}
