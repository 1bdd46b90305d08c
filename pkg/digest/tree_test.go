package digest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// writeTree creates files under dir: a value of "->target" makes a symlink,
// a trailing "/" in the name makes an empty directory, and names ending in
// "*" are made executable (the "*" is dropped).
func writeTree(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		mode := os.FileMode(0o644)
		if name[len(name)-1] == '*' {
			name, mode = name[:len(name)-1], 0o755
		}
		p := filepath.Join(dir, name)
		if name[len(name)-1] == '/' {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if len(content) > 2 && content[:2] == "->" {
			if err := os.Symlink(content[2:], p); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
}

func hexSum(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }

func TestTreeManifestByHand(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"bin/run*": "#!/bin/sh\n", "lib/a.js": "1\n", "lib/b.js": "->a.js"})
	manifest := "cmcp-tree-v1\n" +
		"dir 3:bin\n" +
		"file x 10 " + hexSum("#!/bin/sh\n") + " 7:bin/run\n" +
		"dir 3:lib\n" +
		"file - 2 " + hexSum("1\n") + " 8:lib/a.js\n" +
		"symlink 8:lib/b.js 4:a.js\n"
	want := "sha256:" + hexSum(manifest)
	if want != "sha256:70acfd008b7f3b56bc4deddfc68913d3199fd702f26ac4b5aa07ef8fe60a3248" { // the vector in TREE.md
		t.Fatalf("manifest digest %s differs from TREE.md's example", want)
	}
	got, err := Tree(context.Background(), dir, TreeOptions{})
	if err != nil || got.String() != want {
		t.Fatalf("Tree = %v, %v; want %s", got, err, want)
	}
}

// TestTreeShellReimplementation runs the shell snippet of TREE.md and
// checks that an independent implementation agrees with Tree.
func TestTreeShellReimplementation(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Fatalf("bash is needed for this test: %v", err)
	}
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{
		"a b/c d.txt": "spaces\n", "x.sh*": "echo\n", "z/": "", "y/deep/er/f": "f", "l": "->y/deep", ".hidden": "h",
		// Names that find, stat and readlink would take for options.
		"-rf*": "dash\n", "-perm/-name": "n", "-l": "->-rf", "--/": "",
	})
	// The script is TREE.md's own, so that the one auditors copy is the
	// one tested.
	md, err := os.ReadFile("TREE.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(md), "```sh\n")
	block, _, ok2 := strings.Cut(block, "```")
	if !ok || !ok2 || !strings.HasPrefix(block, "cd DIR && ") {
		t.Fatalf("TREE.md has no shell block starting with \"cd DIR && \"")
	}
	script := "export LC_ALL=C; cd \"$1\" && " + strings.TrimPrefix(block, "cd DIR && ")
	out, err := exec.Command("bash", "-c", script, "bash", dir).Output()
	if err != nil {
		t.Fatal(err)
	}
	if len(out) < 64 {
		t.Fatalf("the shell printed %q", out)
	}
	want := "sha256:" + string(out[:64])
	got, err := Tree(context.Background(), dir, TreeOptions{})
	if err != nil || got.String() != want {
		t.Fatalf("Tree = %v, %v; shell says %s", got, err, want)
	}
}

