package powercut

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// node is go-fuse's loopback node with the power cut put in: file data goes through handle,
// sizes come from the pending state, every operation fails with EIO after the end, and the rest
// (directory entries, renames, unlinks, modes, times) goes to the backing directory at once.
type node struct {
	*fs.LoopbackNode
	pc *FS
}

// fsyncData is FUSE_FSYNC_FDATASYNC, the flag of an fdatasync.
const fsyncData = 1

// WrapChild makes every node of the tree a node.
func (n *node) WrapChild(ctx context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	return &node{LoopbackNode: ops.(*fs.LoopbackNode), pc: n.pc}
}

// guard runs op unless the file system has ended, when it fails with EIO.
func guard[T any](f *FS, op func() (T, syscall.Errno)) (T, syscall.Errno) {
	if !f.enter() {
		var zero T
		return zero, syscall.EIO
	}
	defer f.leave()
	return op()
}

// guard0 is guard for an operation that returns only an errno.
func guard0(f *FS, op func() syscall.Errno) syscall.Errno {
	_, errno := guard(f, func() (struct{}, syscall.Errno) { return struct{}{}, op() })
	return errno
}

func (n *node) ino() uint64 { return n.StableAttr().Ino }

func (n *node) backingPath() string { return filepath.Join(n.RootData.Path, n.Path(nil)) }

// Open and Create hand out a handle over their own descriptor of the backing file. An O_TRUNC
// is kept pending like any truncate.
func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	h, errno := guard(n.pc, func() (*handle, syscall.Errno) {
		fh, _, errno := n.LoopbackNode.Open(ctx, flags&^(syscall.O_TRUNC|syscall.O_DIRECT))
		if errno != 0 {
			return nil, errno
		}
		return n.pc.adopt(ctx, fh, n.ino(), flags)
	})
	if errno != 0 {
		return nil, 0, errno
	}
	return h, noFlush, 0
}

// noFlush asks the kernel not to send a FLUSH when a descriptor is closed: there is nothing to
// flush, and a process that serves its own mount and is killed would wait forever on the FLUSH
// of its files' last close, which its dead threads cannot answer.
const noFlush = fuse.FOPEN_NOFLUSH

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	var h *handle
	ch, errno := guard(n.pc, func() (*fs.Inode, syscall.Errno) {
		ch, fh, _, errno := n.LoopbackNode.Create(ctx, name, flags&^(syscall.O_TRUNC|syscall.O_DIRECT), mode, out)
		if errno != 0 {
			return nil, errno
		}
		if h, errno = n.pc.adopt(ctx, fh, ch.StableAttr().Ino, flags); errno != 0 {
			return nil, errno
		}
		out.Attr.Size = n.pc.size(h.ino, out.Attr.Size)
		return ch, 0
	})
	if errno != 0 {
		return nil, nil, 0, errno
	}
	return ch, h, noFlush, 0
}

// adopt makes a handle of the loopback's handle fh of backing inode ino, opened with flags.
func (f *FS) adopt(ctx context.Context, fh fs.FileHandle, ino uint64, flags uint32) (*handle, syscall.Errno) {
	lf := fh.(*fs.LoopbackFile)
	defer lf.Release(ctx)
	fd, _ := lf.PassthroughFd() // the loopback's descriptor, not a passthrough: we take a copy
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fs.ToErrno(err)
	}
	h := &handle{f: os.NewFile(uintptr(dup), ""), ino: ino, pc: f}
	f.opened(ino)
	if flags&syscall.O_TRUNC != 0 {
		if errno := h.truncate(0); errno != 0 {
			h.Release(ctx)
			return nil, errno
		}
	}
	return h, 0
}

// Getattr, Setattr and Lookup report the size with the pending changes; Setattr keeps a size
// change pending and applies the rest at once.
func (n *node) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	return guard0(n.pc, func() syscall.Errno {
		if errno := n.LoopbackNode.Getattr(ctx, loopbackOf(f), out); errno != 0 {
			return errno
		}
		out.Size = n.pc.size(n.ino(), out.Size)
		return 0
	})
}

