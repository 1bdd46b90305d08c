package auditlog

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// ErrInUse is what Open's error wraps when another writer (another
// gateway) holds the audit directory's lock.
var ErrInUse = errors.New("in use by another writer")

// lockDir takes an exclusive advisory lock on dir/.lock so that two writers
// never append to the same audit directory.
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock audit directory: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("audit directory %s is %w (lock %s held)", dir, ErrInUse, f.Name())
		}
		return nil, fmt.Errorf("lock audit directory: %w", err)
	}
	return f, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync directory: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}

// parseNumbered returns n for names "<prefix>NNNNNN<suffix>".
func parseNumbered(name, prefix, suffix string) (int, bool) {
	s, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return 0, false
	}
	s, ok = strings.CutSuffix(s, suffix)
	if !ok || len(s) != 6 || strings.Trim(s, "0123456789") != "" {
		return 0, false // six ASCII digits; no sign
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		return 0, false
	}
	return n, true
}

// listEpochs returns the epoch numbers in dir, ascending.
func listEpochs(dir string) ([]int, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read audit directory: %w", err)
	}
	var out []int
	for _, e := range ents {
		if n, ok := parseNumbered(e.Name(), "epoch-", ""); ok {
			out = append(out, n)
		}
	}
	sort.Ints(out)
	return out, nil
}

// listSegments returns the segment numbers in an epoch directory, ascending.
func listSegments(epochDir string) ([]int, error) {
	ents, err := os.ReadDir(epochDir)
	if err != nil {
		return nil, fmt.Errorf("read epoch directory: %w", err)
	}
	var out []int
	for _, e := range ents {
		if n, ok := parseNumbered(e.Name(), "seg-", ".jsonl"); ok {
			out = append(out, n)
		}
	}
	sort.Ints(out)
	return out, nil
}

// openRegular opens the regular file at path for reading. It opens without
// blocking (a FIFO put where a segment or vault should be would block the
// open until something writes to it) and refuses anything but a regular
// file, saying what it is.
func openRegular(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		what := "a directory"
		if !fi.IsDir() {
			what = "a " + fi.Mode().Type().String() + " file"
		}
		return nil, fmt.Errorf("%s is %s, not a regular file", path, what)
	}
	return f, nil
}
