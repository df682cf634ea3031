package instance

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/subjects"
)

// FuzzIdentity checks the decoders of the state directory's files on any bytes: the instance
// identity (LoadIdentity) and the service info (ReadServiceInfo). An identity that does
// not parse is an error, the zero identity, and a file left as it was (never replaced by a
// fresh identity); one that parses is version 1, of this space, with an instance id on its
// grammar, and written again it reads back the same. Service info that does not parse is an
// error and no info.
func FuzzIdentity(f *testing.F) {
	good := `{"ver":1,"space":"default","instanceId":"` + strings.Repeat("a", 26) + `"}`
	for _, s := range []string{
		good,
		strings.Replace(good, `"default"`, `"other"`, 1),
		strings.Replace(good, `"ver":1`, `"ver":2`, 1),
		strings.Replace(good, strings.Repeat("a", 26), "A", 1),
		strings.Replace(good, `}`, `,"seed":"SU"}`, 1),
		`{"ver":1,"url":"http://127.0.0.1:8480","natsUrl":"nats://127.0.0.1:4222","spaceDir":"/s","pid":1,"cap":"c"}`,
		``, `not json`, `null`, `{}`,
	} {
		f.Add([]byte(s))
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(dir, IdentityFile)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		id, err := LoadIdentity(dir, "default")
		if after, rerr := os.ReadFile(path); rerr != nil || !bytes.Equal(after, data) {
			t.Fatalf("loading the identity rewrote its file (%v)", rerr)
		}
		if err != nil {
			if id != (Identity{}) {
				t.Fatalf("an identity that does not parse came back as %+v with %v", id, err)
			}
		} else {
			if id.Ver != 1 || id.Space != "default" || !subjects.ValidUID(id.InstanceID) {
				t.Fatalf("accepted %+v from %q", id, fault.Clip(string(data), 200))
			}
			written, err := json.Marshal(id)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, written, 0o600); err != nil {
				t.Fatal(err)
			}
			if back, err := LoadIdentity(dir, "default"); err != nil || back != id {
				t.Fatalf("the identity %+v, written again, reads back as %+v, %v", id, back, err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, ServiceInfoFile), data, 0o600); err != nil {
			t.Fatal(err)
		}
		if info, err := ReadServiceInfo(dir); err != nil && info != nil {
			t.Fatalf("service info that does not parse came back as %+v with %v", info, err)
		}
	})
}

// FuzzClaimedIdentity checks the decoder of a claimed identity on any stored bytes: a record
// that does not parse refuses the claim (ErrMalformed) and writes nothing; one that parses is
// adopted as it is: version 1, this space and name, an instance id on its grammar.
func FuzzClaimedIdentity(f *testing.F) {
	good := `{"ver":1,"space":"default","name":"plane1","instanceId":"` + strings.Repeat("a", 26) + `"}`
	for _, s := range []string{
		good,
		strings.Replace(good, `"plane1"`, `"plane2"`, 1),
		strings.Replace(good, `"default"`, `"other"`, 1),
		strings.Replace(good, `"ver":1`, `"ver":2`, 1),
		strings.Replace(good, `}`, `,"seed":"SU"}`, 1),
		``, `not json`, `null`, `{}`, `[]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		kv := testkit.NewKV()
		kv.Put(subjects.IdentityKey("plane1"), data)
		id, err := Claim(t.Context(), kv, t.TempDir(), "default", "plane1")
		switch {
		case err != nil:
			if !errors.Is(err, ErrMalformed) || id != (Identity{}) || kv.Revision() != 1 {
				t.Fatalf("a record that does not parse: got %+v, %v after %d writes; want ErrMalformed and nothing written", id, err, kv.Revision())
			}
		case id.Ver != 1 || id.Space != "default" || !subjects.ValidUID(id.InstanceID) || kv.Revision() != 1:
			t.Fatalf("adopted %+v from %q after %d writes", id, fault.Clip(string(data), 200), kv.Revision())
		}
	})
}
