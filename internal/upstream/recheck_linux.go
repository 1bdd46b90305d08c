package upstream

import (
	"io/fs"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// fileKey is what a watch compares: the file's type, identity, size and
// times (the status change time moves with every write, rename, link and
// unlink, and no one can set it back).
type fileKey struct {
	mode         uint32 // S_IFMT bits
	dev, ino     uint64
	size         int64
	mtime, ctime syscall.Timespec
}

func keyOfStat(st *syscall.Stat_t) fileKey {
	return fileKey{mode: uint32(st.Mode) & syscall.S_IFMT, dev: uint64(st.Dev), ino: uint64(st.Ino), size: st.Size, mtime: st.Mtim, ctime: st.Ctim}
}

func infoKey(fi fs.FileInfo) (fileKey, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileKey{}, false
	}
	return keyOfStat(st), true
}

func lstatKey(path string) (fileKey, error) {
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		return fileKey{}, err
	}
	return keyOfStat(&st), nil
}

func statKey(path string) (fileKey, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return fileKey{}, err
	}
	return keyOfStat(&st), nil
}

// fdKey is the key and link count of the file open as f.
func fdKey(f *os.File) (fileKey, uint64, error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return fileKey{}, 0, err
	}
	return keyOfStat(&st), uint64(st.Nlink), nil
}

// dupFile is a second descriptor of f's open file (close-on-exec).
func dupFile(f *os.File) (*os.File, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

// syscallDir is the S_IFMT bits of a directory.
const syscallDir = syscall.S_IFDIR
