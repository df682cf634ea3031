package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/internal/capability/signers"
)

// signing shows or rotates the data account's signing keys: `keys signing [flags]`, `keys
// rotate-signing [--emergency | --resume] [flags]` (docs/OPERATIONS.md, "Rotate the signing
// keys").
func signing(action string, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("keys "+action, "[flags]", stderr)
	l := locateFlags(fs)
	emergency := fs.Bool("emergency", false, "rotate-signing: remove the old keys at once (every credential they signed is refused and its connection closed), replace the bearer key and retire the others, and key the proofs anew")
	resume := fs.Bool("resume", false, "rotate-signing: complete the rotation under way instead of beginning one")
	timeout := fs.Duration("timeout", time.Minute, "how long to wait for the broker (1s to 1h)")
	if err := parse(fs, args); err != nil {
		return err
	}
	switch {
	case action == "signing" && (*emergency || *resume):
		return errors.New("--emergency and --resume are for rotate-signing")
	case *emergency && *resume:
		return errors.New("give --emergency to begin an emergency rotation, or --resume to complete the one under way, not both")
	case *timeout < time.Second || *timeout > time.Hour:
		return fmt.Errorf("--timeout %s: want 1s to 1h", *timeout)
	}
	m, url, err := located(l)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	if action == "signing" {
		st, rep, err := admin.SigningStatus(ctx, m, url)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "generation %d signs; generation %d keys the registration proofs\n", st.Current, st.Trust)
		if rep.OpID != "" {
			fmt.Fprintln(stdout, describe(rep))
		}
		return nil
	}
	kind := signers.Scheduled
	if *emergency {
		kind = signers.Emergency
	}
	rep, err := admin.RotateSigning(ctx, m, url, admin.RotateOptions{Kind: kind, Resume: *resume})
	if rep != nil && rep.OpID != "" {
		fmt.Fprintln(stdout, describe(rep))
	}
	return err
}

// describe says what a rotation came to.
func describe(rep *signers.Report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s rotation %s, generation %d to %d: ", rep.Kind, rep.OpID, rep.From, rep.To)
	switch {
	case rep.Done:
		b.WriteString("done")
	case !rep.RemoveAfter.IsZero() && rep.Step == signers.StepSwitched:
		fmt.Fprintf(&b, "generation %d signs; generation %d stays listed until %s (the plane removes it then, or run 'authplane keys rotate-signing --resume')",
			rep.To, rep.From, rep.RemoveAfter.UTC().Format(time.RFC3339))
	default:
		fmt.Fprintf(&b, "stopped after step %s", rep.Step)
	}
	if len(rep.Confirmed) > 0 {
		fmt.Fprintf(&b, "\nconfirmed by servers: %s", strings.Join(rep.Confirmed, ", "))
	}
	if len(rep.Unconfirmed) > 0 {
		fmt.Fprintf(&b, "\nNOT confirmed by servers: %s", strings.Join(rep.Unconfirmed, ", "))
	}
	if rep.Bearer != "" {
		fmt.Fprintf(&b, "\nbearer key %s signs; every other bearer key is retired", rep.Bearer)
	}
	if rep.Kind == signers.Emergency && (rep.Done || rep.Left > 0) {
		fmt.Fprintf(&b, "\nconnections of the old keys still listed: %d", rep.Left)
	}
	return b.String()
}
