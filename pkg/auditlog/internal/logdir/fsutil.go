// Package logdir is the layout of an audit directory on disk: the
// epoch-NNNNNN directories, their seg-NNNNNN.jsonl segments, vault.jsonl
// and witness.jsonl, the writer's lock, and the file operations that
// reading and writing it share (listing, opening without blocking on a
// FIFO, syncing, reading witness.jsonl's notes). It knows nothing of the
// records inside the files.
package logdir

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

// The files an epoch directory holds beside its segments (auditlog's
// VaultFile and WitnessFile).
const (
	VaultFile   = "vault.jsonl"
	WitnessFile = "witness.jsonl"
)

// ErrInUse is what LockDir's error wraps when another writer (another
// gateway) holds the audit directory's lock.
var ErrInUse = errors.New("in use by another writer")

// LockDir takes an exclusive advisory lock on dir/.lock so that two writers
// never append to the same audit directory.
func LockDir(dir string) (*os.File, error) {
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

// SyncDir syncs the directory dir (after a file in it was created,
// renamed or removed).
func SyncDir(dir string) error {
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

// EpochName is the name of epoch n's directory.
func EpochName(n int) string { return fmt.Sprintf("epoch-%06d", n) }

// SegmentName is the name of segment n's file in an epoch directory.
func SegmentName(n int) string { return fmt.Sprintf("seg-%06d.jsonl", n) }

// ParseNumbered returns n for names "<prefix>NNNNNN<suffix>".
func ParseNumbered(name, prefix, suffix string) (int, bool) {
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

// EpochOfOrigin returns the epoch whose directory an origin names
// ("<name>/epoch-NNNNNN-<8 hex digits>": an epoch's origin), or 0.
func EpochOfOrigin(origin string) int {
	i := strings.LastIndex(origin, "/epoch-")
	if i < 0 || len(origin) < i+13 {
		return 0
	}
	n, ok := ParseNumbered(origin[i+1:i+13], "epoch-", "")
	if !ok {
		return 0
	}
	return n
}

// ListEpochs returns the epoch numbers in dir, ascending.
func ListEpochs(dir string) ([]int, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read audit directory: %w", err)
	}
	var out []int
	for _, e := range ents {
		if n, ok := ParseNumbered(e.Name(), "epoch-", ""); ok {
			out = append(out, n)
		}
	}
	sort.Ints(out)
	return out, nil
}

// ListSegments returns the segment numbers in an epoch directory, ascending.
func ListSegments(epochDir string) ([]int, error) {
	ents, err := os.ReadDir(epochDir)
	if err != nil {
		return nil, fmt.Errorf("read epoch directory: %w", err)
	}
	var out []int
	for _, e := range ents {
		if n, ok := ParseNumbered(e.Name(), "seg-", ".jsonl"); ok {
			out = append(out, n)
		}
	}
	sort.Ints(out)
	return out, nil
}

// OpenRegular opens the regular file at path for reading. It opens without
// blocking (a FIFO put where a segment or vault should be would block the
// open until something writes to it) and refuses anything but a regular
// file, saying what it is.
func OpenRegular(path string) (*os.File, error) {
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

// StrayEntries lists, as paths relative to dir with forward slashes and
// sorted, the entries of the audit directory dir and of its epoch
// directories that are not part of the log: anything but epoch-NNNNNN
// directories, seg-NNNNNN.jsonl, vault.jsonl and witness.jsonl in them, and what the
// writer itself leaves beside them (.lock, a cut tail kept as
// seg-NNNNNN.jsonl.torn-TIME, an epoch moved aside as aborted-epoch-...).
// A copy of a segment or an epoch under another name is never verified:
// it is listed so that nobody takes it for verified.
func StrayEntries(dir string, epochs []int) ([]string, error) {
	var out []string
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		name := e.Name()
		_, epoch := ParseNumbered(name, "epoch-", "")
		switch {
		case epoch && e.IsDir():
		case name == ".lock" && e.Type().IsRegular():
		case e.IsDir() && strings.HasPrefix(name, "aborted-epoch-"):
		default:
			out = append(out, name)
		}
	}
	for _, n := range epochs {
		ents, err := os.ReadDir(filepath.Join(dir, EpochName(n)))
		if err != nil {
			return nil, err
		}
		for _, e := range ents {
			name := e.Name()
			_, seg := ParseNumbered(name, "seg-", ".jsonl")
			torn := false
			if i := strings.Index(name, ".jsonl.torn-"); i > 0 {
				_, torn = ParseNumbered(name[:i+len(".jsonl")], "seg-", ".jsonl")
			}
			if (seg || torn || name == VaultFile || name == WitnessFile) && !e.IsDir() {
				continue
			}
			out = append(out, EpochName(n)+"/"+name)
		}
	}
	sort.Strings(out)
	return out, nil
}
