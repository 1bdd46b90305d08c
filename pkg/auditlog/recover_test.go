package auditlog

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logdir"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logtest"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/scan"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// unseal drops the seal and final checkpoint of a closed epoch, leaving it
// as a crashed writer would (records after the last checkpoint unsealed).
func unseal(t *testing.T, seg string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n"))
	lines = lines[:len(lines)-2]
	if err := os.WriteFile(seg, append(bytes.Join(lines, []byte("\n")), '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	return lines
}

// countedCheckpoints signs a checkpoint every 40 records and never for
// the time that passed (an hour apart): which records a checkpoint covers,
// and so which are the unsigned tail the tests damage, does not depend on
// how fast a loaded machine writes them (a checkpoint of the second once
// covered the damaged line).
var countedCheckpoints = Options{CheckpointEvery: 40, CheckpointInterval: time.Hour}

func TestRecoveryCutsTornTail(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, dir, countedCheckpoints, 100, 1)
	seg := filepath.Join(dir, "epoch-000001", "seg-000001.jsonl")
	unseal(t, seg)
	before, _ := os.ReadFile(seg)
	torn := []byte(`{"body":{"agent":"agent-a","args":{"bytes":"1`)
	f, _ := os.OpenFile(seg, os.O_WRONLY|os.O_APPEND, 0)
	f.Write(torn)
	f.Close()

	// The verifier reports the torn line as a crash symptom, not a failure.
	rep, err := Verify(dir, VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(rep.Warnings, "\n"), "incomplete line of 45 bytes") {
		t.Fatalf("warnings %q", rep.Warnings)
	}

	w, err := Open(dir, Options{Key: logtest.Key(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	after, _ := os.ReadFile(seg)
	if !bytes.Equal(after, before) {
		t.Fatalf("segment not cut back to its last complete line (%d bytes, want %d)", len(after), len(before))
	}
	saved, _ := filepath.Glob(seg + ".torn-*")
	if len(saved) != 1 {
		t.Fatalf("torn bytes not saved: %v", saved)
	}
	if b, _ := os.ReadFile(saved[0]); !bytes.Equal(b, torn) {
		t.Fatalf("saved %q", b)
	}
	res, err := scan.Epoch(dir, 2, scan.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := res.Recovery
	if r == nil || r.Epoch != 1 || r.DroppedBytes != int64(len(torn)) || r.Offset != int64(len(before)) || r.Unsealed == 0 {
		t.Fatalf("recovery record %+v", r)
	}
	rep, err = Verify(dir, VerifyOptions{})
	if err != nil {
		t.Fatalf("after recovery: %v", err)
	}
	if w := strings.Join(rep.Warnings, "\n"); !strings.Contains(w, "epoch 1 was not sealed") || !strings.Contains(w, "45 bytes of an incomplete or damaged tail were cut from seg-000001.jsonl") {
		t.Fatalf("warnings after recovery: %s", w)
	}
}

func TestRecoveryCutsDamagedLineAfterLastCheckpoint(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, dir, countedCheckpoints, 100, 1)
	seg := filepath.Join(dir, "epoch-000001", "seg-000001.jsonl")
	lines := unseal(t, seg)
	// A block of zeros where the last records should be (a crash on a
	// filesystem that extended the file before the data reached it).
	last := len(lines) - 3
	lines[last] = bytes.Repeat([]byte{0}, len(lines[last]))
	os.WriteFile(seg, append(bytes.Join(lines, []byte("\n")), '\n'), 0o600)
	w, err := Open(dir, Options{Key: logtest.Key(t)})
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	res, err := scan.Epoch(dir, 2, scan.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if r := res.Recovery; r == nil || r.Records != int64(last) || !strings.Contains(r.Reason, "damaged record") {
		t.Fatalf("recovery %+v", res.Recovery)
	}
	if _, err := Verify(dir, VerifyOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestRecoveryRefusesDamageBeforeCheckpoint(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, dir, countedCheckpoints, 100, 1)
	seg := filepath.Join(dir, "epoch-000001", "seg-000001.jsonl")
	lines := unseal(t, seg)
	lines[10] = bytes.Replace(lines[10], []byte(`"allow"`), []byte(`"deny"`), 1)
	os.WriteFile(seg, append(bytes.Join(lines, []byte("\n")), '\n'), 0o600)
	_, err := Open(dir, Options{Key: logtest.Key(t)})
	var te *record.TamperError
	if !errors.As(err, &te) {
		t.Fatalf("Open on a tampered log: %v", err)
	}
	if !strings.Contains(err.Error(), "before its last signed checkpoint") || te.Err.Pos.Index != 11 || len(te.Hints()) == 0 {
		t.Fatalf("error %v (index %d)", err, te.Err.Pos.Index)
	}
	if eps, _ := logdir.ListEpochs(dir); len(eps) != 1 {
		t.Fatalf("a new epoch was started on a tampered log: %v", eps)
	}
}

func TestRecoveryMovesAsideEpochWithoutGenesis(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, dir, Options{}, 5, 1)
	// A writer died while creating epoch 2: directory and an empty segment.
	os.Mkdir(filepath.Join(dir, "epoch-000002"), 0o700)
	os.WriteFile(filepath.Join(dir, "epoch-000002", "seg-000001.jsonl"), []byte(`{"body":{"check`), 0o600)
	w, err := Open(dir, Options{Key: logtest.Key(t)})
	if err != nil {
		t.Fatal(err)
	}
	if e, _ := w.Epoch(); e != 2 {
		t.Fatalf("new epoch %d, want 2", e)
	}
	w.Close()
	if m, _ := filepath.Glob(filepath.Join(dir, "aborted-epoch-000002-*")); len(m) != 1 {
		t.Fatalf("aborted epoch not moved aside: %v", m)
	}
	if _, err := Verify(dir, VerifyOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestFatalWriteError makes the segment's descriptor refer to /dev/full
// (every write fails with ENOSPC): the Append fails, and so does every
// later one, with the same error; Close reports it too.
func TestFatalWriteError(t *testing.T) {
	dir := t.TempDir()
	w, err := Open(dir, Options{Key: logtest.Key(t)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Append(context.Background(), logtest.SampleCall(w, 0)); err != nil {
		t.Fatal(err)
	}
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer full.Close()
	// The segment's own descriptor, kept to give the disk its space back.
	seg, err := syscall.Dup(int(w.f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(seg)
	if err := syscall.Dup2(int(full.Fd()), int(w.f.Fd())); err != nil {
		t.Fatal(err)
	}
	_, err1 := w.Append(context.Background(), logtest.SampleCall(w, 1))
	var fe *FatalError
	if !errors.As(err1, &fe) || !errors.Is(err1, syscall.ENOSPC) {
		t.Fatalf("append on a full disk: %v", err1)
	}
	// For good: once the disk has room again, the writer still writes
	// nothing (a record after a failed write could follow a torn line).
	if err := syscall.Dup2(seg, int(w.f.Fd())); err != nil {
		t.Fatal(err)
	}
	segFile := filepath.Join(dir, "epoch-000001", "seg-000001.jsonl")
	before, err := os.ReadFile(segFile)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := w.Append(context.Background(), logtest.SampleCall(w, 2+i)); err != err1 {
			t.Fatalf("append %d after the fatal error, the disk having room again: %v", i, err)
		}
	}
	if after, _ := os.ReadFile(segFile); !bytes.Equal(after, before) {
		t.Fatalf("the stopped writer wrote %d bytes after its fatal error", len(after)-len(before))
	}
	if err := w.Checkpoint(); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("checkpoint: %v", err)
	}
	if err := w.Close(); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("close: %v", err)
	}
}

// TestCrashedTailIsReportedUnsigned: the records a crashed writer left after
// its last checkpoint were never signed by its key; the next epoch's genesis
// only fixes them as they were on disk when it started. Verify says so
// (Report.Unsigned, a warning that does not call them covered) and
// RequireSigned fails the log. An epoch without any checkpoint is unsigned
// as a whole.
func TestCrashedTailIsReportedUnsigned(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, dir, countedCheckpoints, 100, 1)
	seg := filepath.Join(dir, "epoch-000001", "seg-000001.jsonl")
	lines := unseal(t, seg)
	w, err := Open(dir, Options{Key: logtest.Key(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := Verify(dir, VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e1 := rep.Epochs[0]
	want := UnsignedRange{Epoch: 1, First: e1.LastCheckpointAt + 1, Last: int64(len(lines)) - 1, By: 2}
	if len(rep.Unsigned) != 1 || rep.Unsigned[0] != want || want.First > want.Last {
		t.Fatalf("unsigned %+v, want %+v", rep.Unsigned, want)
	}
	warn := strings.Join(rep.Warnings, "\n")
	if !strings.Contains(warn, "UNSIGNED") || strings.Contains(warn, "covered by") {
		t.Fatalf("warnings %s", warn)
	}
	_, err = Verify(dir, VerifyOptions{RequireSigned: true})
	var ve *record.VerifyError
	if !errors.As(err, &ve) || ve.Class != record.ClassUnsigned || ve.Pos.Epoch != 1 || ve.Pos.Index != want.First {
		t.Fatalf("RequireSigned: %v", err)
	}
}

// TestRecoveryOfAHugeTornTailIsBounded: a crash can leave a segment with a
// long run of zero bytes after its last line. Recovery read the whole
// segment, and then the whole tail, into memory (600 MiB of zeros: 2.7 GB
// peak RSS, 17 s); it reads both in bounded chunks and streams the tail to
// its side file, with the same result: the tail cut, saved byte for byte,
// and its size and SHA-256 in the recovery record.
func TestRecoveryOfAHugeTornTailIsBounded(t *testing.T) {
	const pad = 64 << 20
	dir := t.TempDir()
	writeLog(t, dir, Options{CheckpointEvery: 40, Durability: record.DurabilityInterval}, 100, 1)
	seg := filepath.Join(dir, "epoch-000001", "seg-000001.jsonl")
	unseal(t, seg)
	before, _ := os.ReadFile(seg)
	if err := os.Truncate(seg, int64(len(before))+pad); err != nil { // zeros, as a crash leaves them
		t.Fatal(err)
	}

	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	w, err := Open(dir, Options{Key: logtest.Key(t), Durability: record.DurabilityInterval})
	runtime.ReadMemStats(&m1)
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	alloc := m1.TotalAlloc - m0.TotalAlloc
	t.Logf("recovery of a %d MiB torn tail allocated %d MiB", pad>>20, alloc>>20)
	if alloc > pad/2 {
		t.Errorf("recovering a %d MiB torn tail allocated %d MiB", pad>>20, alloc>>20)
	}

	if after, _ := os.ReadFile(seg); !bytes.Equal(after, before) {
		t.Fatalf("segment not cut back to its last complete line (%d bytes, want %d)", len(after), len(before))
	}
	saved, _ := filepath.Glob(seg + ".torn-*")
	if len(saved) != 1 {
		t.Fatalf("torn bytes not saved: %v", saved)
	}
	f, err := os.Open(saved[0])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	n, _ := io.Copy(h, f)
	res, err := scan.Epoch(dir, 2, scan.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if r := res.Recovery; r == nil || n != pad || r.DroppedBytes != pad || !bytes.Equal(r.DroppedSHA256, h.Sum(nil)) || r.Offset != int64(len(before)) {
		t.Fatalf("recovery record %+v; side file %d bytes", r, n)
	}
}
