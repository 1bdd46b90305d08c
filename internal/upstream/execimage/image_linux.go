package execimage

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// With StdioSpec.Sealed a child does not execute the file itself but a
// sealed copy in memory (a memfd that nobody, the child included, can
// write, grow or shrink), and the digest recorded and compared with the pin
// is the digest of that copy's bytes, read back after sealing: a file
// rewritten in place, even while a "#!" script runs, cannot change what the
// child runs. The program sees the memfd as its own path, which
// interpreters cannot work with, so this is for static binaries.
//
// Measure once: copying and hashing a large binary on every spawn would
// cost time and memory (a 12 MB server took milliseconds of the gateway's
// CPU per new session), so the last sealed copy of each resolved path is
// kept, with what the file on disk was when it was measured (device,
// inode, size, modification and status change times: FileKey). A spawn
// stats the path: if the file is still that one, unchanged, the kept copy
// is executed without reading the file or hashing anything. Otherwise the
// file is measured again: hashed on disk, and the kept copy executed only
// when its digest is that hash (the same bytes); a file whose digest
// changed is copied and sealed again, replacing the kept copy, and its
// digest is what the pin is compared with (a changed file is refused as it
// always was). What runs is the copy's bytes either way: the stat decides
// only whether a changed file is noticed before the spawn.
//
// A file's times move with every write, but only at the file system's
// granularity (a clock tick, a second on some), so a file changed less
// than StampMargin before it was measured, or changed while it was, is not
// taken as unchanged by its stat: it is measured again at the next spawn.
// A write through a shared writable mapping on tmpfs moves no time at all:
// the copy still runs the bytes measured, but such a change is noticed
// only once something else changes the file's stat.

// maxImages bounds how many resolved paths keep a sealed copy; the least
// recently used is dropped first (its running children keep their own).
const maxImages = 16

// StampMargin is how long before its measurement a file must have last
// changed for its stat to stand for its bytes at later spawns.
var StampMargin = 2 * time.Second

// Measures counts the files Sealed read and hashed (tests).
var Measures atomic.Int64

// images is the process's cache of sealed copies, shared by every upstream
// (two upstreams running node share one copy of it).
var images = &imageCache{m: map[string]*image{}}

type imageCache struct {
	mu   sync.Mutex
	m    map[string]*image // by resolved path
	tick uint64
}

type image struct {
	f    *os.File // sealed memfd, owned by the cache
	d    digest.Digest
	used uint64
	// key is the file on disk when it was last measured, and keyed says
	// it may stand for the bytes at the next spawn (see StampMargin).
	key   FileKey
	keyed bool
}

// MemfdCreate is unix.MemfdCreate; tests replace it to see a refusal.
var MemfdCreate = unix.MemfdCreate

// TestHookBeforeSealedCopy, if set, runs after the file is opened (and,
// if a copy of its path is kept, hashed) and before it is copied into the
// memfd, which measures it.
var TestHookBeforeSealedCopy func(path string)

// Hint says what an operator can do about a SealError.
func (e *SealError) Hint() string {
	h := "sealed: true runs a stdio server from a sealed in-memory copy of the measured file (memfd_create with sealing, Linux 3.17 or later)"
	switch {
	case errors.Is(e.err, unix.EACCES) && e.op == "memfd_create":
		v, _ := os.ReadFile("/proc/sys/vm/memfd_noexec")
		h += fmt.Sprintf("; this kernel refuses executable memfds (vm.memfd_noexec = %s): set it to 0 or 1 for the gateway's PID namespace", strings.TrimSpace(string(v)))
	case errors.Is(e.err, unix.ENOSYS), errors.Is(e.err, unix.EPERM):
		h += "; allow memfd_create and fcntl F_ADD_SEALS in the gateway's seccomp profile, or run it on a kernel that has them"
	case errors.Is(e.err, unix.ENOMEM), errors.Is(e.err, unix.ENOSPC), errors.Is(e.err, unix.EMFILE), errors.Is(e.err, unix.ENFILE):
		h += "; free memory or descriptors for the gateway"
	default:
		h += "; allow memfd_create, F_ADD_SEALS and executable memfds for the gateway"
	}
	return h
}

