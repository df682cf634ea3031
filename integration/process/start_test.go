package process

import (
	"context"
	"errors"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/capability/instance"
	"github.com/cotal-ai/authplane/internal/platform/space"
)

// TestStartRefusesAStateDirItCannotUseOrAnExposedKeyFile: a state directory the plane cannot
// use (a file, or one whose identity cannot be read), or a file of the space material that
// holds a secret with group or world bits: the start is refused with an error naming the file
// and why, the broker never starts, nothing is served, and the material is left as it was.
func TestStartRefusesAStateDirItCannotUseOrAnExposedKeyFile(t *testing.T) {
	t.Parallel()
	chmod := func(name string, mode os.FileMode) func(t *testing.T, dir, spaceDir string) {
		return func(t *testing.T, _, spaceDir string) {
			if err := os.Chmod(filepath.Join(spaceDir, name), mode); err != nil {
				t.Fatal(err)
			}
		}
	}
	tests := []struct {
		name    string
		prepare func(t *testing.T, dir, spaceDir string)
		want    []string
		exposed bool
	}{
		{"the state dir is a file", func(t *testing.T, dir, _ string) {
			if err := os.WriteFile(dir, nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}, []string{"state dir", "not a directory"}, false},
		{"its identity cannot be read", func(t *testing.T, dir, _ string) {
			if err := os.MkdirAll(filepath.Join(dir, instance.IdentityFile), 0o700); err != nil {
				t.Fatal(err)
			}
		}, []string{instance.IdentityFile, "is a directory"}, false},
		{"a signing seed its group may read", chmod("data-signing.nk", 0o640), []string{"data-signing.nk has mode 0640", "chmod 600"}, true},
		{"the owner secret others may read", chmod("owner-secret.json", 0o604), []string{"owner-secret.json has mode 0604", "chmod 600"}, true},
		{"the bearer key its group may write", chmod("bearer-issuer.jwk", 0o620), []string{"bearer-issuer.jwk has mode 0620", "chmod 600"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, spaceDir, _ := harness.NewSpaceMaterial(t, harness.TestSpace)
			cfg := harness.PlaneConfig(t)
			cfg.Dir, cfg.SpaceDir = filepath.Join(t.TempDir(), "state"), spaceDir
			tt.prepare(t, cfg.Dir, spaceDir)
			material := modesOf(t, spaceDir)

			p, err := harness.TryStart(t, cfg)
			if err == nil {
				harness.ClosePlane(t, p)
				t.Fatal("got a running plane, want the start refused")
			}
			t.Logf("refused: %v", err)
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("start: got %q, want it to say %q", err, w)
				}
			}
			if errors.Is(err, space.ErrExposed) != tt.exposed {
				t.Errorf("start: got %v; errors.Is(space.ErrExposed) = %v, want %v", err, !tt.exposed, tt.exposed)
			}
			for _, made := range []string{admin.ServiceInfoFile, "nats"} {
				if _, err := os.Stat(filepath.Join(cfg.Dir, made)); !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
					t.Errorf("after the refused start: stat %s: %v, want nothing there", made, err)
				}
			}
			if got := modesOf(t, spaceDir); !maps.Equal(got, material) {
				t.Errorf("the refused start changed the space material: %v, was %v", got, material)
			}
		})
	}
}

// modesOf lists every file of dir with its mode.
func modesOf(t testing.TB, dir string) map[string]os.FileMode {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]os.FileMode{}
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = fi.Mode()
	}
	return out
}

// TestServeRefusesAStateDirItsUserCannotRead: `authplane serve` on a state directory its
// user may not read exits 1 naming the directory and the permission it lacks, and leaves
// nothing in it. Root reads any directory, so under root the plane runs as nobody, on a state
// directory root owns (0700); otherwise the directory is made 0000.
func TestServeRefusesAStateDirItsUserCannotRead(t *testing.T) {
	t.Parallel()
	base, err := os.MkdirTemp("", "authplane-unreadable-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(base); err != nil {
			t.Error(err)
		}
	})
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(base, "state")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	_, spaceDir, _ := harness.NewSpaceMaterial(t, harness.TestSpace)
	bin := harness.AuthplaneBinary(t)
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		raw, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		bin = filepath.Join(base, "authplane")
		if err := os.WriteFile(bin, raw, 0o755); err != nil {
			t.Fatal(err)
		}
		cred = &syscall.Credential{Uid: 65534, Gid: 65534}
	} else {
		if err := os.Chmod(dir, 0); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := os.Chmod(dir, 0o700); err != nil {
				t.Error(err)
			}
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "serve", "--dir", dir, "--space-dir", spaceDir, "--nats-port", "0", "--http-port", "0")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	out, err := harness.CombinedOutput(cmd)
	uid := os.Geteuid()
	if cred != nil {
		uid = int(cred.Uid)
	}
	t.Logf("serve as uid %d: %v\n%s", uid, err, out)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("serve on an unreadable state dir: %v, want exit 1\n%s", err, out)
	}
	if want := "state dir " + dir; !strings.Contains(string(out), want) || !strings.Contains(string(out), "permission denied") {
		t.Errorf("serve on an unreadable state dir said:\n%s\nwant it to name %q and the permission denied", out, want)
	}
	if os.Geteuid() == 0 {
		if entries, err := os.ReadDir(dir); err != nil || len(entries) != 0 {
			t.Errorf("the refused start left %v (%v) in the state dir, want nothing", entries, err)
		}
	}
}
