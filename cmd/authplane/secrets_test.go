package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// inGitRepo makes a fresh git work tree (no .gitignore) the working directory.
func inGitRepo(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not on PATH")
	}
	dir := t.TempDir()
	if out, err := exec.Command("git", "init", "-q", dir).CombinedOutput(); err != nil {
		t.Fatalf("git init: %v\n%s", err, out)
	}
	t.Chdir(dir)
	return dir
}

// untracked lists what `git status` shows in repo: what a `git add .` would commit.
func untracked(t *testing.T, repo string) string {
	t.Helper()
	out, err := exec.Command("git", "-C", repo, "status", "--porcelain", "--untracked-files=all").Output()
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// `authplane init` with its defaults writes the space material (a private bearer key, the
// owner secret) under .authplane/, which it has git ignore wherever it makes it; and a command
// told to write a secret into a git work tree where git does not ignore it refuses, writing
// nothing, and says where to write instead.
func TestInitWritesUnderAnIgnoredDirectoryAndRefusesOneGitWouldCommit(t *testing.T) {
	repo := inGitRepo(t)
	var stdout, stderr bytes.Buffer
	if code := run([]string{"init"}, &stdout, &stderr); code != 0 {
		t.Fatalf("init: exit %d\n%s", code, stderr.String())
	}
	if _, err := os.Stat(filepath.Join(repo, ".authplane", "space", "owner-secret.json")); err != nil {
		t.Errorf("init with its defaults: %v, want the material under .authplane/space", err)
	}
	if got := untracked(t, repo); got != "" {
		t.Errorf("git status after init: %q, want nothing to commit", got)
	}

	for _, args := range [][]string{
		{"init", "--space-dir", "space"},
		{"nkeys", "--out", "mgr"},
		{"creds", "--owner", "u_aaaaaaaaaaaaaaaaaaaaaaaaaa", "--actor", "cli", "--out", "cli.txt"},
		{"agent", "--owner", "u_aaaaaaaaaaaaaaaaaaaaaaaaaa", "--actor", "a", "--out", "agent.txt"},
		{"serve", "--dir", "state", "--nats-port", "0", "--http-port", "0"},
		{"serve", "--space-dir", "material", "--nats-port", "0", "--http-port", "0"},
	} {
		stdout.Reset()
		stderr.Reset()
		code := run(args, &stdout, &stderr)
		flag, value := args[len(args)-2], args[len(args)-1]
		if args[0] == "serve" {
			flag, value = args[1], args[2]
		}
		want := flag + " " + filepath.Join(".authplane", value)
		if code != 1 || !strings.Contains(stderr.String(), "git does not ignore it") || !strings.Contains(stderr.String(), want) {
			t.Errorf("authplane %s: got exit %d, %q; want 1, refused, pointing to %s", strings.Join(args, " "), code, stderr.String(), want)
		}
		if got := untracked(t, repo); got != "" {
			t.Errorf("authplane %s wrote %q, want nothing", strings.Join(args, " "), got)
		}
	}
	stdout.Reset()
	if code := run([]string{"nkeys", "--out", ".authplane/mgr"}, &stdout, &stderr); code != 0 || untracked(t, repo) != "" {
		t.Errorf("nkeys --out .authplane/mgr: exit %d, git status %q; want 0 and nothing to commit", code, untracked(t, repo))
	}
}

// Without git on PATH nothing can say what git ignores: only the .authplane/ authplane made
// counts, and anything else in a work tree is refused, saying so.
func TestWithoutGitOnlyItsOwnDirectoryTakesASecret(t *testing.T) {
	repo := inGitRepo(t)
	t.Setenv("PATH", "")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"init", "--space-dir", "space"}, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "git is not on PATH") {
		t.Errorf("init --space-dir space without git: exit %d, %q; want 1, saying git is not on PATH", code, stderr.String())
	}
	if code := run([]string{"init"}, &stdout, &stderr); code != 0 {
		t.Errorf("init without git: exit %d, %q; want its defaults under .authplane/ written", code, stderr.String())
	}
	if _, err := os.Stat(filepath.Join(repo, "space")); !os.IsNotExist(err) {
		t.Errorf("the refused init wrote space/: %v", err)
	}
}
