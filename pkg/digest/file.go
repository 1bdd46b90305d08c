package digest

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
)

// Errors returned (wrapped) by ResolveCommand, File, OpenFile and Tree. Test
// for them with errors.Is; the messages name the path and say what to do.
var (
	ErrNotFound      = errors.New("command not found")
	ErrNotExecutable = errors.New("not executable")
	ErrIsDirectory   = errors.New("is a directory")
	ErrNotRegular    = errors.New("not a regular file")
	ErrSymlinkLoop   = errors.New("symlink loop")
)

// bufPool holds the read buffers of File and Tree.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}

// File returns the SHA-256 digest of everything in f, read through the
// descriptor with ReadAt from offset 0. It does not move f's offset, so the
// same descriptor can afterwards be executed or read from the start.
// f must be a regular file.
func File(f *os.File) (Digest, error) {
	fi, err := f.Stat()
	if err != nil {
		return Digest{}, fmt.Errorf("stat %s: %w", f.Name(), err)
	}
	if err := checkRegular(f.Name(), fi); err != nil {
		return Digest{}, err
	}
	d, _, err := hashReaderAt(f)
	if err != nil {
		return Digest{}, fmt.Errorf("read %s: %w", f.Name(), err)
	}
	return d, nil
}

// hashReaderAt hashes r from offset 0 to EOF and returns the digest and the
// number of bytes read.
func hashReaderAt(r io.ReaderAt) (Digest, int64, error) {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	h := sha256.New()
	n, err := io.CopyBuffer(h, io.NewSectionReader(r, 0, 1<<62), *bp)
	if err != nil {
		return Digest{}, n, err
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return FromSum(sum), n, nil
}

func checkRegular(name string, fi fs.FileInfo) error {
	switch m := fi.Mode(); {
	case m.IsRegular():
		return nil
	case m.IsDir():
		return fmt.Errorf("%s: %w, want a regular file", name, ErrIsDirectory)
	default:
		return fmt.Errorf("%s: %w (it is a %s)", name, ErrNotRegular, typeName(m))
	}
}

// OpenFile opens the regular file at path read-only and returns the open
// descriptor with the digest of its contents. The caller owns f: using the
// same descriptor means no other file can be swapped in at the path, but it
// does not freeze the contents, which can still be rewritten in place (the
// gateway checks the file's status change time around a spawn, or runs a
// sealed memfd copy whose own bytes it digests). A FIFO or device is
// refused without blocking on it.
func OpenFile(path string) (*os.File, Digest, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, Digest{}, fmt.Errorf("open %s: %w", path, err)
	}
	d, err := File(f)
	if err != nil {
		f.Close()
		return nil, Digest{}, err
	}
	return f, d, nil
}

// ResolveCommand finds the program that running name would execute, exactly
// as the gateway resolves it before measuring and spawning it, and returns
// its real absolute path.
//
// A name containing a slash is used as given (relative to the working
// directory). Otherwise each absolute directory of pathEnv (a PATH value,
// list-separated) is searched in order for an executable regular file; empty
// and relative PATH entries are never searched, so the working directory
// cannot shadow a program. The result then has every symbolic link resolved
// (filepath.EvalSymlinks) and must be an executable regular file.
func ResolveCommand(name, pathEnv string) (string, error) {
	if name == "" {
		return "", fmt.Errorf("%w: empty command name", ErrNotFound)
	}
	var found string
	if strings.ContainsRune(name, '/') {
		abs, err := filepath.Abs(name)
		if err != nil {
			return "", fmt.Errorf("resolve %s: %w", name, err)
		}
		if err := checkExecutable(abs); err != nil {
			return "", err
		}
		found = abs
	} else {
		var firstErr error
		var skipped []string
		for _, dir := range filepath.SplitList(pathEnv) {
			if !filepath.IsAbs(dir) {
				skipped = append(skipped, fmt.Sprintf("%q", dir))
				continue
			}
			p := filepath.Join(dir, name)
			err := checkExecutable(p)
			if err == nil {
				found = p
				break
			}
			if firstErr == nil && !errors.Is(err, fs.ErrNotExist) {
				firstErr = err
			}
		}
		if found == "" {
			if firstErr != nil {
				// Something named name exists on PATH but cannot run: say why.
				return "", firstErr
			}
			extra := ""
			if len(skipped) > 0 {
				extra = fmt.Sprintf("; relative PATH entries %s are never searched", strings.Join(skipped, ", "))
			}
			return "", fmt.Errorf("%w: %q is not in any directory of PATH (%s)%s", ErrNotFound, name, clipList(pathEnv), extra)
		}
	}
	real, err := filepath.EvalSymlinks(found)
	if err != nil {
		if isLoop(err) {
			return "", fmt.Errorf("resolve %s: %w: %v", found, ErrSymlinkLoop, err)
		}
		return "", fmt.Errorf("resolve %s: %w", found, err)
	}
	if err := checkExecutable(real); err != nil {
		return "", err
	}
	return real, nil
}

// checkExecutable reports why path cannot be executed, or nil.
func checkExecutable(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		if isLoop(err) {
			return fmt.Errorf("%s: %w: %v", path, ErrSymlinkLoop, err)
		}
		var pe *fs.PathError
		if errors.As(err, &pe) {
			return fmt.Errorf("%s: %w", path, pe.Err)
		}
		return err
	}
	if fi.IsDir() {
		return fmt.Errorf("%s: %w, not a program", path, ErrIsDirectory)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s: %w (it is a %s)", path, ErrNotRegular, typeName(fi.Mode()))
	}
	if fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("%s: %w (mode %v); chmod +x it or name the interpreter as the command", path, ErrNotExecutable, fi.Mode().Perm())
	}
	return nil
}

// isLoop reports whether err comes from too many levels of symbolic links.
func isLoop(err error) bool {
	if errors.Is(err, syscall.ELOOP) {
		return true
	}
	// filepath.EvalSymlinks reports its own loop limit this way.
	return err != nil && strings.Contains(err.Error(), "too many links")
}

func clipList(s string) string {
	if s == "" {
		return "PATH is empty"
	}
	return "PATH=" + clip(s)
}

func typeName(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "FIFO"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeCharDevice != 0:
		return "character device"
	case m&fs.ModeDevice != 0:
		return "block device"
	case m&fs.ModeSymlink != 0:
		return "symbolic link"
	case m.IsDir():
		return "directory"
	case m.IsRegular():
		return "regular file"
	default:
		return "special file"
	}
}
