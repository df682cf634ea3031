package process

import (
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/service"
)

// `authplane version` prints what the Go toolchain reads from the same binary: the module
// version and the VCS revision (or says they are unknown when the build recorded none).
func TestVersionPrintsTheModuleVersionAndRevisionTheBinaryRecords(t *testing.T) {
	t.Parallel()
	bin := harness.AuthplaneBinary(t)
	code, stdout, stderr := harness.RunAuthplane(t, 30*time.Second, "version")
	if code != 0 {
		t.Fatalf("authplane version: exit %d\n%s", code, stderr)
	}
	raw, err := harness.Output(exec.Command("go", "version", "-m", bin))
	if err != nil {
		t.Fatalf("go version -m: %v", err)
	}
	want := map[string]string{"module": "unknown", "revision": "unknown"}
	if m := regexp.MustCompile(`(?m)^\tmod\t\S+\t(\S+)`).FindSubmatch(raw); m != nil {
		want["module"] = string(m[1])
	}
	if m := regexp.MustCompile(`(?m)^\tbuild\tvcs\.revision=(\S+)$`).FindSubmatch(raw); m != nil {
		want["revision"] = string(m[1])
	}
	if !strings.HasPrefix(stdout, "authplane "+service.Version+"\n") {
		t.Errorf("authplane version: got %q, want it to start with the release %s", stdout, service.Version)
	}
	for field, value := range want {
		if !regexp.MustCompile(`(?m)^  ` + field + ` +` + regexp.QuoteMeta(value) + `$`).MatchString(stdout) {
			t.Errorf("authplane version: got %q, want %s %s (as go version -m reads the binary)", stdout, field, value)
		}
	}
}
