package execimage

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// treeWatch is a measured tree: the directory it resolved to, and what
// every entry was (type, device, inode, size, modification and status
// change times) when it was measured. A file written in place, renamed
// over, removed or added (its directory's times move), a link replaced:
// each changes at least one of them.
type treeWatch struct {
	path, root string
	entries    []treeStat // sorted by path
	unknown    bool       // an entry's information could not be kept
}

type treeStat struct {
	rel string
	key FileKey
}

func (w *treeWatch) Changed() (why, hint string) {
	if w.unknown {
		return fmt.Sprintf("measure target %s cannot be checked", w.path), ""
	}
	root, err := treeRoot(w.path)
	if err != nil || root != w.root {
		return fmt.Sprintf("measure target %s no longer resolves to the directory measured (%s)", w.path, w.root), ""
	}
	// A file's change is named rather than its directory's (a rename
	// over a file changes both).
	dirChanged := ""
	var added []string // entries of changed directories not measured
	for _, e := range w.entries {
		k, err := lstatKey(filepath.Join(root, filepath.FromSlash(e.rel)))
		switch {
		case err == nil && k == e.key:
		case e.key.mode == syscallDir && err == nil && k.dev == e.key.dev && k.ino == e.key.ino:
			if dirChanged == "" {
				dirChanged = fmt.Sprintf("measure target %s changed after it was measured: an entry of directory %s was added, removed or renamed", w.path, e.rel)
			}
			added = append(added, w.added(root, e.rel)...)
		case pyBytecode(e.rel):
			return fmt.Sprintf("measure target %s changed after it was measured: the server wrote Python bytecode into it (%s was written, replaced or removed)", w.path, e.rel), bytecodeHint
		default:
			return fmt.Sprintf("measure target %s changed after it was measured: %s was written, replaced or removed", w.path, e.rel), ""
		}
	}
	if dirChanged != "" && len(added) > 0 && !slices.ContainsFunc(added, func(rel string) bool { return !pyBytecode(rel) }) {
		return fmt.Sprintf("measure target %s changed after it was measured: the server wrote Python bytecode into it (%s added)", w.path, strings.Join(added, ", ")), bytecodeHint
	}
	return dirChanged, ""
}

// bytecodeHint is what to do about a Python server that wrote its
// bytecode into its measured tree (a fresh tree's first run does). The
// docs/spawn-digest.md prefers a tree pinned without __pycache__ (a .pyc in a pinned
// tree can be switched on by a touch; a tree re-measured before every
// spawn cannot gain one), so PYTHONDONTWRITEBYTECODE comes first.
// PYTHONPYCACHEPREFIX is no way out: the bytecode it points python at is
// measured by no pin (config refuses it as code-loading).
const bytecodeHint = "the server wrote into its --target tree, which must not change: set PYTHONDONTWRITEBYTECODE=1 " +
	"in the upstream's stdio.env and pin the tree without __pycache__, " +
	"or pin the tree after a first run has written its __pycache__ (cmcp spawn-digest --target again, then update the pin)"

// pyBytecode reports whether rel (slash-separated, in a tree) is Python
// bytecode: a __pycache__ directory or what is in one, or a .pyc file.
func pyBytecode(rel string) bool {
	return strings.HasSuffix(rel, ".pyc") || slices.Contains(strings.Split(rel, "/"), "__pycache__")
}

// added lists the entries of directory rel of the tree (rooted at root)
// that were not there when it was measured.
func (w *treeWatch) added(root, rel string) []string {
	des, err := os.ReadDir(filepath.Join(root, filepath.FromSlash(rel)))
	if err != nil {
		return nil
	}
	var out []string
	for _, de := range des {
		p := path.Join(rel, de.Name())
		if _, found := slices.BinarySearchFunc(w.entries, p, func(e treeStat, p string) int { return strings.Compare(e.rel, p) }); !found {
			out = append(out, p)
		}
	}
	return out
}

func (w *treeWatch) Close() {}

// treeRoot is the directory digest.Tree measures for path.
func treeRoot(path string) (string, error) {
	root, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", err
	}
	return filepath.Abs(root)
}

// MeasureTarget digests a pinned measure target: a file (a script), or a
// directory (a package tree, every file counted) as a tree digest. The
// watch it returns re-checks it later.
func MeasureTarget(ctx context.Context, path string) (digest.Digest, Watch, error) {
	st, err := os.Stat(path)
	if err != nil {
		return digest.Digest{}, nil, err
	}
	if st.IsDir() {
		root, err := treeRoot(path)
		if err != nil {
			return digest.Digest{}, nil, err
		}
		w := &treeWatch{path: path, root: root}
		d, err := digest.Tree(ctx, path, digest.TreeOptions{Stat: func(rel string, fi fs.FileInfo) {
			k, ok := infoKey(fi)
			w.unknown = w.unknown || !ok
			w.entries = append(w.entries, treeStat{rel: rel, key: k})
		}})
		if err != nil {
			return digest.Digest{}, nil, err
		}
		slices.SortFunc(w.entries, func(a, b treeStat) int { return strings.Compare(a.rel, b.rel) })
		return d, w, nil
	}
	f, d, before, err := Open(path)
	if err != nil {
		return digest.Digest{}, nil, err
	}
	w, err := NewFileWatch("measure target", path, f, before)
	if err != nil {
		return digest.Digest{}, nil, err
	}
	return d, w, nil
}