func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	return guard0(n.pc, func() syscall.Errno {
		if size, ok := in.GetSize(); ok {
			open := func() (*os.File, error) { return os.OpenFile(n.backingPath(), os.O_RDWR, 0) }
			if h, ok := f.(*handle); ok {
				open = h.reopen
			}
			if err := n.pc.with(n.ino(), open, func(p *pending) error {
				p.truncate(int64(size))
				return nil
			}); err != nil {
				return fs.ToErrno(err)
			}
			in.Valid &^= fuse.FATTR_SIZE
		}
		if errno := n.LoopbackNode.Setattr(ctx, loopbackOf(f), in, out); errno != 0 {
			return errno
		}
		out.Size = n.pc.size(n.ino(), out.Size)
		return 0
	})
}

// loopbackOf lends the loopback's file methods (fstat, fchmod, futimens) a handle's
// descriptor, so they work on unlinked files too. It must not be released.
func loopbackOf(f fs.FileHandle) fs.FileHandle {
	if h, ok := f.(*handle); ok {
		return fs.NewLoopbackFileFromOS(h.f)
	}
	return nil
}

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return guard(n.pc, func() (*fs.Inode, syscall.Errno) {
		ch, errno := n.LoopbackNode.Lookup(ctx, name, out)
		if errno == 0 {
			out.Attr.Size = n.pc.size(ch.StableAttr().Ino, out.Attr.Size)
		}
		return ch, errno
	})
}

func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return guard(n.pc, func() (*fs.Inode, syscall.Errno) {
		ch, errno := n.LoopbackNode.Link(ctx, target, name, out)
		if errno == 0 {
			out.Attr.Size = n.pc.size(ch.StableAttr().Ino, out.Attr.Size)
		}
		return ch, errno
	})
}

// Fsync syncs a file (fsync, fdatasync) or a directory. A file's pending state is written back
// and synced; with none, the backing file is synced all the same, so the cost is a real one.
func (n *node) Fsync(ctx context.Context, f fs.FileHandle, flags uint32) syscall.Errno {
	return guard0(n.pc, func() syscall.Errno {
		datasync := flags&fsyncData != 0
		if h, ok := f.(*handle); ok {
			return fs.ToErrno(h.fsync(datasync))
		}
		return fs.ToErrno(n.pc.with(n.ino(), nil, func(p *pending) error { // a directory
			if p != nil {
				return n.pc.flush(n.ino(), p, datasync)
			}
			d, err := os.Open(n.backingPath())
			if err != nil {
				return err
			}
			defer d.Close()
			return syncFile(d, datasync)
		}))
	})
}

// The rest pass through to the loopback, which acts on the backing directory at once.

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	return guard0(n.pc, func() syscall.Errno {
		defer n.pc.reap()
		return n.LoopbackNode.Unlink(ctx, name)
	})
}

func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	return guard0(n.pc, func() syscall.Errno {
		defer n.pc.reap()
		return n.LoopbackNode.Rename(ctx, name, newParent, newName, flags)
	})
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	return guard0(n.pc, func() syscall.Errno { return n.LoopbackNode.Rmdir(ctx, name) })
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return guard(n.pc, func() (*fs.Inode, syscall.Errno) { return n.LoopbackNode.Mkdir(ctx, name, mode, out) })
}

func (n *node) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return guard(n.pc, func() (*fs.Inode, syscall.Errno) { return n.LoopbackNode.Mknod(ctx, name, mode, rdev, out) })
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return guard(n.pc, func() (*fs.Inode, syscall.Errno) { return n.LoopbackNode.Symlink(ctx, target, name, out) })
}

func (n *node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	return guard(n.pc, func() ([]byte, syscall.Errno) { return n.LoopbackNode.Readlink(ctx) })
}

func (n *node) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	return guard(n.pc, func() (fs.DirStream, syscall.Errno) { return n.LoopbackNode.Readdir(ctx) })
}

func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	d, errno := guard(n.pc, func() (fs.FileHandle, syscall.Errno) {
		d, _, errno := n.LoopbackNode.OpendirHandle(ctx, flags)
		return d, errno
	})
	if errno != 0 {
		return nil, 0, errno
	}
	return &dirHandle{d: d.(dirStream), pc: n.pc}, 0, 0
}

func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	return guard0(n.pc, func() syscall.Errno { return n.LoopbackNode.Statfs(ctx, out) })
}

func (n *node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	return guard(n.pc, func() (uint32, syscall.Errno) { return n.LoopbackNode.Getxattr(ctx, attr, dest) })
}

func (n *node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	return guard(n.pc, func() (uint32, syscall.Errno) { return n.LoopbackNode.Listxattr(ctx, dest) })
}

