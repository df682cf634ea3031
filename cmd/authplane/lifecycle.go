package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/cotal-ai/authplane/admin"
)

// waitCmd runs `authplane wait`: it returns once the plane answers /health ok, and prints the
// answer; a plane that is not ready within --timeout is an error naming why.
func waitCmd(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("wait", "[--dir D | --url URL] [--timeout 1m]", stderr)
	dir := fs.String("dir", ".authplane", "the plane's state directory: its auth-service.json names the HTTP face")
	url := fs.String("url", "", "the plane's HTTP face (its loopback or public base URL) instead of --dir")
	timeout := fs.Duration("timeout", time.Minute, "how long to wait (100ms to 1h)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := timeoutRange(*timeout); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	answer, err := admin.Wait(ctx, *dir, *url)
	if err != nil {
		return fmt.Errorf("after %s: %w", *timeout, err)
	}
	fmt.Fprintf(stdout, "%s\n", answer)
	return nil
}

// stopCmd runs `authplane stop`: SIGTERM to the plane of --dir, and wait until it has exited.
// A directory no plane runs on is an error: the stop did nothing.
func stopCmd(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("stop", "[--dir D] [--timeout 1m]", stderr)
	dir := fs.String("dir", ".authplane", "the plane's state directory")
	timeout := fs.Duration("timeout", time.Minute, "how long to wait for it to exit, once it drained within its --drain-timeout (100ms to 1h)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := timeoutRange(*timeout); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	pid, err := admin.Stop(ctx, *dir)
	if errors.Is(err, admin.ErrNotRunning) {
		return fmt.Errorf("%w: nothing was stopped", err)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "stopped the plane of %s (pid %d)\n", *dir, pid)
	return nil
}

// timeoutRange checks the --timeout of wait and stop.
func timeoutRange(d time.Duration) error {
	if d < 100*time.Millisecond || d > time.Hour {
		return fmt.Errorf("--timeout %s: want 100ms to 1h", d)
	}
	return nil
}
