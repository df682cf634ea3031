package space

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/jwt/v2"
)

func TestCreateWritesPrivateMaterialThatLoadsBack(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "space")
	m, err := Create(dir, "acme")
	if err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o700 {
		t.Errorf("space dir mode: got %o, want 700", info.Mode().Perm())
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: got mode %o, want 600", e.Name(), fi.Mode().Perm())
		}
	}
	got, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got.Space != "acme" || got.Data.Public() != m.Data.Public() || string(got.OwnerSecret) != string(m.OwnerSecret) || got.BearerKey.KeyID != m.BearerKey.KeyID {
		t.Fatal("loaded material differs from what was created")
	}
	data, err := jwt.DecodeAccountClaims(got.Data.JWT)
	if err != nil {
		t.Fatal(err)
	}
	if data.Limits.JetStreamLimits.DiskStorage != 0 || data.Limits.JetStreamLimits.MemoryStorage != 0 {
		t.Error("the data account has JetStream; minted users must not reach any stream")
	}
	if !data.SigningKeys.Contains(mustPublic(got.Data.Signer)) {
		t.Error("the data account does not list its signing key")
	}
}

func TestCreateNeverOverwritesMaterial(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "space")
	if _, err := Create(dir, "acme"); err != nil {
		t.Fatal(err)
	}
	if _, err := Create(dir, "acme"); !errors.Is(err, os.ErrExist) {
		t.Fatalf("got %v, want os.ErrExist", err)
	}
	m, created, err := LoadOrCreate(dir, "acme")
	if err != nil || created || m == nil {
		t.Fatalf("LoadOrCreate on existing material: got created=%v err=%v, want it reused", created, err)
	}
	if _, _, err := LoadOrCreate(dir, "other"); err == nil || !strings.Contains(err.Error(), `"acme"`) {
		t.Fatalf("got %v, want a refusal naming the material's space", err)
	}
}

func TestCreateFillsAnEmptyExistingDirectory(t *testing.T) {
	dir := t.TempDir() // exists, empty: a volume's mount point
	if _, err := Create(dir, "acme"); err != nil {
		t.Fatalf("got %v, want the empty directory filled", err)
	}
	if _, err := Load(dir); err != nil {
		t.Fatal(err)
	}
}

func TestLoadWithoutTheOperatorSigningKey(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "space")
	if _, err := Create(dir, "acme"); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, operatorSignerFile)); err != nil {
		t.Fatal(err)
	}
	m, err := Load(dir)
	if err != nil {
		t.Fatalf("got %v, want material without the operator signing key to load", err)
	}
	if m.OperatorSigner != nil {
		t.Fatal("got an operator signing key, want none")
	}
}

func TestLoadReportsEveryBrokenFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "space")
	if _, err := Create(dir, "acme"); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{dataSignerFile, planeSeedFile} {
		if err := os.Remove(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	_, err := Load(dir)
	if err == nil || !strings.Contains(err.Error(), dataSignerFile) || !strings.Contains(err.Error(), planeSeedFile) {
		t.Fatalf("got %v, want one error naming both missing files", err)
	}
}

func TestLoadRefusesAKeyThatIsNotTheAccounts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "space")
	if _, err := Create(dir, "acme"); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(t.TempDir(), "other")
	if _, err := Create(other, "acme"); err != nil {
		t.Fatal(err)
	}
	seed, err := os.ReadFile(filepath.Join(other, dataSignerFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, dataSignerFile), seed, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "signing key") {
		t.Fatalf("got %v, want a refusal of the foreign signing key", err)
	}
}

// Every file that holds a secret is refused, all at once, if group or others may read or
// write it; the descriptor (public JWTs only) may be world-readable.
func TestLoadRefusesSecretsOpenToGroupOrOthers(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "space")
	if _, err := Create(dir, "acme"); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, descriptorFile), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir); err != nil {
		t.Fatalf("a world-readable descriptor: got %v, want the material", err)
	}
	exposed := map[string]os.FileMode{dataSignerFile: 0o640, ownerSecretFile: 0o604, bearerKeyFile: 0o620, operatorSignerFile: 0o602}
	for name, mode := range exposed {
		if err := os.Chmod(filepath.Join(dir, name), mode); err != nil {
			t.Fatal(err)
		}
	}
	_, err := Load(dir)
	if !errors.Is(err, ErrExposed) {
		t.Fatalf("got %v, want ErrExposed", err)
	}
	for name, mode := range exposed {
		if want := fmt.Sprintf("%s has mode %04o", name, mode); !strings.Contains(err.Error(), want) {
			t.Errorf("got %v, want it to say %q", err, want)
		}
	}
}
