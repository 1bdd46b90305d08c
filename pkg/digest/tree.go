package digest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// Errors returned (wrapped) by Tree, in addition to those of File.
var (
	ErrSymlinkEscape   = errors.New("symlink leaves the tree")
	ErrSymlinkDangling = errors.New("symlink target does not exist")
	ErrSpecialFile     = errors.New("special file in tree")
	ErrNotDirectory    = errors.New("not a directory")
)

// TreeHeader is the first line of the manifest whose SHA-256 is a tree
// digest. It names the encoding version; see TREE.md.
const TreeHeader = "cmcp-tree-v1\n"

// TreeOptions tune Tree.
type TreeOptions struct {
	// Progress, if set, is called after each file is hashed with the number
	// of files and bytes hashed so far. Calls are serialised (never
	// concurrent) but come from Tree's worker goroutines.
	Progress func(files, bytes int64)
	// Workers is the number of files hashed in parallel; 0 means
	// runtime.GOMAXPROCS(0).
	Workers int
	// Stat, if set, is called for the root (path ".") and every entry with
	// the file information it was measured under: a directory's from its
	// open descriptor before it is listed, a regular file's from its open
	// descriptor before it is read, a symbolic link's from lstat before its
	// target is read. A caller can compare them with the files later
	// (status change time, inode) to see whether anything changed since.
	// Calls are serialised (never concurrent) but come from Tree's worker
	// goroutines.
	Stat func(path string, fi fs.FileInfo)
}

// TreeEntry is one entry of a directory tree: one line of the manifest
// whose SHA-256 is the tree digest (TREE.md).
type TreeEntry struct {
	// Path is relative to the root, with "/" separators.
	Path string
	// Type is fs.ModeDir, fs.ModeSymlink, or 0 for a regular file.
	Type fs.FileMode
	// Target is a symbolic link's target, as stored.
	Target string
	// Exec says that a regular file has an execute bit set.
	Exec bool
	// Size and Sum are a regular file's length and SHA-256.
	Size int64
	Sum  [sha256.Size]byte
	// Data is the contents of a regular file ReadTree was asked to keep,
	// the very bytes Size and Sum were computed from; nil otherwise.
	Data []byte

	keep bool // read into Data (ReadTreeOptions.Keep)
}

// ErrTreeLimit is returned (wrapped) by ReadTree for a tree past one of
// the limits of its ReadTreeOptions.
var ErrTreeLimit = errors.New("limit exceeded")

// ReadTreeOptions tune ReadTree.
type ReadTreeOptions struct {
	TreeOptions
	// Keep, if set, is called with the path of every regular file; the
	// contents of a file it returns true for are returned in its Data.
	Keep func(path string) bool
	// MaxEntries, if positive, refuses a tree with more entries than this.
	MaxEntries int
	// MaxKeptBytes, if positive, refuses a kept file larger than this.
	MaxKeptBytes int64
}

// TreeSnapshot is a directory tree read once by ReadTree.
type TreeSnapshot struct {
	// Entries are sorted by path in byte order.
	Entries []TreeEntry
	// Digest is the tree digest of Entries, the one Tree gives for the
	// directory as it was read.
	Digest Digest
}

// ReadTree reads the directory tree at dir once, walking and refusing
// exactly what Tree does, and returns its entries, the contents of the
// files opts.Keep asks for, and its tree digest. The digest is computed
// from the bytes returned: a kept file changed while (or after) it was
// read cannot make the digest describe other contents than its Data.
func ReadTree(ctx context.Context, dir string, opts ReadTreeOptions) (*TreeSnapshot, error) {
	entries, err := readTree(ctx, dir, opts)
	if err != nil {
		return nil, err
	}
	s := &TreeSnapshot{Entries: make([]TreeEntry, len(entries))}
	for i, e := range entries {
		s.Entries[i] = *e
	}
	s.Digest, err = TreeDigest(s.Entries)
	if err != nil {
		return nil, fmt.Errorf("tree %s: %w", dir, err)
	}
	return s, nil
}

