package powercut

import (
	"errors"
	"io"
	"maps"
	"os"
	"slices"
	"sync"

	"golang.org/x/sys/unix"
)

// pageSize is the unit in which pending writes are kept.
const pageSize = 4096

// pending is what the writes and truncates since a file's last sync made of it, kept in memory
// over the backing file: the pages they touched (whole, as they read now), the size they give
// it, and the floor, the lowest size a pending truncate cut it to. Bytes of the backing file at
// or past the floor are cut off: they read as zero unless a pending page covers them. Page bytes
// past size are always zero, so a truncate that extends the file reads zeros.
type pending struct {
	mu    sync.Mutex
	gone  bool     // synced or dropped, and out of the FS's map: look it up again
	fd    *os.File // the backing file, open read-write; holding it keeps the inode number from reuse
	size  int64
	floor int64
	pages map[int64][]byte // by page index
}

func newPending(fd *os.File) (*pending, error) {
	st, err := fd.Stat()
	if err != nil {
		return nil, err
	}
	return &pending{fd: fd, size: st.Size(), floor: st.Size(), pages: map[int64][]byte{}}, nil
}

// page returns page i as it reads now, reading it from the backing file the first time.
func (p *pending) page(i int64) ([]byte, error) {
	if pg, ok := p.pages[i]; ok {
		return pg, nil
	}
	pg := make([]byte, pageSize)
	if n := min(pageSize, p.floor-i*pageSize); n > 0 {
		if _, err := p.fd.ReadAt(pg[:n], i*pageSize); err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
	}
	p.pages[i] = pg
	return pg, nil
}

func (p *pending) write(data []byte, off int64) error {
	end := off + int64(len(data))
	for len(data) > 0 {
		pg, err := p.page(off / pageSize)
		if err != nil {
			return err
		}
		n := copy(pg[off%pageSize:], data)
		data, off = data[n:], off+int64(n)
	}
	p.size = max(p.size, end)
	return nil
}

func (p *pending) truncate(size int64) {
	p.floor = min(p.floor, size)
	for i := range p.pages {
		if i*pageSize >= size {
			delete(p.pages, i)
		}
	}
	if pg, ok := p.pages[size/pageSize]; ok {
		clear(pg[size%pageSize:])
	}
	p.size = size
}

// read reads the file as it is now: the backing file below the floor, zeros above it, and the
// pending pages over both.
func (p *pending) read(buf []byte, off int64) (int, error) {
	if off >= p.size {
		return 0, nil
	}
	buf = buf[:min(int64(len(buf)), p.size-off)]
	clear(buf)
	if n := min(int64(len(buf)), p.floor-off); n > 0 {
		if _, err := p.fd.ReadAt(buf[:n], off); err != nil && !errors.Is(err, io.EOF) {
			return 0, err
		}
	}
	for done := 0; done < len(buf); {
		pos := off + int64(done)
		n := min(pageSize-int(pos%pageSize), len(buf)-done)
		if pg, ok := p.pages[pos/pageSize]; ok {
			copy(buf[done:done+n], pg[pos%pageSize:])
		}
		done += n
	}
	return len(buf), nil
}

// sync writes the pending state to the backing file and syncs it there (a real fsync, so a
// synced write through the mount costs what it costs on the disk, plus FUSE's round trips).
func (p *pending) sync(datasync bool) error {
	st, err := p.fd.Stat()
	if err != nil {
		return err
	}
	if p.floor < st.Size() {
		if err := p.fd.Truncate(p.floor); err != nil {
			return err
		}
	}
	end := min(st.Size(), p.floor) // the backing file's size as the writes below leave it
	for _, i := range slices.Sorted(maps.Keys(p.pages)) {
		pg := p.pages[i][:min(pageSize, p.size-i*pageSize)]
		if _, err := p.fd.WriteAt(pg, i*pageSize); err != nil {
			return err
		}
		end = max(end, i*pageSize+int64(len(pg)))
	}
	if end != p.size {
		if err := p.fd.Truncate(p.size); err != nil {
			return err
		}
	}
	return syncFile(p.fd, datasync)
}

func syncFile(f *os.File, datasync bool) error {
	if datasync {
		return unix.Fdatasync(int(f.Fd()))
	}
	return f.Sync()
}
