package powercut

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// checkFor calls fn every `every` until it returns nil, and fails the test with fn's last
// error if that has not happened within total.
func checkFor(t testing.TB, total, every time.Duration, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(total)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not true within %s: %v", total, err)
		}
		time.Sleep(every)
	}
}

func writeFile(t testing.TB, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// readFile returns the file's content, or "(none)" when it does not exist.
func readFile(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return "(none)"
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func cut(t testing.TB, f *FS) {
	t.Helper()
	if err := f.Cut(); err != nil {
		t.Fatalf("cut: %v", err)
	}
}

func TestCutLosesWritesNotSynced(t *testing.T) {
	backing := t.TempDir()
	writeFile(t, filepath.Join(backing, "old"), "on the disk before")
	f := Mount(t, backing)
	writeFile(t, filepath.Join(f.Dir(), "old"), "overwritten, never synced")
	writeFile(t, filepath.Join(f.Dir(), "new"), "written, never synced")
	cut(t, f)
	for name, want := range map[string]string{"old": "on the disk before", "new": ""} {
		if got := readFile(t, filepath.Join(backing, name)); got != want {
			t.Errorf("%s after the cut: got %q, want %q", name, got, want)
		}
	}
}

func TestCutKeepsSyncedWrites(t *testing.T) {
	fdatasync := func(f *os.File) error { return unix.Fdatasync(int(f.Fd())) }
	cases := []struct {
		name  string
		flags int
		sync  func(*os.File, string) error
	}{
		{"fsync", 0, func(f *os.File, _ string) error { return f.Sync() }},
		{"fdatasync", 0, func(f *os.File, _ string) error { return fdatasync(f) }},
		{"O_DSYNC", syscall.O_DSYNC, nil},
		{"O_SYNC", syscall.O_SYNC, nil},
		// The pending writes belong to the file, not to a descriptor.
		{"fsync of another descriptor", 0, func(_ *os.File, path string) error {
			g, err := os.Open(path)
			if err != nil {
				return err
			}
			defer g.Close()
			return g.Sync()
		}},
	}
	backing := t.TempDir()
	f := Mount(t, backing)
	for _, c := range cases {
		path := filepath.Join(f.Dir(), c.name)
		file, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|c.flags, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := file.WriteString("synced"); err != nil {
			t.Fatal(err)
		}
		if c.sync != nil {
			if err := c.sync(file, path); err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
		}
		file.Close()
		plain, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := plain.WriteString(", then not"); err != nil {
			t.Fatal(err)
		}
		plain.Close()
	}
	cut(t, f)
	for _, c := range cases {
		if got := readFile(t, filepath.Join(backing, c.name)); got != "synced" {
			t.Errorf("%s: after the cut got %q, want %q", c.name, got, "synced")
		}
	}
}

// Names change on the disk at once; the data of the files named does not.
func TestCutKeepsNamesAsChanged(t *testing.T) {
	backing := t.TempDir()
	writeFile(t, filepath.Join(backing, "moved"), "synced before")
	writeFile(t, filepath.Join(backing, "doomed"), "synced before")
	f := Mount(t, backing)
	if err := os.Mkdir(filepath.Join(f.Dir(), "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(f.Dir(), "d", "new"), "never synced")
	writeFile(t, filepath.Join(f.Dir(), "moved"), "rewritten, never synced")
	if err := os.Rename(filepath.Join(f.Dir(), "moved"), filepath.Join(f.Dir(), "d", "moved")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(f.Dir(), "doomed")); err != nil {
		t.Fatal(err)
	}
	cut(t, f)
	for name, want := range map[string]string{
		"d/new": "", "d/moved": "synced before", "moved": "(none)", "doomed": "(none)",
	} {
		if got := readFile(t, filepath.Join(backing, name)); got != want {
			t.Errorf("%s after the cut: got %q, want %q", name, got, want)
		}
	}
}

// Reads see the pending writes and truncates at their size, through a new descriptor too (a
// new lookup, which go-fuse answers with a reused node).
func TestReadsSeePendingChanges(t *testing.T) {
	backing := t.TempDir()
	f := Mount(t, backing)
	path := filepath.Join(f.Dir(), "f")
	data := bytes.Repeat([]byte("0123456789"), 1000)
	writeFile(t, path, string(data))
	if st, err := os.Stat(path); err != nil || st.Size() != int64(len(data)) {
		t.Fatalf("stat after a write: got %v, %v, want size %d", st, err, len(data))
	}
	if got := readFile(t, path); got != string(data) {
		t.Fatalf("read after reopening: got %d bytes, want the %d written", len(got), len(data))
	}
	// A truncate down and a write past the end: the gap reads as zeros.
	if err := os.Truncate(path, 100); err != nil {
		t.Fatal(err)
	}
	file, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	if _, err := file.WriteAt([]byte("end"), 6000); err != nil {
		t.Fatal(err)
	}
	want := string(data[:100]) + string(make([]byte, 5900)) + "end"
	if got := readFile(t, path); got != want {
		t.Fatalf("read after truncate and write: got %d bytes, want %d", len(got), len(want))
	}
	if got := readFile(t, filepath.Join(backing, "f")); got != "" {
		t.Fatalf("backing file before the sync: got %d bytes, want none", len(got))
	}
	if err := file.Sync(); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(backing, "f")); got != want {
		t.Fatalf("backing file after the sync: got %d bytes, want %d", len(got), len(want))
	}
}

func TestCloseWritesEverythingBack(t *testing.T) {
	backing := t.TempDir()
	writeFile(t, filepath.Join(backing, "shrunk"), "long content on the disk")
	f := Mount(t, backing)
	writeFile(t, filepath.Join(f.Dir(), "new"), "never synced")
	if err := os.Truncate(filepath.Join(f.Dir(), "shrunk"), 4); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"new": "never synced", "shrunk": "long"} {
		if got := readFile(t, filepath.Join(backing, name)); got != want {
			t.Errorf("%s after a clean unmount: got %q, want %q", name, got, want)
		}
	}
	g := Mount(t, backing)
	if got := readFile(t, filepath.Join(g.Dir(), "new")); got != "never synced" {
		t.Errorf("through the next mount: got %q, want %q", got, "never synced")
	}
}

func TestOperationsAfterTheCutFailWithEIO(t *testing.T) {
	backing := t.TempDir()
	f := Mount(t, backing)
	file, err := os.OpenFile(filepath.Join(f.Dir(), "f"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	dir, err := os.Open(f.Dir())
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	cut(t, f)
	ops := map[string]func() error{
		"write":     func() error { _, err := file.Write([]byte("late")); return err },
		"read":      func() error { _, err := file.ReadAt(make([]byte, 1), 0); return err },
		"fsync":     file.Sync,
		"fstat":     func() error { _, err := file.Stat(); return err },
		"dir fsync": dir.Sync,
		"create": func() error {
			_, err := os.Create(fmt.Sprintf("/proc/self/fd/%d/new", dir.Fd()))
			return err
		},
	}
	for name, op := range ops {
		if err := op(); !errors.Is(err, syscall.EIO) {
			t.Errorf("%s after the cut: got %v, want EIO", name, err)
		}
	}
	if got := readFile(t, filepath.Join(backing, "new")); got != "(none)" {
		t.Errorf("a create after the cut reached the disk: %q", got)
	}
}

func TestCutMountsAgain(t *testing.T) {
	backing := t.TempDir()
	f := Mount(t, backing)
	if _, err := New(backing, t.TempDir()); err == nil {
		t.Fatal("a second mount of a mounted backing directory: got no error")
	}
	file, err := os.OpenFile(filepath.Join(f.Dir(), "f"), os.O_WRONLY|os.O_CREATE|syscall.O_DSYNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := file.WriteString("synced"); err != nil {
		t.Fatal(err)
	}
	cut(t, f)
	file.Close()
	if err := f.Cut(); err == nil {
		t.Error("a second cut: got no error")
	}
	g := Mount(t, backing)
	if got := readFile(t, filepath.Join(g.Dir(), "f")); got != "synced" {
		t.Errorf("through the mount after the cut: got %q, want %q", got, "synced")
	}
}

// An unlinked file's pending writes are kept while it is open, and dropped with its last handle.
func TestUnlinkedFilesLeaveNothingPending(t *testing.T) {
	f := Mount(t, t.TempDir())
	path := filepath.Join(f.Dir(), "f")
	file, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := file.WriteString("pending"); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 7)
	if _, err := file.ReadAt(b, 0); err != nil || string(b) != "pending" {
		t.Fatalf("read of the open unlinked file: got %q, %v, want %q", b, err, "pending")
	}
	file.Close()
	checkFor(t, 5*time.Second, time.Millisecond, func() error { // the kernel releases in the background
		f.mu.Lock()
		defer f.mu.Unlock()
		if len(f.files) != 0 {
			return fmt.Errorf("%d files with pending state, want none", len(f.files))
		}
		return nil
	})
}

// BenchmarkSyncedWrite appends 512 bytes with O_DSYNC to a file on the backing directory's
// disk and to one through the mount, in turns, so that both see the same load, and reports the
// time of each and their ratio: the package doc states them.
func BenchmarkSyncedWrite(b *testing.B) {
	open := func(dir string) *os.File {
		file, err := os.OpenFile(filepath.Join(dir, "f"), os.O_WRONLY|os.O_CREATE|syscall.O_DSYNC, 0o644)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { file.Close() })
		return file
	}
	direct, mounted := open(b.TempDir()), open(Mount(b, b.TempDir()).Dir())
	record := bytes.Repeat([]byte{'x'}, 512)
	var took [2]time.Duration
	for b.Loop() {
		for i, file := range []*os.File{direct, mounted} {
			start := time.Now()
			if _, err := file.Write(record); err != nil {
				b.Fatal(err)
			}
			took[i] += time.Since(start)
		}
	}
	b.ReportMetric(float64(took[0].Nanoseconds())/float64(b.N), "direct-ns/write")
	b.ReportMetric(float64(took[1].Nanoseconds())/float64(b.N), "mount-ns/write")
	b.ReportMetric(float64(took[1])/float64(took[0]), "mount/direct")
}
