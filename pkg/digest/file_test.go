package digest

import (
	"crypto/sha256"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestFileReadsThroughDescriptor(t *testing.T) {
	p := filepath.Join(t.TempDir(), "prog")
	content := strings.Repeat("0123456789", 100_000) // spans several buffers
	if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
		t.Fatal(err)
	}
	f, d, err := OpenFile(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if want := FromSum(sha256.Sum256([]byte(content))); !d.Equal(want) {
		t.Fatalf("OpenFile digest %v, want %v", d, want)
	}
	// Move the offset, digest again: the offset must be where we left it and
	// the digest must cover the whole file.
	if _, err := f.Seek(5, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	d2, err := File(f)
	if err != nil || !d2.Equal(d) {
		t.Fatalf("File = %v, %v; want %v", d2, err, d)
	}
	if off, _ := f.Seek(0, io.SeekCurrent); off != 5 {
		t.Fatalf("File moved the offset to %d", off)
	}
	// The descriptor keeps measuring the bytes it opened, even if the path
	// is replaced afterwards.
	os.Remove(p)
	os.WriteFile(p, []byte("evil"), 0o755)
	if d3, err := File(f); err != nil || !d3.Equal(d) {
		t.Fatalf("after replacing the path: File = %v, %v", d3, err)
	}
}

func TestOpenFileRefuses(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, path string
		want       error
	}{
		{"directory", dir, ErrIsDirectory},
		{"fifo (must not block)", fifo, ErrNotRegular},
		{"missing", filepath.Join(dir, "nope"), os.ErrNotExist},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, _, err := OpenFile(tt.path)
			if !errors.Is(err, tt.want) {
				t.Fatalf("OpenFile(%s) err = %v, want %v", tt.path, err, tt.want)
			}
			if f != nil {
				t.Fatal("OpenFile returned a file with an error")
			}
		})
	}
}

func TestResolveCommand(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	other := filepath.Join(dir, "other")
	os.Mkdir(bin, 0o755)
	os.Mkdir(other, 0o755)
	real := filepath.Join(dir, "real-tool")
	os.WriteFile(real, []byte("#!/bin/sh\n"), 0o755)
	os.Symlink(real, filepath.Join(bin, "tool"))
	os.WriteFile(filepath.Join(bin, "noexec"), []byte("x"), 0o644)
	os.WriteFile(filepath.Join(other, "noexec"), []byte("x"), 0o755)
	os.Mkdir(filepath.Join(bin, "adir"), 0o755)
	os.Symlink("loop2", filepath.Join(bin, "loop1"))
	os.Symlink("loop1", filepath.Join(bin, "loop2"))
	os.Symlink("missing", filepath.Join(bin, "dangling"))
	path := bin + ":" + other

	tests := []struct {
		name, cmd, path string
		want            string
		err             error
	}{
		{"symlink resolved to the real file", "tool", path, real, nil},
		{"later PATH entry when the first is not executable", "noexec", path, filepath.Join(other, "noexec"), nil},
		{"not executable", "noexec", bin, "", ErrNotExecutable},
		{"directory", "adir", bin, "", ErrIsDirectory},
		{"symlink loop", "loop1", bin, "", ErrSymlinkLoop},
		{"dangling link is not found", "dangling", bin, "", ErrNotFound},
		{"not found", "no-such-tool", path, "", ErrNotFound},
		{"relative PATH entries are not searched", "tool", "bin", "", ErrNotFound},
		{"empty PATH", "tool", "", "", ErrNotFound},
		{"explicit path", real, "", real, nil},
		{"explicit path through a link", filepath.Join(bin, "tool"), "", real, nil},
		{"explicit directory", bin, "", "", ErrIsDirectory},
		{"explicit missing", filepath.Join(bin, "nope"), "", "", os.ErrNotExist},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ResolveCommand(tt.cmd, tt.path)
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("ResolveCommand(%q) = %q, %v; want error %v", tt.cmd, got, err, tt.err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ResolveCommand(%q) = %q, %v; want %q", tt.cmd, got, err, tt.want)
			}
		})
	}
}
