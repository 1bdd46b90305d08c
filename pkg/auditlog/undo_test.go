//go:build linux

package auditlog

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"filippo.io/age"
)

// withFileSizeLimit runs f with RLIMIT_FSIZE lowered to limit bytes: a
// write that would grow a file beyond it writes what fits and fails with
// EFBIG, as a write on a disk that fills part way does (Go ignores the
// SIGXFSZ that comes with it).
func withFileSizeLimit(t *testing.T, limit int64, f func()) {
	t.Helper()
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
		t.Fatal(err)
	}
	lim := syscall.Rlimit{Cur: uint64(limit), Max: old.Max}
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		t.Fatal(err)
	}
	defer syscall.Setrlimit(syscall.RLIMIT_FSIZE, &old)
	f()
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// TestFailedBatchLeavesNoRecord: a batch whose write fails part way (the
// disk fills inside it: here the call record fits and the checkpoint that
// closes the batch does not; or the vault entry written before it does not
// fit) is cut off the segment and the vault again, so an Append that
// reports an error did not write its record: after a restart the log holds
// no call record for it (recovery keeps every complete line, so a call the
// gateway refused would otherwise read as forwarded), recovery has nothing
// to cut, the vault has no torn line and the log verifies.
func TestFailedBatchLeavesNoRecord(t *testing.T) {
	for _, tc := range []struct {
		name  string
		vault bool // the vault write fails, not the segment's
		// limit returns the file size limit given the segment's and the
		// vault's size and the length of the last segment line.
		limit func(seg, vault, line int64) int64
	}{
		{"segment fills inside the batch", false, func(seg, vault, line int64) int64 { return seg + line + 40 }},
		{"vault fills inside its entry", true, func(seg, vault, line int64) int64 { return vault + 40 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, err := age.GenerateX25519Identity()
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			w, err := Open(dir, Options{Key: testKey(t), CheckpointEvery: 2, CheckpointInterval: 1 << 40,
				Recipients: []string{id.Recipient().String()}, Vault: true})
			if err != nil {
				t.Fatal(err)
			}
			first := sampleCall(w, 1)
			if _, err := w.Append(context.Background(), first); err != nil {
				t.Fatal(err)
			}
			seg := filepath.Join(dir, "epoch-000001", "seg-000001.jsonl")
			vault := filepath.Join(dir, "epoch-000001", VaultFile)
			b, err := os.ReadFile(seg)
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.SplitAfter(string(b), "\n")
			segSize, vaultSize := int64(len(b)), fileSize(t, vault)
			limit := tc.limit(segSize, vaultSize, int64(len(lines[len(lines)-2])))
			if limit <= vaultSize || tc.vault != (limit < segSize) {
				t.Fatalf("limit %d does not fall inside the batch (segment %d, vault %d bytes)", limit, segSize, vaultSize)
			}
			var appendErr error
			withFileSizeLimit(t, limit, func() {
				_, appendErr = w.Append(context.Background(), sampleCall(w, 2))
			})
			var fe *FatalError
			if !errors.As(appendErr, &fe) || !errors.Is(appendErr, syscall.EFBIG) {
				t.Fatalf("append past the size limit: %v", appendErr)
			}
			if strings.Contains(appendErr.Error(), "failed too") {
				t.Fatalf("the cut failed: %v", appendErr)
			}
			if got := fileSize(t, seg); got != segSize {
				t.Errorf("segment is %d bytes after the failed append, was %d before it", got, segSize)
			}
			if got := fileSize(t, vault); got != vaultSize {
				t.Errorf("vault is %d bytes after the failed append, was %d before it", got, vaultSize)
			}
			if _, err := w.Append(context.Background(), sampleCall(w, 3)); err != appendErr {
				t.Fatalf("append after the failed one: %v", err)
			}
			w.Close()

			w2, err := Open(dir, Options{Key: testKey(t)})
			if err != nil {
				t.Fatal(err)
			}
			if rec := w2.Recovery(); rec == nil || rec.DroppedBytes != 0 {
				t.Errorf("recovery %+v, want one that cuts nothing", rec)
			}
			if err := w2.Close(); err != nil {
				t.Fatal(err)
			}
			r, err := NewReader(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			calls := 0
			for {
				e, err := r.Next()
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				if rec, err := e.Decode(); err == nil {
					if _, ok := rec.(*Call); ok {
						calls++
					}
				}
			}
			if calls != 1 {
				t.Fatalf("the log holds %d call records after recovery; only 1 Append succeeded", calls)
			}
			rep, err := Verify(dir, VerifyOptions{})
			if err != nil {
				t.Fatal(err)
			}
			o, err := NewOpener(rep.Epochs[0].Genesis, id)
			if err != nil {
				t.Fatal(err)
			}
			if err := o.LoadVault(filepath.Join(dir, "epoch-000001"), id); err != nil {
				t.Fatal(err)
			}
			if n := o.VaultTorn(); n != 0 {
				t.Errorf("the vault ends with a torn line of %d bytes", n)
			}
			if _, err := o.Payload(first.Args); err != nil {
				t.Errorf("the acknowledged call's payload: %v", err)
			}
		})
	}
}

// TestFailedSyncCutFailureIsReported: when the fdatasync after a full write
// fails and the batch cannot be cut off either (here the segment's
// descriptor refers to /dev/null, which takes the write and refuses both
// fdatasync and truncation), the writer stops with an error that says the
// failed batch may remain in the log, so the operator knows what the next
// start's recovery cannot tell.
func TestFailedSyncCutFailureIsReported(t *testing.T) {
	dir := t.TempDir()
	w, err := Open(dir, Options{Key: testKey(t)})
	if err != nil {
		t.Fatal(err)
	}
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	if err := syscall.Dup2(int(null.Fd()), int(w.f.Fd())); err != nil {
		t.Fatal(err)
	}
	_, err = w.Append(context.Background(), sampleCall(w, 0))
	var fe *FatalError
	if !errors.As(err, &fe) || !strings.Contains(err.Error(), "fdatasync") || !strings.Contains(err.Error(), "records whose append failed may remain") {
		t.Fatalf("append whose sync and cut fail: %v", err)
	}
	if err := w.Close(); !errors.As(err, &fe) {
		t.Fatalf("close: %v", err)
	}
}

// TestFailedStartLeavesNoEpoch: an Open whose genesis record cannot be
// written (the disk is full) fails and removes the epoch directory it
// created, segment and vault included, so the log is as it was before the
// attempt: it verifies, and the next start continues the chain without an
// aborted epoch to move aside.
func TestFailedStartLeavesNoEpoch(t *testing.T) {
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		before int // epochs written before the failed start
		vault  bool
	}{
		{"first start", 0, false},
		{"after a sealed epoch", 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.before > 0 {
				writeLog(t, dir, Options{}, 10, 1)
			}
			opts := Options{Key: testKey(t)}
			if tc.vault {
				opts.Recipients, opts.Vault = []string{id.Recipient().String()}, true
			}
			var openErr error
			withFileSizeLimit(t, 100, func() {
				var w *Writer
				if w, openErr = Open(dir, opts); openErr == nil {
					w.Close()
				}
			})
			if !errors.Is(openErr, syscall.EFBIG) {
				t.Fatalf("open on a full disk: %v", openErr)
			}
			ents, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, e := range ents {
				if e.Name() != ".lock" {
					names = append(names, e.Name())
				}
			}
			if want := tc.before; len(names) != want {
				t.Fatalf("audit directory holds %v after the failed start, want %d epoch(s)", names, want)
			}
			if tc.before > 0 {
				if _, err := Verify(dir, VerifyOptions{}); err != nil {
					t.Fatalf("verify after the failed start: %v", err)
				}
			}
			w, err := Open(dir, Options{Key: testKey(t)})
			if err != nil {
				t.Fatal(err)
			}
			if e, _ := w.Epoch(); e != tc.before+1 || w.Recovery() != nil {
				t.Fatalf("next start: epoch %d (want %d), recovery %+v", e, tc.before+1, w.Recovery())
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			if m, _ := filepath.Glob(filepath.Join(dir, "aborted-*")); len(m) != 0 {
				t.Fatalf("aborted epochs %v", m)
			}
			if _, err := Verify(dir, VerifyOptions{}); err != nil {
				t.Fatal(err)
			}
		})
	}
}
