package space

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// gitRepo makes a git work tree in a temp dir whose .gitignore is ignore, and returns it.
func gitRepo(t *testing.T, ignore string) string {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not on PATH")
	}
	dir := t.TempDir()
	if out, err := exec.Command("git", "init", "-q", dir).CombinedOutput(); err != nil {
		t.Fatalf("git init: %v\n%s", err, out)
	}
	if err := os.WriteFile(filepath.Join(dir, ".gitignore"), []byte(ignore), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestCheckIgnoredAsksGitInAWorkTreeAndNothingOutsideOne(t *testing.T) {
	repo := gitRepo(t, "/.authplane/\n*.creds\n")
	for _, c := range []struct {
		path string
		ok   bool
	}{
		{filepath.Join(t.TempDir(), "space", "owner-secret.json"), true}, // no work tree
		{filepath.Join(repo, ".authplane", "space", "owner-secret.json"), true},
		{filepath.Join(repo, "cli.creds"), true},
		{filepath.Join(repo, "space", "owner-secret.json"), false},
		{filepath.Join(repo, "sub", ".authplane", "x"), false}, // /.authplane/ is the root's only
		{filepath.Join(repo, "cli.secret"), false},
	} {
		err := CheckIgnored(c.path)
		if c.ok && err != nil || !c.ok && (!errors.Is(err, ErrCommittable) || !strings.Contains(err.Error(), repo)) {
			t.Errorf("%s: got %v, want ok %v (ErrCommittable naming the work tree)", c.path, err, c.ok)
		}
	}
}

// A worktree's .git is a file; a path reached through a symbolic link is checked where it lands.
func TestCheckIgnoredFindsAWorktreeAndFollowsLinks(t *testing.T) {
	repo := gitRepo(t, "/.authplane/\n")
	wt := filepath.Join(t.TempDir(), "wt")
	if out, err := exec.Command("git", "-C", repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "x").CombinedOutput(); err != nil {
		t.Fatalf("git commit: %v\n%s", err, out)
	}
	if out, err := exec.Command("git", "-C", repo, "worktree", "add", "-q", wt).CombinedOutput(); err != nil {
		t.Fatalf("git worktree add: %v\n%s", err, out)
	}
	if err := CheckIgnored(filepath.Join(wt, "space", "x")); !errors.Is(err, ErrCommittable) {
		t.Errorf("in a worktree: got %v, want ErrCommittable", err)
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(repo, link); err != nil {
		t.Fatal(err)
	}
	if err := CheckIgnored(filepath.Join(link, "space", "x")); !errors.Is(err, ErrCommittable) {
		t.Errorf("through a link into the work tree: got %v, want ErrCommittable", err)
	}
}

// Without git on PATH only a directory MarkIgnored marked counts as ignored: anything else in a
// work tree is refused, for nothing else can tell.
func TestWithoutGitOnlyAMarkedDirectoryIsIgnored(t *testing.T) {
	repo := gitRepo(t, "/.authplane/\n")
	t.Setenv("PATH", "")
	state := filepath.Join(repo, ".authplane")
	if err := CheckIgnored(filepath.Join(state, "x")); !errors.Is(err, ErrCommittable) || !strings.Contains(err.Error(), "git is not on PATH") {
		t.Errorf("an unmarked directory without git: got %v, want ErrCommittable saying git is not on PATH", err)
	}
	if err := MarkIgnored(state); err != nil {
		t.Fatal(err)
	}
	if err := CheckIgnored(filepath.Join(state, "space", "owner-secret.json")); err != nil {
		t.Errorf("a marked directory without git: got %v, want nil", err)
	}
	if err := CheckIgnored(filepath.Join(repo, "other", "x")); !errors.Is(err, ErrCommittable) {
		t.Errorf("beside the marked directory: got %v, want ErrCommittable", err)
	}
}

// MarkIgnored makes the directory and its .gitignore of `*`, which git honours, and keeps a
// .gitignore that is there already.
func TestMarkIgnoredMakesGitIgnoreTheWholeDirectory(t *testing.T) {
	repo := gitRepo(t, "")
	state := filepath.Join(repo, "state")
	if err := MarkIgnored(state); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(state); err != nil || fi.Mode().Perm() != privateDir {
		t.Fatalf("the directory: %v %v, want it made %o", fi, err, privateDir)
	}
	if err := os.WriteFile(filepath.Join(state, "secret.nk"), []byte("S"), Private); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("git", "-C", repo, "status", "--porcelain", "--untracked-files=all").Output()
	if err != nil || strings.Contains(string(out), "state/") {
		t.Errorf("git status: %q %v, want nothing of state/", out, err)
	}
	mine := filepath.Join(repo, "mine")
	if err := os.MkdirAll(mine, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mine, ".gitignore"), []byte("*.nk\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := MarkIgnored(mine); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(mine, ".gitignore")); string(got) != "*.nk\n" {
		t.Errorf("an existing .gitignore: got %q, want it kept", got)
	}
}
