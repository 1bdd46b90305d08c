package execimage

import (
	"io/fs"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// FileKey is what a watch compares: the file's type, identity, size and
// times (the status change time moves with every write, rename, link and
// unlink, and no one can set it back).
type FileKey struct {
	mode         uint32 // S_IFMT bits
	dev, ino     uint64
	size         int64
	mtime, ctime syscall.Timespec
}

func keyOfStat(st *syscall.Stat_t) FileKey {
	return FileKey{mode: uint32(st.Mode) & syscall.S_IFMT, dev: uint64(st.Dev), ino: uint64(st.Ino), size: st.Size, mtime: st.Mtim, ctime: st.Ctim}
}

func infoKey(fi fs.FileInfo) (FileKey, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return FileKey{}, false
	}
	return keyOfStat(st), true
}

func lstatKey(path string) (FileKey, error) {
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		return FileKey{}, err
	}
	return keyOfStat(&st), nil
}

func StatKey(path string) (FileKey, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return FileKey{}, err
	}
	return keyOfStat(&st), nil
}

// FdKey is the key and link count of the file open as f.
func FdKey(f *os.File) (FileKey, uint64, error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return FileKey{}, 0, err
	}
	return keyOfStat(&st), uint64(st.Nlink), nil
}

// DupFile is a second descriptor of f's open file (close-on-exec).
func DupFile(f *os.File) (*os.File, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

// syscallDir is the S_IFMT bits of a directory.
const syscallDir = syscall.S_IFDIR
