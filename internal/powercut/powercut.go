package powercut

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// FS is a power-cut file system mounted over a backing directory (see the package doc).
type FS struct {
	backing string // the disk
	dir     string // where it is mounted
	server  *fuse.Server
	served  chan struct{} // closed when the server has stopped
	conn    string        // the FUSE connection's id under fusectl, if known

	// life is held to read by every operation and to write by Cut and Close, so that a cut
	// falls between operations, never inside one.
	life sync.RWMutex
	dead bool // cut or closed: every operation fails with EIO

	mu    sync.Mutex
	files map[uint64]*pending // by backing inode (go-fuse's stable inode number)
	opens map[uint64]int      // open handles, by backing inode
	pids  map[int]string      // registered with Track: pid to its start time
}

var (
	servingMu sync.Mutex
	serving   = map[string]bool{} // backing directories mounted and not yet cut or closed
)

// New mounts a power-cut file system over backing at dir, an empty directory. It needs root
// and /dev/fuse. Tests call Mount instead.
func New(backing, dir string) (*FS, error) {
	var err error
	if backing, err = filepath.EvalSymlinks(backing); err != nil {
		return nil, fmt.Errorf("powercut: backing directory: %w", err)
	}
	if dir, err = filepath.EvalSymlinks(dir); err != nil {
		return nil, fmt.Errorf("powercut: mount point: %w", err)
	}
	servingMu.Lock()
	defer servingMu.Unlock()
	if serving[backing] {
		return nil, fmt.Errorf("powercut: %s is already mounted", backing)
	}
	sweep()
	root, err := fs.NewLoopbackRoot(backing)
	if err != nil {
		return nil, fmt.Errorf("powercut: backing directory: %w", err)
	}
	f := &FS{backing: backing, dir: dir,
		files: map[uint64]*pending{}, opens: map[uint64]int{}, pids: map[int]string{}}
	n := &node{LoopbackNode: root.(*fs.LoopbackNode), pc: f}
	n.RootData.RootNode = n
	f.server, err = fs.Mount(dir, n, &fs.Options{MountOptions: fuse.MountOptions{
		DirectMountStrict: true, AllowOther: true, Name: "powercut", FsName: backing,
	}})
	if err != nil {
		return nil, fmt.Errorf("powercut: mount %s at %s: %w", backing, dir, err)
	}
	serving[backing] = true
	f.served = make(chan struct{})
	go func() {
		f.server.Wait()
		close(f.served)
	}()
	f.guard()
	return f, nil
}

// Dir returns where the file system is mounted.
func (f *FS) Dir() string { return f.dir }

