package digest

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestReadTreeDigestIsTree: the digest of a tree read into memory
// (ReadTree, TreeDigest over its entries) is Tree's for the same
// directory, whichever files are kept, and a kept file's Data is its
// contents.
func TestReadTreeDigestIsTree(t *testing.T) {
	trees := map[string]map[string]string{
		"TREE.md's example": {"bin/run*": "#!/bin/sh\n", "lib/a.js": "1\n", "lib/b.js": "->a.js"},
		"names and kinds": {
			"a b/c d.txt": "spaces\n", "x.sh*": "echo\n", "z/": "", "y/deep/er/f": "f", "l": "->y/deep", ".hidden": "h",
			"empty": "", "nl\nname": "newline in the name",
		},
		"empty": {},
	}
	keeps := map[string]func(string) bool{
		"nothing kept":    nil,
		"everything kept": func(string) bool { return true },
		"some kept":       func(p string) bool { return strings.HasSuffix(p, ".txt") || p == "empty" || p == "bin/run" },
	}
	for name, files := range trees {
		dir := t.TempDir()
		writeTree(t, dir, files)
		want, err := Tree(context.Background(), dir, TreeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for kname, keep := range keeps {
			t.Run(name+"/"+kname, func(t *testing.T) {
				s, err := ReadTree(context.Background(), dir, ReadTreeOptions{Keep: keep})
				if err != nil {
					t.Fatal(err)
				}
				if !s.Digest.Equal(want) {
					t.Fatalf("ReadTree digest %s, Tree %s", s.Digest, want)
				}
				if d, err := TreeDigest(s.Entries); err != nil || !d.Equal(want) {
					t.Fatalf("TreeDigest = %v, %v; Tree %s", d, err, want)
				}
				for _, e := range s.Entries {
					kept := e.Type == 0 && keep != nil && keep(e.Path)
					if !kept {
						if e.Data != nil {
							t.Errorf("%s: Data returned but not asked for", e.Path)
						}
						continue
					}
					b, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(e.Path)))
					if err != nil || string(b) != string(e.Data) || e.Data == nil {
						t.Errorf("%s: Data %q (nil: %v), file %q, %v", e.Path, e.Data, e.Data == nil, b, err)
					}
				}
			})
		}
	}
}

// TestTreeDigestHashesTheDataHeld: a kept file is recorded with the bytes
// held in Data, not its Size and Sum, so a caller that parses Data gets the
// digest of what it parsed: changing Data gives the digest of a directory
// holding the changed file.
func TestTreeDigestHashesTheDataHeld(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"a.cedar": "A", "notes": "n", "sub/": ""})
	s, err := ReadTree(context.Background(), dir, ReadTreeOptions{Keep: func(p string) bool { return p == "a.cedar" }})
	if err != nil {
		t.Fatal(err)
	}
	s.Entries[0].Data = []byte("B")
	got, err := TreeDigest(s.Entries)
	if err != nil {
		t.Fatal(err)
	}
	other := t.TempDir()
	writeTree(t, other, map[string]string{"a.cedar": "B", "notes": "n", "sub/": ""})
	want, err := Tree(context.Background(), other, TreeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !got.Equal(want) || got.Equal(s.Digest) {
		t.Fatalf("TreeDigest with Data B = %s; Tree of the tree with B %s; as read %s", got, want, s.Digest)
	}

	// Entries in any order give the same digest; a repeated or unclean
	// path, or an entry of another type, is refused.
	rev := []TreeEntry{s.Entries[2], s.Entries[1], s.Entries[0]}
	if d, err := TreeDigest(rev); err != nil || !d.Equal(got) {
		t.Fatalf("reordered: %v, %v", d, err)
	}
	for name, bad := range map[string][]TreeEntry{
		"repeated": {{Path: "a", Data: []byte("1")}, {Path: "a", Data: []byte("2")}},
		"dot-dot":  {{Path: "../a"}},
		"absolute": {{Path: "/a"}},
		"unclean":  {{Path: "a//b"}},
		"empty":    {{Path: ""}},
		"a FIFO":   {{Path: "p", Type: fs.ModeNamedPipe}},
	} {
		if d, err := TreeDigest(bad); err == nil {
			t.Errorf("%s: TreeDigest = %s, want an error", name, d)
		}
	}
}

// TestReadTreeRefusesWhatTreeRefuses and keeps its bounds.
func TestReadTreeRefusesWhatTreeRefuses(t *testing.T) {
	for name, files := range map[string]map[string]string{
		"escaping link": {"a": "->../x"},
		"absolute link": {"a": "->/etc/passwd"},
		"dangling link": {"a": "->nope"},
	} {
		dir := t.TempDir()
		writeTree(t, dir, files)
		_, terr := Tree(context.Background(), dir, TreeOptions{})
		_, rerr := ReadTree(context.Background(), dir, ReadTreeOptions{Keep: func(string) bool { return true }})
		if terr == nil || rerr == nil || terr.Error() != rerr.Error() {
			t.Errorf("%s: Tree: %v; ReadTree: %v", name, terr, rerr)
		}
	}
	dir := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(dir, "p.cedar"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadTree(context.Background(), dir, ReadTreeOptions{Keep: func(string) bool { return true }}); !errors.Is(err, ErrSpecialFile) {
		t.Errorf("FIFO: %v", err)
	}

	dir = t.TempDir()
	writeTree(t, dir, map[string]string{"a": "12345", "b": "123456", "d/c": "1"})
	if _, err := ReadTree(context.Background(), dir, ReadTreeOptions{MaxEntries: 4, MaxKeptBytes: 5, Keep: func(p string) bool { return p != "b" }}); err != nil {
		t.Fatalf("within the limits: %v", err)
	}
	_, err := ReadTree(context.Background(), dir, ReadTreeOptions{MaxKeptBytes: 5, Keep: func(string) bool { return true }})
	if !errors.Is(err, ErrTreeLimit) || !strings.Contains(err.Error(), "b: ") {
		t.Fatalf("a kept file past MaxKeptBytes: %v", err)
	}
	if _, err := ReadTree(context.Background(), dir, ReadTreeOptions{MaxEntries: 3}); !errors.Is(err, ErrTreeLimit) {
		t.Fatalf("past MaxEntries: %v", err)
	}
}