// Sealed returns a sealed copy of the file at path to execute, with
// the digest of exactly the copy's bytes: the kept copy if the file is
// unchanged since it was measured, else the file measured again (and
// copied if its bytes changed). The caller owns f (close-on-exec; pass it
// to the child as an extra file).
//
// The file is read once: the bytes copied into the memfd are the bytes
// hashed, and once the memfd is sealed nothing can change them, so the
// digest is the copy's without reading it back. Only when a copy of the
// path is kept already (the file's stat changed, its bytes most likely
// did not) is the file hashed first, to run the kept copy without copying.
func Sealed(path string) (f *os.File, d digest.Digest, err error) {
	if f, d, ok := images.unchanged(path); ok {
		return f, d, nil
	}
	measured := time.Now()
	disk, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, digest.Digest{}, fmt.Errorf("open %s: %w", path, err)
	}
	defer disk.Close()
	key, _, err := FdKey(disk)
	if err != nil {
		return nil, digest.Digest{}, fmt.Errorf("stat %s: %w", path, err)
	}
	Measures.Add(1)
	var dd digest.Digest // the file's digest on disk, if it was hashed before its copy
	if images.has(path) {
		if dd, err = digest.File(disk); err != nil {
			return nil, digest.Digest{}, err
		}
		if f, ok := images.get(path, dd); ok {
			images.rekey(path, dd, key, stableSince(disk, path, key, measured))
			return f, dd, nil
		}
	} else if st, err := disk.Stat(); err != nil || !st.Mode().IsRegular() {
		_, err = digest.File(disk) // its error says what the file is
		if err == nil {
			err = fmt.Errorf("%s: not a regular file", path)
		}
		return nil, digest.Digest{}, err
	}
	if TestHookBeforeSealedCopy != nil {
		TestHookBeforeSealedCopy(path)
	}
	// The file may change while it is copied: the copy's own bytes, hashed
	// as they are written and sealed now, are what will run.
	m, d, err := sealedCopy(disk, filepath.Base(path))
	if err != nil {
		return nil, digest.Digest{}, err
	}
	f, err = dupCloexec(m)
	if err != nil {
		m.Close()
		return nil, digest.Digest{}, &SealError{op: "dup", err: err}
	}
	// The key stands for the copy only if the file did not change from
	// before it was read to after its copy (and, if it was hashed first,
	// the two reads agree).
	images.put(path, m, d, key, (dd.IsZero() || d.Equal(dd)) && stableSince(disk, path, key, measured))
	return f, d, nil
}

// stableSince reports whether the file open as disk, whose key was key
// before it was read, is still that file at path with that key, and last
// changed at least StampMargin before measured (when it was first read).
func stableSince(disk *os.File, path string, key FileKey, measured time.Time) bool {
	after, nlink, err := FdKey(disk)
	if err != nil || after != key || nlink == 0 {
		return false
	}
	if at, err := StatKey(path); err != nil || at != key {
		return false
	}
	changed := time.Unix(key.ctime.Unix())
	mtime := time.Unix(key.mtime.Unix())
	if mtime.After(changed) {
		changed = mtime
	}
	return changed.Add(StampMargin).Before(measured)
}

