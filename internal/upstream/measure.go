package upstream

import (
	"context"
	"fmt"
	"io/fs"
	"os"
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
	key fileKey
}

func (w *treeWatch) changed() string {
	if w.unknown {
		return fmt.Sprintf("measure target %s cannot be checked", w.path)
	}
	root, err := treeRoot(w.path)
	if err != nil || root != w.root {
		return fmt.Sprintf("measure target %s no longer resolves to the directory measured (%s)", w.path, w.root)
	}
	// A file's change is named rather than its directory's (a rename
	// over a file changes both).
	dirChanged := ""
	for _, e := range w.entries {
		k, err := lstatKey(filepath.Join(root, filepath.FromSlash(e.rel)))
		switch {
		case err == nil && k == e.key:
		case e.key.mode == syscallDir && err == nil && k.dev == e.key.dev && k.ino == e.key.ino:
			if dirChanged == "" {
				dirChanged = fmt.Sprintf("measure target %s changed after it was measured: an entry of directory %s was added, removed or renamed", w.path, e.rel)
			}
		default:
			return fmt.Sprintf("measure target %s changed after it was measured: %s was written, replaced or removed", w.path, e.rel)
		}
	}
	return dirChanged
}

func (w *treeWatch) close() {}

// treeRoot is the directory digest.Tree measures for path.
func treeRoot(path string) (string, error) {
	root, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", err
	}
	return filepath.Abs(root)
}

// measureTarget digests a pinned measure target: a file (a script), or a
// directory (a package tree, every file counted) as a tree digest. The
// watch it returns re-checks it later.
func measureTarget(ctx context.Context, path string) (digest.Digest, watch, error) {
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
	f, d, before, err := fileImage(path)
	if err != nil {
		return digest.Digest{}, nil, err
	}
	w, err := newFileWatch("measure target", path, f, before)
	if err != nil {
		return digest.Digest{}, nil, err
	}
	return d, w, nil
}