// TreeDigest returns the tree digest (TREE.md) of entries held in memory:
// the digest Tree gives for a directory holding exactly these entries. A
// regular file with Data is hashed from Data (its Size and Sum are not
// used); one without is recorded with its Size and Sum. The entries may be
// in any order; two with one path are refused.
func TreeDigest(entries []TreeEntry) (Digest, error) {
	sorted := make([]*TreeEntry, len(entries))
	for i := range entries {
		sorted[i] = &entries[i]
	}
	slices.SortFunc(sorted, func(a, b *TreeEntry) int { return strings.Compare(a.Path, b.Path) })
	h := sha256.New()
	h.Write([]byte(TreeHeader))
	var line []byte
	for i, e := range sorted {
		if i > 0 && sorted[i-1].Path == e.Path {
			return Digest{}, fmt.Errorf("two entries named %q", e.Path)
		}
		if e.Path == "" || e.Path == "." || path.Clean(e.Path) != e.Path || strings.HasPrefix(e.Path, "/") || e.Path == ".." || strings.HasPrefix(e.Path, "../") {
			return Digest{}, fmt.Errorf("entry path %q is not a clean relative path", e.Path)
		}
		f := *e
		if f.Type == 0 && f.Data != nil {
			f.Size, f.Sum = int64(len(f.Data)), sha256.Sum256(f.Data)
		}
		var err error
		if line, err = appendTreeLine(line[:0], &f); err != nil {
			return Digest{}, err
		}
		h.Write(line)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return FromSum(sum), nil
}

// Tree returns the digest of the directory tree at dir: every directory,
// regular file (path, executable bit, size, contents) and symbolic link
// (path and target, never followed) below it, in a deterministic encoding
// documented in TREE.md. It refuses, rather than skips, anything it cannot
// account for: devices, sockets and FIFOs; symbolic links that are absolute,
// leave the tree, dangle or loop; unreadable files and directories. If dir
// is itself a symbolic link, the directory it resolves to is measured.
// Files are hashed in parallel (TreeOptions.Workers).
func Tree(ctx context.Context, dir string, opt TreeOptions) (Digest, error) {
	entries, err := readTree(ctx, dir, ReadTreeOptions{TreeOptions: opt})
	if err != nil {
		return Digest{}, err
	}
	h := sha256.New()
	h.Write([]byte(TreeHeader))
	var line []byte
	for _, e := range entries {
		if line, err = appendTreeLine(line[:0], e); err != nil {
			return Digest{}, fmt.Errorf("tree %s: %w", dir, err)
		}
		h.Write(line)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return FromSum(sum), nil
}

// readTree walks dir and hashes (or reads, when kept) its files, and
// returns its entries sorted by path.
func readTree(ctx context.Context, dir string, opt ReadTreeOptions) ([]*TreeEntry, error) {
	root, err := resolveTreeRoot(dir)
	if err != nil {
		return nil, err
	}

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	var statMu sync.Mutex
	stat := func(string, fs.FileInfo) {}
	if opt.Stat != nil {
		stat = func(rel string, fi fs.FileInfo) {
			statMu.Lock()
			defer statMu.Unlock()
			opt.Stat(rel, fi)
		}
	}
	workers := opt.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	var (
		wg          sync.WaitGroup
		progressMu  sync.Mutex
		files, byts int64
		work        = make(chan *TreeEntry, 4*workers)
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for e := range work {
				if ctx.Err() != nil {
					continue
				}
				if err := hashTreeFile(root, e, opt.MaxKeptBytes, stat); err != nil {
					cancel(err)
					continue
				}
				progressMu.Lock()
				files++
				byts += e.Size
				if opt.Progress != nil {
					opt.Progress(files, byts)
				}
				progressMu.Unlock()
			}
		}()
	}

	var entries []*TreeEntry
	walkErr := walkTree(ctx, root, "", stat, func(e *TreeEntry) error {
		if opt.MaxEntries > 0 && len(entries) >= opt.MaxEntries {
			return fmt.Errorf("%w: more than %d entries", ErrTreeLimit, opt.MaxEntries)
		}
		entries = append(entries, e)
		if e.Type == 0 {
			e.keep = opt.Keep != nil && opt.Keep(e.Path)
			work <- e
		}
		return nil
	})
	close(work)
	wg.Wait()
	if walkErr != nil {
		return nil, fmt.Errorf("tree %s: %w", dir, walkErr)
	}
	if err := context.Cause(ctx); err != nil {
		return nil, fmt.Errorf("tree %s: %w", dir, err)
	}
	slices.SortFunc(entries, func(a, b *TreeEntry) int { return strings.Compare(a.Path, b.Path) })
	return entries, nil
}

// resolveTreeRoot is the absolute directory dir resolves to (its symlinks
// followed), or why it cannot be measured as a tree.
func resolveTreeRoot(dir string) (string, error) {
	root, err := filepath.EvalSymlinks(dir)
	if err != nil {
		if isLoop(err) {
			return "", fmt.Errorf("tree %s: %w: %v", dir, ErrSymlinkLoop, err)
		}
		return "", fmt.Errorf("tree %s: %w", dir, err)
	}
	root, err = filepath.Abs(root)
	if err != nil {
		return "", fmt.Errorf("tree %s: %w", dir, err)
	}
	fi, err := os.Stat(root)
	if err != nil {
		return "", fmt.Errorf("tree %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("tree %s: %w (it is a %s); measure a single file as a file target", dir, ErrNotDirectory, typeName(fi.Mode()))
	}
	return root, nil
}

// appendTreeLine encodes e as one manifest line (see TREE.md).
func appendTreeLine(b []byte, e *TreeEntry) ([]byte, error) {
	switch e.Type {
	case fs.ModeDir:
		b = append(b, "dir "...)
		b = appendNetstring(b, e.Path)
	case 0:
		b = append(b, "file "...)
		if e.Exec {
			b = append(b, 'x')
		} else {
			b = append(b, '-')
		}
		b = append(b, ' ')
		b = strconv.AppendInt(b, e.Size, 10)
		b = append(b, ' ')
		b = hex.AppendEncode(b, e.Sum[:])
		b = append(b, ' ')
		b = appendNetstring(b, e.Path)
	case fs.ModeSymlink:
		b = append(b, "symlink "...)
		b = appendNetstring(b, e.Path)
		b = append(b, ' ')
		b = appendNetstring(b, e.Target)
	default:
		return nil, fmt.Errorf("%s: %w: it is a %s", e.Path, ErrSpecialFile, typeName(e.Type))
	}
	return append(b, '\n'), nil
}

func appendNetstring(b []byte, s string) []byte {
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, ':')
	return append(b, s...)
}

// walkTree visits the directory root/rel, calling emit for every entry below
// it, and recurses into real subdirectories (never through symlinks).
func walkTree(ctx context.Context, root, rel string, stat func(string, fs.FileInfo), emit func(*TreeEntry) error) error {
	if err := ctx.Err(); err != nil {
		return context.Cause(ctx)
	}
	abs := filepath.Join(root, filepath.FromSlash(rel))
	// O_DIRECTORY and O_NONBLOCK: a directory swapped for a FIFO between
	// its listing and this open is refused instead of blocking for ever;
	// below the root, O_NOFOLLOW: one swapped for a symlink is refused too
	// (the root itself may be a symlink the caller named).
	flags := os.O_RDONLY | syscall.O_DIRECTORY | syscall.O_NONBLOCK
	if rel != "" {
		flags |= syscall.O_NOFOLLOW
	}
	f, err := os.OpenFile(abs, flags, 0)
	if err != nil {
		return fmt.Errorf("read directory %s: %w", displayRel(rel), unwrapPath(err))
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("read directory %s: %w", displayRel(rel), unwrapPath(err))
	}
	stat(displayRel(rel), fi)
	des, err := f.ReadDir(-1)
	f.Close()
	if err != nil {
		return fmt.Errorf("read directory %s: %w", displayRel(rel), unwrapPath(err))
	}
	// Sorted so that the first problem reported is the same on every run.
	slices.SortFunc(des, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	for _, de := range des {
		r := path.Join(rel, de.Name())
		t := de.Type()
		switch {
		case t.IsDir():
			if err := emit(&TreeEntry{Path: r, Type: fs.ModeDir}); err != nil {
				return err
			}
			if err := walkTree(ctx, root, r, stat, emit); err != nil {
				return err
			}
		case t.IsRegular():
			if err := emit(&TreeEntry{Path: r}); err != nil {
				return err
			}
		case t&fs.ModeSymlink != 0:
			e, err := treeSymlink(root, r, stat)
			if err != nil {
				return err
			}
			if err := emit(e); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s: %w: it is a %s; cmcp measures only directories, regular files and symbolic links, so remove it or measure a directory without it", r, ErrSpecialFile, typeName(t))
		}
	}
	return nil
}

func displayRel(rel string) string {
	if rel == "" {
		return "."
	}
	return rel
}

// treeSymlink records the link at rel and checks that it stays inside root.
func treeSymlink(root, rel string, stat func(string, fs.FileInfo)) (*TreeEntry, error) {
	abs := filepath.Join(root, filepath.FromSlash(rel))
	fi, err := os.Lstat(abs)
	if err != nil {
		return nil, fmt.Errorf("read symlink %s: %w", rel, unwrapPath(err))
	}
	stat(rel, fi)
	target, err := os.Readlink(abs)
	if err != nil {
		return nil, fmt.Errorf("read symlink %s: %w", rel, unwrapPath(err))
	}
	if filepath.IsAbs(target) {
		return nil, fmt.Errorf("%s -> %s: %w: absolute target; make it relative to the link's directory", rel, target, ErrSymlinkEscape)
	}
	lex := path.Clean(path.Join(path.Dir(rel), filepath.ToSlash(target)))
	if lex == ".." || strings.HasPrefix(lex, "../") {
		return nil, fmt.Errorf("%s -> %s: %w (it points to %s, outside the measured directory)", rel, target, ErrSymlinkEscape, lex)
	}
	real, err := filepath.EvalSymlinks(abs)
	switch {
	case err != nil && isLoop(err):
		return nil, fmt.Errorf("%s -> %s: %w", rel, target, ErrSymlinkLoop)
	case err != nil && errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("%s -> %s: %w; a dangling link cannot be checked to stay inside the tree, so remove it or create its target", rel, target, ErrSymlinkDangling)
	case err != nil:
		return nil, fmt.Errorf("resolve symlink %s: %w", rel, unwrapPath(err))
	}
	if r, err := filepath.Rel(root, real); err != nil || r == ".." || strings.HasPrefix(r, "../") {
		return nil, fmt.Errorf("%s -> %s: %w (it resolves to %s)", rel, target, ErrSymlinkEscape, real)
	}
	return &TreeEntry{Path: rel, Type: fs.ModeSymlink, Target: target}, nil
}

// hashTreeFile fills in e's executable bit, size and digest, reading the
// file through a descriptor opened without following symlinks, so a file
// swapped for a link or a FIFO after the walk is refused, not followed. A
// kept file is read into e.Data (at most maxKept bytes, if positive) and
// its size and digest are those of e.Data.
func hashTreeFile(root string, e *TreeEntry, maxKept int64, stat func(string, fs.FileInfo)) error {
	abs := filepath.Join(root, filepath.FromSlash(e.Path))
	f, err := os.OpenFile(abs, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return fmt.Errorf("%s: %w: it became a symbolic link while being measured", e.Path, ErrNotRegular)
		}
		return fmt.Errorf("open %s: %w", e.Path, unwrapPath(err))
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("stat %s: %w", e.Path, unwrapPath(err))
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s: %w: it is a %s", e.Path, ErrSpecialFile, typeName(fi.Mode()))
	}
	stat(e.Path, fi)
	e.Exec = fi.Mode().Perm()&0o111 != 0
	if e.keep {
		limit := maxKept
		if limit <= 0 {
			limit = 1<<62 - 1
		}
		var buf bytes.Buffer
		if _, err := buf.ReadFrom(io.NewSectionReader(f, 0, limit+1)); err != nil {
			return fmt.Errorf("read %s: %w", e.Path, unwrapPath(err))
		}
		if int64(buf.Len()) > limit {
			return fmt.Errorf("%s: %w: larger than %d bytes", e.Path, ErrTreeLimit, limit)
		}
		e.Data = buf.Bytes()
		if e.Data == nil {
			e.Data = []byte{}
		}
		e.Size, e.Sum = int64(len(e.Data)), sha256.Sum256(e.Data)
		return nil
	}
	d, n, err := hashReaderAt(f)
	if err != nil {
		return fmt.Errorf("read %s: %w", e.Path, unwrapPath(err))
	}
	e.Size = n
	e.Sum = d.sum
	return nil
}

// unwrapPath drops the absolute path of an *fs.PathError: tree errors name
// the relative path themselves.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