// sealedCopy copies src from offset 0 into a new memfd, hashing the bytes
// as they are written, and seals it against every change. d is the digest
// of the memfd's bytes: the seals (write, shrink, grow, and no more seals)
// are checked, and its size is what was written.
func sealedCopy(src *os.File, name string) (m *os.File, d digest.Digest, err error) {
	if len(name) > 200 {
		name = name[:200]
	}
	name = "cmcp:" + name
	fd, err := MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING|unix.MFD_EXEC)
	if errors.Is(err, unix.EINVAL) {
		// Kernels before 6.3 know no MFD_EXEC; their memfds are executable.
		fd, err = MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	}
	if err != nil {
		return nil, d, &SealError{op: "memfd_create", err: err}
	}
	m = os.NewFile(uintptr(fd), "memfd:"+name)
	fail := func(op string, err error) (*os.File, digest.Digest, error) {
		m.Close()
		return nil, digest.Digest{}, &SealError{op: op, err: err}
	}
	// At most the size the file has now: one that keeps growing cannot fill
	// the gateway's memory. The copy's digest decides whether it runs.
	st, err := src.Stat()
	if err != nil {
		return fail("copy into memfd", err)
	}
	if err := unix.Fallocate(fd, 0, 0, st.Size()); err != nil && !errors.Is(err, unix.EOPNOTSUPP) && st.Size() > 0 {
		return fail("copy into memfd", err)
	}
	h := sha256.New()
	buf := make([]byte, 256<<10)
	var n int64
	for n < st.Size() {
		k, rerr := src.ReadAt(buf[:min(int64(len(buf)), st.Size()-n)], n)
		if k > 0 {
			if _, err := m.WriteAt(buf[:k], n); err != nil {
				return fail("copy into memfd", err)
			}
			h.Write(buf[:k])
			n += int64(k)
		}
		if rerr == io.EOF {
			break // shrunk meanwhile: the copy is what was read
		}
		if rerr != nil {
			return fail("copy into memfd", rerr)
		}
	}
	if err := m.Truncate(n); err != nil {
		return fail("copy into memfd", err)
	}
	seals := unix.F_SEAL_WRITE | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
		return fail("seal memfd", err)
	}
	got, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err == nil && got&seals != seals {
		err = fmt.Errorf("seals %#x, want %#x", got, seals)
	}
	if err != nil {
		return fail("seal memfd", err)
	}
	// Sealed: no one can change the bytes any more. Only this process
	// held the memfd before, so its size says whether anything but the
	// copy wrote to it.
	if mst, err := m.Stat(); err != nil || mst.Size() != n {
		if err == nil {
			err = fmt.Errorf("it holds %d bytes, %d were copied", mst.Size(), n)
		}
		return fail("check memfd", err)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return m, digest.FromSum(sum), nil
}

func dupCloexec(f *os.File) (*os.File, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

// unchanged returns a descriptor of the kept copy of path and its digest
// if the file at path is, by its stat, the one measured and unchanged
// since (image.keyed).
func (c *imageCache) unchanged(path string) (*os.File, digest.Digest, bool) {
	k, err := StatKey(path)
	if err != nil {
		return nil, digest.Digest{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	im := c.m[path]
	if im == nil || !im.keyed || im.key != k {
		return nil, digest.Digest{}, false
	}
	f, err := dupCloexec(im.f)
	if err != nil {
		return nil, digest.Digest{}, false
	}
	c.tick++
	im.used = c.tick
	return f, im.d, true
}

// Kept returns the digest of the sealed copy kept for path, if one is.
func Kept(path string) (digest.Digest, bool) {
	images.mu.Lock()
	defer images.mu.Unlock()
	if im := images.m[path]; im != nil {
		return im.d, true
	}
	return digest.Digest{}, false
}

// has reports whether a copy of path is kept.
func (c *imageCache) has(path string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[path] != nil
}

// get returns a descriptor of the kept copy of path if its digest is d.
func (c *imageCache) get(path string, d digest.Digest) (*os.File, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	im := c.m[path]
	if im == nil || !im.d.Equal(d) {
		return nil, false
	}
	f, err := dupCloexec(im.f)
	if err != nil {
		return nil, false
	}
	c.tick++
	im.used = c.tick
	return f, true
}

// rekey records that the file at path was measured again with key (keyed:
// it may stand for the bytes) and still hashes to the kept copy's digest d.
func (c *imageCache) rekey(path string, d digest.Digest, key FileKey, keyed bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if im := c.m[path]; im != nil && im.d.Equal(d) {
		im.key, im.keyed = key, keyed
	}
}

// put keeps f (digest d, measured from the file with key) as the copy of
// path, closing the one it replaces and, past maxImages paths, the least
// recently used.
func (c *imageCache) put(path string, f *os.File, d digest.Digest, key FileKey, keyed bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tick++
	if old := c.m[path]; old != nil {
		old.f.Close()
	}
	c.m[path] = &image{f: f, d: d, used: c.tick, key: key, keyed: keyed}
	for len(c.m) > maxImages {
		var lru string
		for p, im := range c.m {
			if lru == "" || im.used < c.m[lru].used {
				lru = p
			}
		}
		c.m[lru].f.Close()
		delete(c.m, lru)
	}
}

// Stamp is what changes when a file is written in place through any
// descriptor: its status change time (which no one can set back),
// modification time and size.
type Stamp struct {
	size         int64
	ctime, mtime unix.Timespec
}

func StampOf(f *os.File) (Stamp, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return Stamp{}, err
	}
	return Stamp{size: st.Size, ctime: st.Ctim, mtime: st.Mtim}, nil
}

func Supported() error { return nil }
