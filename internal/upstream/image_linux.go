package upstream

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

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
// Copying a large binary on every spawn would cost time and memory, so the
// last sealed copy of each resolved path is kept. Every spawn still hashes
// the file on disk; the kept copy is executed only when its digest is that
// hash (the same bytes), and a file whose digest changed is copied and
// sealed again, replacing the kept copy.

// maxImages bounds how many resolved paths keep a sealed copy; the least
// recently used is dropped first (its running children keep their own).
const maxImages = 16

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
}

// memfdCreate is unix.MemfdCreate; tests replace it to see a refusal.
var memfdCreate = unix.MemfdCreate

// testHookBeforeSealedCopy, if set, runs after the file is measured and
// before it is copied into the memfd.
var testHookBeforeSealedCopy func(path string)

// hint says what an operator can do about a sealError.
func (e *sealError) hint() string {
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

// sealedImage measures the file at path and returns a sealed copy of it to
// execute, with the digest of exactly the copy's bytes. The caller owns f
// (close-on-exec; pass it to the child as an extra file).
func sealedImage(path string) (f *os.File, d digest.Digest, err error) {
	disk, dd, err := digest.OpenFile(path)
	if err != nil {
		return nil, digest.Digest{}, err
	}
	defer disk.Close()
	if f, ok := images.get(path, dd); ok {
		return f, dd, nil
	}
	if testHookBeforeSealedCopy != nil {
		testHookBeforeSealedCopy(path)
	}
	m, err := sealedCopy(disk, filepath.Base(path))
	if err != nil {
		return nil, digest.Digest{}, err
	}
	// The file may have changed while it was copied: the copy's own bytes,
	// sealed now, are what will run, so they are what is digested.
	d, err = digest.File(m)
	if err != nil {
		m.Close()
		return nil, digest.Digest{}, &sealError{op: "read back memfd", err: err}
	}
	f, err = dupCloexec(m)
	if err != nil {
		m.Close()
		return nil, digest.Digest{}, &sealError{op: "dup", err: err}
	}
	images.put(path, m, d)
	return f, d, nil
}

// sealedCopy copies src from offset 0 into a new memfd and seals it
// against every change.
func sealedCopy(src *os.File, name string) (*os.File, error) {
	if len(name) > 200 {
		name = name[:200]
	}
	name = "cmcp:" + name
	fd, err := memfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING|unix.MFD_EXEC)
	if errors.Is(err, unix.EINVAL) {
		// Kernels before 6.3 know no MFD_EXEC; their memfds are executable.
		fd, err = memfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	}
	if err != nil {
		return nil, &sealError{op: "memfd_create", err: err}
	}
	m := os.NewFile(uintptr(fd), "memfd:"+name)
	// At most the size the file has now: one that keeps growing cannot fill
	// the gateway's memory. The copy's digest decides whether it runs.
	st, err := src.Stat()
	if err != nil {
		m.Close()
		return nil, &sealError{op: "copy into memfd", err: err}
	}
	if _, err := io.CopyN(m, src, st.Size()); err != nil && err != io.EOF {
		m.Close()
		return nil, &sealError{op: "copy into memfd", err: err}
	}
	seals := unix.F_SEAL_WRITE | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL
	if _, err := unix.FcntlInt(m.Fd(), unix.F_ADD_SEALS, seals); err != nil {
		m.Close()
		return nil, &sealError{op: "seal memfd", err: err}
	}
	got, err := unix.FcntlInt(m.Fd(), unix.F_GET_SEALS, 0)
	if err == nil && got&seals != seals {
		err = fmt.Errorf("seals %#x, want %#x", got, seals)
	}
	if err != nil {
		m.Close()
		return nil, &sealError{op: "seal memfd", err: err}
	}
	return m, nil
}

func dupCloexec(f *os.File) (*os.File, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
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

// put keeps f (digest d) as the copy of path, closing the one it replaces
// and, past maxImages paths, the least recently used.
func (c *imageCache) put(path string, f *os.File, d digest.Digest) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tick++
	if old := c.m[path]; old != nil {
		old.f.Close()
	}
	c.m[path] = &image{f: f, d: d, used: c.tick}
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

// stamp is what changes when a file is written in place through any
// descriptor: its status change time (which no one can set back),
// modification time and size.
type stamp struct {
	size         int64
	ctime, mtime unix.Timespec
}

func stampOf(f *os.File) (stamp, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return stamp{}, err
	}
	return stamp{size: st.Size, ctime: st.Ctim, mtime: st.Mtim}, nil
}

func platformSupportsStdio() error { return nil }
