package documents

import (
	"context"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/subjects"
)

// dockerUser returns the USER of the Dockerfile's last stage.
func dockerUser(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	users := regexp.MustCompile(`(?m)^USER (\S+)$`).FindAllStringSubmatch(string(raw), -1)
	stages := regexp.MustCompile(`(?m)^FROM `).FindAllIndex(raw, -1)
	if len(users) == 0 || len(stages) == 0 || strings.LastIndex(string(raw), "\nUSER ") < stages[len(stages)-1][0] {
		t.Fatal("Dockerfile: want a USER in its last stage")
	}
	return users[len(users)-1][1]
}

// The image's binary is built by the tests' own build (the Dockerfile's command): it must be
// static, as an image without a C library needs, and the image must not run it as root.
func TestTheImageBinaryIsStaticAndRunsAsANonRootUser(t *testing.T) {
	t.Parallel()
	f, err := elf.Open(harness.AuthplaneBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("the Dockerfile's build gives a dynamically linked binary (program header %s), want a static one", p.Type)
		}
	}
	if libs, err := f.ImportedLibraries(); err != nil || len(libs) != 0 {
		t.Errorf("the binary imports %v (%v), want no shared library", libs, err)
	}
	user := dockerUser(t)
	uid, _, _ := strings.Cut(user, ":")
	if n, err := strconv.Atoi(uid); err != nil || n == 0 {
		t.Errorf("Dockerfile USER %s: want a numeric non-root uid (a name may not resolve, and 0 is root)", user)
	}
}

// Where a Docker engine runs, the image builds, runs its binary, and is not root. (This machine
// has none; the test above checks what can be checked without one.)
func TestTheImageBuildsWhereADockerEngineRuns(t *testing.T) {
	t.Parallel()
	if err := harness.Run(exec.Command("docker", "version", "--format", "{{.Server.Version}}")); err != nil {
		t.Skip("no Docker engine here")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	tag := "authplane-test:" + subjects.NewUID()
	if out, err := harness.CombinedOutput(exec.CommandContext(ctx, "docker", "build", "-t", tag, repoRoot)); err != nil {
		t.Fatalf("docker build: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if out, err := harness.CombinedOutput(exec.Command("docker", "image", "rm", tag)); err != nil {
			t.Errorf("docker image rm %s: %v\n%s", tag, err, out)
		}
	})
	out, err := harness.Output(exec.CommandContext(ctx, "docker", "image", "inspect", "--format", "{{.Config.User}}", tag))
	if got := strings.TrimSpace(string(out)); err != nil || got != dockerUser(t) {
		t.Errorf("image user: got %q (%v), want the Dockerfile's %s", got, err, dockerUser(t))
	}
	if out, err := harness.CombinedOutput(exec.CommandContext(ctx, "docker", "run", "--rm", tag, "version")); err != nil || !strings.HasPrefix(string(out), "authplane ") {
		t.Errorf("docker run %s version: %v\n%s", tag, err, out)
	}
}
