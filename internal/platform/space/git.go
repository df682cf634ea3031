package space

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// ErrCommittable means a secret would be written into a git work tree, somewhere git does not
// ignore: one `git add` from a commit.
var ErrCommittable = errors.New("git does not ignore it")

// ignoreAll is the .gitignore MarkIgnored writes: everything in its directory, itself included.
const ignoreAll = "# Written by authplane: nothing in this directory belongs in git.\n*\n"

// MarkIgnored makes dir (0700, with its parents, if need be) a directory git ignores whole: it
// writes a .gitignore of `*` into it unless one is there. authplane's default state directory
// (.authplane) is marked so, wherever it is made.
func MarkIgnored(dir string) error {
	if err := EnsureDir(dir); err != nil {
		return err
	}
	path := filepath.Join(dir, ".gitignore")
	if _, err := os.Lstat(path); err == nil || !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return WriteAtomic(path, []byte(ignoreAll), 0o644)
}

// CheckIgnored returns nil when a secret may be written at path: path is in no git work tree
// (no directory from it up holds a `.git`, a repository's or a worktree's), or git ignores it
// there. git decides when it is on PATH (`git check-ignore`); without git, or when it cannot
// tell, only a directory MarkIgnored marked counts as ignored. Otherwise it returns
// ErrCommittable, saying where the work tree is.
func CheckIgnored(path string) error {
	abs, err := resolved(path)
	if err != nil {
		return err
	}
	root := ""
	for dir := abs; ; dir = filepath.Dir(dir) {
		if _, err := os.Lstat(filepath.Join(dir, ".git")); err == nil {
			root = dir
			break
		}
		if filepath.Dir(dir) == dir {
			return nil
		}
	}
	rel, err := filepath.Rel(root, abs)
	if err != nil {
		return err
	}
	why := ""
	if git, err := exec.LookPath("git"); err == nil {
		cmd := exec.Command(git, "-C", root, "check-ignore", "-q", "--", rel)
		cmd.Env = withoutGitVars(os.Environ()) // the work tree found here, not one the environment names
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &exit) && exit.ExitCode() == 1:
			return fmt.Errorf("%s is in the git work tree %s, and %w", path, root, ErrCommittable)
		}
		why = fmt.Sprintf("git check-ignore could not tell (%v: %s)", err, strings.TrimSpace(stderr.String()))
	} else {
		why = "git is not on PATH to ask whether it ignores it"
	}
	for dir := filepath.Dir(abs); strings.HasPrefix(dir, root); dir = filepath.Dir(dir) {
		if marked, err := os.ReadFile(filepath.Join(dir, ".gitignore")); err == nil && string(marked) == ignoreAll {
			return nil
		}
		if dir == root {
			break
		}
	}
	return fmt.Errorf("%s is in the git work tree %s, and %s: %w", path, root, why, ErrCommittable)
}

// resolved is path made absolute, with the symbolic links of its longest existing prefix
// resolved: the work tree a write lands in.
func resolved(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	rest := ""
	for dir := abs; ; dir = filepath.Dir(dir) {
		if real, err := filepath.EvalSymlinks(dir); err == nil {
			return filepath.Join(real, rest), nil
		}
		if filepath.Dir(dir) == dir {
			return abs, nil
		}
		rest = filepath.Join(filepath.Base(dir), rest)
	}
}

// withoutGitVars is env without the GIT_ variables that point git at another repository.
func withoutGitVars(env []string) []string {
	var out []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, "GIT_") {
			out = append(out, kv)
		}
	}
	return out
}
