package digest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
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
}

// treeEntry is one line of the manifest.
type treeEntry struct {
	kind   byte   // 'd', 'f' or 'l'
	rel    string // slash-separated path relative to the root
	target string // symlink target, as stored
	exec   bool
	size   int64
	sum    [sha256.Size]byte
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
	root, err := filepath.EvalSymlinks(dir)
	if err != nil {
		if isLoop(err) {
			return Digest{}, fmt.Errorf("tree %s: %w: %v", dir, ErrSymlinkLoop, err)
		}
		return Digest{}, fmt.Errorf("tree %s: %w", dir, err)
	}
	root, err = filepath.Abs(root)
	if err != nil {
		return Digest{}, fmt.Errorf("tree %s: %w", dir, err)
	}
	fi, err := os.Stat(root)
	if err != nil {
		return Digest{}, fmt.Errorf("tree %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return Digest{}, fmt.Errorf("tree %s: %w (it is a %s); measure a single file as a file target", dir, ErrNotDirectory, typeName(fi.Mode()))
	}

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	workers := opt.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	var (
		wg          sync.WaitGroup
		progressMu  sync.Mutex
		files, byts int64
		work        = make(chan *treeEntry, 4*workers)
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for e := range work {
				if ctx.Err() != nil {
					continue
				}
				if err := hashTreeFile(root, e); err != nil {
					cancel(err)
					continue
				}
				progressMu.Lock()
				files++
				byts += e.size
				if opt.Progress != nil {
					opt.Progress(files, byts)
				}
				progressMu.Unlock()
			}
		}()
	}

	var entries []*treeEntry
	walkErr := walkTree(ctx, root, "", func(e *treeEntry) {
		entries = append(entries, e)
		if e.kind == 'f' {
			work <- e
		}
	})
	close(work)
	wg.Wait()
	if walkErr != nil {
		return Digest{}, fmt.Errorf("tree %s: %w", dir, walkErr)
	}
	if err := context.Cause(ctx); err != nil {
		return Digest{}, fmt.Errorf("tree %s: %w", dir, err)
	}

	slices.SortFunc(entries, func(a, b *treeEntry) int { return strings.Compare(a.rel, b.rel) })
	h := sha256.New()
	h.Write([]byte(TreeHeader))
	var line []byte
	for _, e := range entries {
		line = appendTreeLine(line[:0], e)
		h.Write(line)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return FromSum(sum), nil
}

// appendTreeLine encodes e as one manifest line (see TREE.md).
func appendTreeLine(b []byte, e *treeEntry) []byte {
	switch e.kind {
	case 'd':
		b = append(b, "dir "...)
		b = appendNetstring(b, e.rel)
	case 'f':
		b = append(b, "file "...)
		if e.exec {
			b = append(b, 'x')
		} else {
			b = append(b, '-')
		}
		b = append(b, ' ')
		b = strconv.AppendInt(b, e.size, 10)
		b = append(b, ' ')
		b = hex.AppendEncode(b, e.sum[:])
		b = append(b, ' ')
		b = appendNetstring(b, e.rel)
	case 'l':
		b = append(b, "symlink "...)
		b = appendNetstring(b, e.rel)
		b = append(b, ' ')
		b = appendNetstring(b, e.target)
	}
	return append(b, '\n')
}

func appendNetstring(b []byte, s string) []byte {
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, ':')
	return append(b, s...)
}

// walkTree visits the directory root/rel, calling emit for every entry below
// it, and recurses into real subdirectories (never through symlinks).
func walkTree(ctx context.Context, root, rel string, emit func(*treeEntry)) error {
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
			emit(&treeEntry{kind: 'd', rel: r})
			if err := walkTree(ctx, root, r, emit); err != nil {
				return err
			}
		case t.IsRegular():
			emit(&treeEntry{kind: 'f', rel: r})
		case t&fs.ModeSymlink != 0:
			e, err := treeSymlink(root, r)
			if err != nil {
				return err
			}
			emit(e)
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
func treeSymlink(root, rel string) (*treeEntry, error) {
	abs := filepath.Join(root, filepath.FromSlash(rel))
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
	return &treeEntry{kind: 'l', rel: rel, target: target}, nil
}

// hashTreeFile fills in e's executable bit, size and digest, reading the
// file through a descriptor opened without following symlinks, so a file
// swapped for a link or a FIFO after the walk is refused, not followed.
func hashTreeFile(root string, e *treeEntry) error {
	abs := filepath.Join(root, filepath.FromSlash(e.rel))
	f, err := os.OpenFile(abs, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return fmt.Errorf("%s: %w: it became a symbolic link while being measured", e.rel, ErrNotRegular)
		}
		return fmt.Errorf("open %s: %w", e.rel, unwrapPath(err))
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("stat %s: %w", e.rel, unwrapPath(err))
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s: %w: it is a %s", e.rel, ErrSpecialFile, typeName(fi.Mode()))
	}
	d, n, err := hashReaderAt(f)
	if err != nil {
		return fmt.Errorf("read %s: %w", e.rel, unwrapPath(err))
	}
	e.exec = fi.Mode().Perm()&0o111 != 0
	e.size = n
	e.sum = d.sum
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
