package documents

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/cotal-ai/authplane/integration/internal/harness"
)

// TestTheImageReportsTheRevisionItIsBuiltFrom builds the binary as the Dockerfile's build stage
// does, told REVISION as `docker build --build-arg REVISION=…` tells it, and without VCS
// information (the image's build context has no .git: .dockerignore drops it): `authplane
// version` names that revision. docker-compose.yml passes the same argument on. (The base
// images cannot be pulled here, so the mechanism is tested, not the image.)
func TestTheImageReportsTheRevisionItIsBuiltFrom(t *testing.T) {
	harness.Long(t, "builds the binary a second time")
	t.Parallel()
	ignore, err := os.ReadFile(filepath.Join(repoRoot, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^\.git$`).Match(ignore) {
		t.Fatal(".dockerignore no longer drops .git: the toolchain would stamp the revision itself; this test is about when it cannot")
	}
	const rev = "0123456789abcdef0123456789abcdef01234567"
	env, args, err := harness.DockerfileBuild(filepath.Join(repoRoot, "Dockerfile"), map[string]string{"REVISION": rev})
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "authplane")
	for i := range args {
		if i > 0 && args[i-1] == "-o" {
			args[i] = bin
		}
	}
	cmd := exec.Command("go", append([]string{args[0], "-buildvcs=false"}, args[1:]...)...)
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), env...)
	if out, err := harness.CombinedOutput(cmd); err != nil {
		t.Fatalf("go %v: %v\n%s", args, err, out)
	}
	out, err := harness.Output(exec.Command(bin, "version"))
	if err != nil {
		t.Fatalf("authplane version: %v", err)
	}
	if !regexp.MustCompile(`(?m)^  revision ` + rev + `$`).Match(out) {
		t.Errorf("the image's authplane version: got %q, want revision %s", out, rev)
	}

	raw, err := os.ReadFile(filepath.Join(repoRoot, "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			Build any `yaml:"build"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(raw, &compose); err != nil {
		t.Fatal(err)
	}
	for name, s := range compose.Services {
		if s.Build == nil {
			continue
		}
		b, ok := s.Build.(map[string]any)
		args, _ := b["args"].(map[string]any)
		if !ok || !strings.Contains(args["REVISION"].(string), "${REVISION") {
			t.Errorf("docker-compose.yml service %s builds the image without passing REVISION on: %v", name, s.Build)
		}
	}
}
