package space

// The plane's files are written safely: atomically, private by default, never half written.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Private is the mode of every file that holds a secret or process state.
const Private os.FileMode = 0o600

// privateDir is the mode of every directory the plane creates.
const privateDir os.FileMode = 0o700

// WriteAtomic writes data to path with mode perm through a temporary file in the same
// directory, synced and renamed into place, so a reader sees the old file or the new one; the
// directory is synced too, so the new one survives a power cut once WriteAtomic returns.
func WriteAtomic(path string, data []byte, perm os.FileMode) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			err = fmt.Errorf("write %s: %w", path, errors.Join(err, os.Remove(tmp)))
		}
	}()
	if err := f.Chmod(perm); err != nil {
		return errors.Join(err, f.Close())
	}
	if _, err := f.Write(data); err != nil {
		return errors.Join(err, f.Close())
	}
	if err := f.Sync(); err != nil {
		return errors.Join(err, f.Close())
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	return syncDir(filepath.Dir(path))
}

// syncDir syncs dir, so an entry renamed into it is on disk.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}

// EnsureDir creates dir (and its parents) with mode privateDir if it does not exist.
func EnsureDir(dir string) error {
	if err := os.MkdirAll(dir, privateDir); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	return nil
}

// SyncDir syncs directory dir, so the files renamed or created in it are there after an OS
// crash or a power cut (WriteAtomic syncs a file's data, not its name).
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	if err := errors.Join(d.Sync(), d.Close()); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}