func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	return guard0(n.pc, func() syscall.Errno { return n.LoopbackNode.Setxattr(ctx, attr, data, flags) })
}

func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	return guard0(n.pc, func() syscall.Errno { return n.LoopbackNode.Removexattr(ctx, attr) })
}

// Not served, so that no data reaches the backing directory around the pending state: statx
// (the kernel falls back to getattr), O_TMPFILE, and copy_file_range (the kernel falls back to
// reads and writes).

func (n *node) Statx(context.Context, fs.FileHandle, uint32, uint32, *fuse.StatxOut) syscall.Errno {
	return syscall.ENOSYS
}

func (n *node) Tmpfile(context.Context, uint32, uint32, *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, syscall.EOPNOTSUPP
}

func (n *node) CopyFileRange(context.Context, fs.FileHandle, uint64, *fs.Inode, fs.FileHandle, uint64, uint64, uint64) (uint32, syscall.Errno) {
	return 0, syscall.EOPNOTSUPP
}

// handle is an open file: a descriptor of the backing file, through which reads see the
// pending state and writes add to it. A write on a file opened O_SYNC or O_DSYNC needs nothing
// more: the kernel follows each with an fsync or fdatasync of its own (generic_write_sync).
type handle struct {
	f   *os.File
	ino uint64
	pc  *FS
}

// reopen opens the handle's backing file again, read-write, for pending state to hold.
func (h *handle) reopen() (*os.File, error) {
	return os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", h.f.Fd()), os.O_RDWR, 0)
}

func (h *handle) Read(ctx context.Context, buf []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	return guard(h.pc, func() (fuse.ReadResult, syscall.Errno) {
		var n int
		err := h.pc.with(h.ino, nil, func(p *pending) (err error) {
			if p != nil {
				n, err = p.read(buf, off)
				return err
			}
			if n, err = h.f.ReadAt(buf, off); errors.Is(err, io.EOF) {
				err = nil
			}
			return err
		})
		if err != nil {
			return nil, fs.ToErrno(err)
		}
		return fuse.ReadResultData(buf[:n]), 0
	})
}

// Writev serves every write; go-fuse hands Write only unsplit ones.
func (h *handle) Writev(ctx context.Context, data [][]byte, off int64) (uint32, syscall.Errno) {
	return guard(h.pc, func() (uint32, syscall.Errno) {
		var all []byte
		for _, d := range data {
			all = append(all, d...)
		}
		err := h.pc.with(h.ino, h.reopen, func(p *pending) error { return p.write(all, off) })
		if err != nil {
			return 0, fs.ToErrno(err)
		}
		return uint32(len(all)), 0
	})
}

func (h *handle) truncate(size int64) syscall.Errno {
	return fs.ToErrno(h.pc.with(h.ino, h.reopen, func(p *pending) error {
		p.truncate(size)
		return nil
	}))
}

func (h *handle) fsync(datasync bool) error {
	return h.pc.with(h.ino, nil, func(p *pending) error {
		if p == nil {
			return syncFile(h.f, datasync)
		}
		return h.pc.flush(h.ino, p, datasync)
	})
}

// Release closes the handle, at any time: it is no operation on the disk.
func (h *handle) Release(ctx context.Context) syscall.Errno {
	err := h.f.Close()
	h.pc.closed(h.ino)
	return fs.ToErrno(err)
}

// dirStream is what the loopback's directory handle does.
type dirStream interface {
	fs.FileReaddirenter
	fs.FileSeekdirer
	fs.FileReleasedirer
	fs.FileFsyncdirer
}

// dirHandle is the loopback's directory handle, failing with EIO after the end.
type dirHandle struct {
	d  dirStream
	pc *FS
}

func (d *dirHandle) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	return guard(d.pc, func() (*fuse.DirEntry, syscall.Errno) { return d.d.Readdirent(ctx) })
}

func (d *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	return guard0(d.pc, func() syscall.Errno { return d.d.Seekdir(ctx, off) })
}

func (d *dirHandle) Fsyncdir(ctx context.Context, flags uint32) syscall.Errno {
	return guard0(d.pc, func() syscall.Errno { return d.d.Fsyncdir(ctx, flags) })
}

func (d *dirHandle) Releasedir(ctx context.Context, flags uint32) { d.d.Releasedir(ctx, flags) }