// Track registers a process that Cut must stop and kill even if it has nothing of the mount
// open yet (a child about to open its files). The process's start time is recorded, so that a
// pid reused by another process is left alone.
func (f *FS) Track(pid int) error {
	start, err := startTime(pid)
	if err != nil {
		return fmt.Errorf("powercut: track %d: %w", pid, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pids[pid] = start
	return nil
}

// Cut cuts the power: it stops (SIGSTOP) every other process that uses the mount (an open file,
// a mapping, its working directory or root inside it) and every tracked one, throws away every
// write not yet synced, kills those processes (SIGKILL) and unmounts. The backing directory is
// left as a disk would be when the power comes back; New mounts it again. Operations that
// still reach this mount, from this process, fail with EIO.
func (f *FS) Cut() error {
	if !f.enter() {
		return errEnded
	}
	f.leave()
	stopped, stopErr := f.stop()
	if err := f.end(false); err != nil {
		return err
	}
	return errors.Join(stopErr, kill(stopped), f.unmount())
}

// Close writes every pending change back to the backing directory, as a clean shutdown
// would, and unmounts. After a Cut it does nothing.
func (f *FS) Close() error {
	err := f.end(true)
	if errors.Is(err, errEnded) {
		return nil
	}
	return errors.Join(err, f.unmount())
}

var errEnded = errors.New("powercut: already cut or closed")

// end ends the file system's life between two operations: it writes the pending changes back
// (keep) or throws them away, and makes every later operation fail with EIO.
func (f *FS) end(keep bool) error {
	f.life.Lock()
	defer f.life.Unlock()
	if f.dead {
		return errEnded
	}
	f.dead = true
	f.mu.Lock()
	files := f.files
	f.files = map[uint64]*pending{}
	f.mu.Unlock()
	var errs []error
	for _, p := range files {
		p.mu.Lock()
		if keep {
			errs = append(errs, p.sync(false))
		}
		p.gone = true
		errs = append(errs, p.fd.Close())
		p.mu.Unlock()
	}
	servingMu.Lock()
	delete(serving, f.backing)
	servingMu.Unlock()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("powercut: write back: %w", err)
	}
	return nil
}

// enter starts an operation; it reports false, and the operation fails with EIO, after the end.
func (f *FS) enter() bool {
	f.life.RLock()
	if f.dead {
		f.life.RUnlock()
		return false
	}
	return true
}

func (f *FS) leave() { f.life.RUnlock() }

// with runs fn on the pending state of the backing inode ino, under its lock. Without pending
// state, fn gets nil, unless open is given: then the state is made, over the file open returns.
func (f *FS) with(ino uint64, open func() (*os.File, error), fn func(*pending) error) error {
	for {
		f.mu.Lock()
		p := f.files[ino]
		if p == nil && open != nil {
			fd, err := open()
			if err == nil {
				if p, err = newPending(fd); err != nil {
					fd.Close()
				}
			}
			if err != nil {
				f.mu.Unlock()
				return err
			}
			f.files[ino] = p
		}
		f.mu.Unlock()
		if p == nil {
			return fn(nil)
		}
		p.mu.Lock()
		if p.gone {
			p.mu.Unlock()
			continue
		}
		err := fn(p)
		p.mu.Unlock()
		return err
	}
}

// flush syncs p, the pending state of ino, to the backing file and forgets it. p is locked.
func (f *FS) flush(ino uint64, p *pending, datasync bool) error {
	if err := p.sync(datasync); err != nil {
		return err
	}
	f.forget(ino, p)
	return nil
}

// forget drops p, the pending state of ino. p is locked.
func (f *FS) forget(ino uint64, p *pending) {
	f.mu.Lock()
	if f.files[ino] == p {
		delete(f.files, ino)
	}
	f.mu.Unlock()
	p.gone = true
	p.fd.Close()
}

// size returns the size of ino with its pending changes; backing is its size on the backing
// directory.
func (f *FS) size(ino, backing uint64) uint64 {
	f.with(ino, nil, func(p *pending) error {
		if p != nil {
			backing = uint64(p.size)
		}
		return nil
	})
	return backing
}

func (f *FS) opened(ino uint64) {
	f.mu.Lock()
	f.opens[ino]++
	f.mu.Unlock()
}

// closed counts a handle of ino released, and reaps ino's pending state if that was its last.
func (f *FS) closed(ino uint64) {
	f.mu.Lock()
	f.opens[ino]--
	if f.opens[ino] > 0 {
		f.mu.Unlock()
		return
	}
	delete(f.opens, ino)
	f.mu.Unlock()
	f.reap(ino)
}

// reap drops the pending state of the given inodes (all when none are given) that are open
// nowhere and have no name left: the file is gone, and so are its unsynced writes.
func (f *FS) reap(inos ...uint64) {
	f.mu.Lock()
	if len(inos) == 0 {
		for ino := range f.files {
			inos = append(inos, ino)
		}
	}
	var idle []uint64
	for _, ino := range inos {
		if f.opens[ino] == 0 && f.files[ino] != nil {
			idle = append(idle, ino)
		}
	}
	f.mu.Unlock()
	for _, ino := range idle {
		f.with(ino, nil, func(p *pending) error {
			var st syscall.Stat_t
			if p != nil && syscall.Fstat(int(p.fd.Fd()), &st) == nil && st.Nlink == 0 {
				f.forget(ino, p)
			}
			return nil
		})
	}
}