func TestTreeSensitivity(t *testing.T) {
	base := map[string]string{"a/b.js": "b", "a/c.js": "c", "run*": "x", "empty/": ""}
	digestOf := func(t *testing.T, files map[string]string, mutate func(dir string)) Digest {
		dir := t.TempDir()
		writeTree(t, dir, files)
		if mutate != nil {
			mutate(dir)
		}
		d, err := Tree(context.Background(), dir, TreeOptions{Workers: 3})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	d0 := digestOf(t, base, nil)
	if d1 := digestOf(t, base, nil); !d0.Equal(d1) {
		t.Fatal("same tree, different digests")
	}
	changes := map[string]func(dir string){
		"content":     func(dir string) { os.WriteFile(filepath.Join(dir, "a/b.js"), []byte("B"), 0o644) },
		"exec bit":    func(dir string) { os.Chmod(filepath.Join(dir, "a/c.js"), 0o744) },
		"rename":      func(dir string) { os.Rename(filepath.Join(dir, "a/c.js"), filepath.Join(dir, "a/d.js")) },
		"empty dir":   func(dir string) { os.Mkdir(filepath.Join(dir, "empty/more"), 0o755) },
		"new file":    func(dir string) { os.WriteFile(filepath.Join(dir, ".npmrc"), nil, 0o644) },
		"link target": func(dir string) { os.Symlink("a/b.js", filepath.Join(dir, "l")) },
	}
	for name, mutate := range changes {
		t.Run(name, func(t *testing.T) {
			if d := digestOf(t, base, mutate); d.Equal(d0) {
				t.Fatalf("%s did not change the digest", name)
			}
		})
	}
	t.Run("read-only bits do not count", func(t *testing.T) {
		if d := digestOf(t, base, func(dir string) { os.Chmod(filepath.Join(dir, "a/b.js"), 0o600) }); !d.Equal(d0) {
			t.Fatal("mode 0600 vs 0644 changed the digest")
		}
	})
}

func TestTreeRefuses(t *testing.T) {
	tests := []struct {
		name  string
		files map[string]string
		setup func(t *testing.T, dir string)
		want  error
		msg   string
	}{
		{"symlink leaving the tree", map[string]string{"a/l": "->../../etc/passwd"}, nil, ErrSymlinkEscape, "a/l -> ../../etc/passwd"},
		{"absolute symlink", map[string]string{"l": "->/etc/passwd"}, nil, ErrSymlinkEscape, "absolute target"},
		{"symlink via a link to the root", map[string]string{"s": "->.", "l": "->s/../outside"}, nil, ErrSymlinkEscape, "resolves to"},
		{"dangling symlink", map[string]string{"l": "->nowhere"}, nil, ErrSymlinkDangling, "l -> nowhere"},
		{"symlink loop", map[string]string{"a": "->b", "b": "->a"}, nil, ErrSymlinkLoop, "symlink loop"},
		{"fifo", nil, func(t *testing.T, dir string) {
			os.Mkdir(filepath.Join(dir, "sub"), 0o755)
			if err := syscall.Mkfifo(filepath.Join(dir, "sub/pipe"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, ErrSpecialFile, "sub/pipe: special file in tree: it is a FIFO"},
		{"socket", nil, func(t *testing.T, dir string) {
			l, err := net.Listen("unix", filepath.Join(dir, "sock"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
		}, ErrSpecialFile, "it is a socket"},
		{"device", nil, func(t *testing.T, dir string) {
			if err := syscall.Mknod(filepath.Join(dir, "null"), syscall.S_IFCHR|0o666, 1<<8|3); err != nil {
				// mknod needs CAP_MKNOD; a symlink to /dev/null is refused
				// too, as leaving the tree, so check that instead.
				os.Symlink("/dev/null", filepath.Join(dir, "null"))
			}
		}, nil, "null"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			dir := filepath.Join(root, "tree")
			os.Mkdir(dir, 0o755)
			os.WriteFile(filepath.Join(root, "outside"), []byte("x"), 0o644)
			writeTree(t, dir, tt.files)
			if tt.setup != nil {
				tt.setup(t, dir)
			}
			_, err := Tree(context.Background(), dir, TreeOptions{})
			if err == nil {
				t.Fatal("Tree succeeded, want an error")
			}
			if tt.want != nil && !errors.Is(err, tt.want) {
				t.Fatalf("error %v, want %v", err, tt.want)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("error %q does not mention %q", err, tt.msg)
			}
		})
	}
}

func TestTreeNotDirectory(t *testing.T) {
	f := filepath.Join(t.TempDir(), "f")
	os.WriteFile(f, nil, 0o644)
	if _, err := Tree(context.Background(), f, TreeOptions{}); !errors.Is(err, ErrNotDirectory) {
		t.Fatalf("err = %v, want ErrNotDirectory", err)
	}
	if _, err := Tree(context.Background(), f+"-missing", TreeOptions{}); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("err = %v, want ErrNotExist", err)
	}
}

func TestTreeProgressAndCancel(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{}
	for i := range 50 {
		files[fmt.Sprintf("d%d/f%d", i%7, i)] = fmt.Sprint(i)
	}
	writeTree(t, dir, files)
	var lastF, lastB int64
	calls := 0
	if _, err := Tree(context.Background(), dir, TreeOptions{Progress: func(f, b int64) { calls++; lastF, lastB = f, b }}); err != nil {
		t.Fatal(err)
	}
	if calls != 50 || lastF != 50 || lastB != 90 {
		t.Fatalf("progress: %d calls, last %d files %d bytes; want 50, 50, 90", calls, lastF, lastB)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Tree(ctx, dir, TreeOptions{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Tree: err = %v", err)
	}
}

// TestTreeStat: TreeOptions.Stat sees the root and every entry once, each
// with the information of the very file measured (a directory, a regular
// file, a link, not what a link points to).
func TestTreeStat(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"a/b.js": "b", "c*": "c", "e/": "", "l": "->a/b.js"})
	got := map[string]os.FileMode{}
	_, err := Tree(context.Background(), dir, TreeOptions{Workers: 3, Stat: func(p string, fi os.FileInfo) {
		if _, dup := got[p]; dup {
			t.Errorf("%s seen twice", p)
		}
		got[p] = fi.Mode().Type()
	}})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]os.FileMode{".": os.ModeDir, "a": os.ModeDir, "a/b.js": 0, "c": 0, "e": os.ModeDir, "l": os.ModeSymlink}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Stat saw %v, want %v", got, want)
	}
}
