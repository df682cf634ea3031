package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"runtime/debug"
	"strings"
	"time"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/service"
)

// identityCmd runs `authplane identity migrate`: the plane's file identity moves into the
// space's secrets bucket under --instance-name, and the file is removed.
func identityCmd(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("identity migrate", "--dir D --instance-name N [--space-dir S] [--nats-url URL]", stderr)
	l := locateFlags(fs)
	name := fs.String("instance-name", "", "the name the identity is stored under: serve later with --identity-store kv --instance-name <this>")
	switch {
	case len(args) > 0 && isHelp(args[0]):
		fs.Usage()
		return flag.ErrHelp
	case len(args) == 0 || strings.HasPrefix(args[0], "-"):
		return badUsage("want an action: migrate")
	case args[0] != "migrate":
		return badUsage("unknown action %q: want migrate", args[0])
	}
	if err := parse(fs, args[1:]); err != nil {
		return err
	}
	m, url, err := located(l)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id, err := admin.MigrateIdentity(ctx, m, url, l.Dir, *name)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "moved instance %s into the store as %q and removed its file; serve with --identity-store kv --instance-name %s\n",
		id.InstanceID, *name, *name)
	return nil
}

// versionCmd prints the release, the module version and the VCS revision the binary was built
// from.
func versionCmd(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("version", "", stderr)
	if err := parse(fs, args); err != nil {
		return err
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = nil
	}
	fmt.Fprint(stdout, versionText(bi, revision))
	return nil
}

// revision is the VCS revision the build was told (`-ldflags "-X main.revision=…"`, as the
// Dockerfile sets it from its REVISION argument): what a build without .git in its context
// cannot read itself.
var revision = ""

// versionText is what `authplane version` prints for build info bi (nil when the binary
// carries none) and the stamped revision: the toolchain's VCS revision when it recorded one,
// else the stamped one, else "unknown".
func versionText(bi *debug.BuildInfo, stamped string) string {
	module, revision, modified := "unknown", "unknown", false
	if stamped != "" {
		revision = stamped
	}
	if bi != nil {
		module = bi.Main.Version
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				revision = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	text := fmt.Sprintf("authplane %s\n  module   %s\n  revision %s\n", service.Version, module, revision)
	if modified {
		text += "  (built from a tree with uncommitted changes)\n"
	}
	return text
}
