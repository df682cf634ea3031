// Package powercut is test support: a FUSE file system over a real backing directory that
// loses, at a power cut, every write not yet synced, in the spirit of Jepsen's LazyFS. Tests
// mount it with Mount, run the code under test on it, call Cut, and mount the backing directory
// again to see what a restart after a power failure would see.
//
// What it models:
//   - File data is the disk's only once synced. Writes and truncates (truncate, ftruncate,
//     O_TRUNC) are kept in memory, per backing inode, until fsync or fdatasync of any
//     descriptor of the file, or a write on a file opened O_SYNC or O_DSYNC (the kernel
//     follows each such write with an fsync of its own). Reads, and the size that stat and
//     lookups report, see the pending changes, through every descriptor.
//   - A sync writes all of the file's pending changes back and then fsyncs the backing file
//     for real, so a synced write costs what it costs on the disk, plus FUSE's round trips.
//   - Cut stops (SIGSTOP) every other process that uses the mount (an open file, a mapping,
//     its working directory or root inside it) and every process registered with Track, throws
//     away every pending change, kills (SIGKILL) those processes and unmounts. The backing
//     directory is then what a disk holds when the power comes back, and New or Mount serves
//     it again. Every operation that still reaches the old mount fails with EIO.
//   - This process cannot be killed by its own Cut. An embedded server (nats-server) that runs
//     on the mount is cut by what a test can do: after Cut it gets EIO for everything, so
//     nothing it does afterwards reaches the disk, and the test shuts it down; only what it
//     acknowledged before Cut began counts.
//   - Close, a clean unmount, writes every pending change back first.
//
// What it does not model:
//   - Metadata is kinder than ext4's: creates, mkdirs, renames, unlinks, links, modes and times
//     reach the disk at once, without a directory fsync (which is served, as a real fsync of
//     the backing directory). So a cut never loses a name, only the data behind it: the model
//     is strict about data, not about metadata.
//   - Data is stricter than a real kernel's: nothing unsynced survives, where a kernel writes
//     back after about 30 seconds and may persist part of what was pending, in any order.
//     There are no torn writes within a page and no reordering of synced writes: a sync is
//     atomic with respect to a cut, and a file's pending changes go back together (an O_DSYNC
//     write on Linux promises only its own range).
//   - Not served: O_TMPFILE and fallocate (EOPNOTSUPP), statx (the kernel falls back to
//     getattr), copy_file_range (the kernel falls back to reads and writes), POSIX and BSD locks
//     (the kernel keeps them locally), FUSE passthrough. Shared writable mappings are untested.
//
// Serving a mount and using it from one process has two hazards. A process killed while one of
// its threads waits on a request its own server had read cannot finish dying (nor, at any exit,
// while the kernel flushes its open files, which is why files are opened with FOPEN_NOFLUSH): a
// watchdog child process aborts the connection then (via fusectl, which New mounts if it
// must), and the next New detaches the dead mount. And Go starts a child with vfork: the child's chdir to Cmd.Dir,
// or its exec of a binary, inside the mount needs this process's server while the runtime may
// be stopping the world for the collector, which waits for the vfork to end: a deadlock. Never
// set Cmd.Dir inside the mount, nor run a binary kept there; let the child change directory
// itself (sh -c 'cd "$0" && exec ...').
//
// Cost: a synced 512-byte write through the mount takes 1.3-2.1 times as long as one on the
// disk (BenchmarkSyncedWrite; the figures are in
// docs/decisions/2026-12-04-power-cut-file-system.md).
//
// Tests that cannot mount (not root, no /dev/fuse) skip with the reason, or fail when
// AUTHPLANE_REQUIRE_FUSE=1, as .ci/run sets.
package powercut
