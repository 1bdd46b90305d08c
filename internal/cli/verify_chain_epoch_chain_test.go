package cli

// The epoch chain: epoch e's genesis records epoch e-1 as the writer found
// it (size, root, sealed), and a recovery record describes a crashed e-1.
// verify-chain compares both with epoch e-1 as it is now. These checks
// covered for each other: with any one of them disabled every test passed
// (found in review). Each test below fails with its own check disabled.

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/sumdb/tlog"

	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// openKeyed starts a writer on dir with key and no evidence.
func openKeyed(t *testing.T, dir string, key ed25519.PrivateKey) *auditlog.Writer {
	t.Helper()
	w, err := auditlog.Open(dir, auditlog.Options{Key: key, CheckpointEvery: 1000, CheckpointInterval: time.Hour, Durability: record.DurabilityGroup})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// crashedCopy copies the directory of a running writer (what a SIGKILL
// leaves) and closes the writer; the copy is returned.
func crashedCopy(t *testing.T, live string, w *auditlog.Writer) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "log")
	if err := os.CopyFS(dir, os.DirFS(live)); err != nil {
		t.Fatal(err)
	}
	w.Close()
	return dir
}

func epochSeg(dir string, epoch int) string {
	return filepath.Join(dir, fmt.Sprintf("epoch-%06d", epoch), "seg-000001.jsonl")
}

// recordsRoot is the RFC 6962 tree hash of lines, one leaf per line.
func recordsRoot(t *testing.T, lines [][]byte) []byte {
	t.Helper()
	var stored []tlog.Hash
	hr := tlog.HashReaderFunc(func(idx []int64) ([]tlog.Hash, error) {
		out := make([]tlog.Hash, len(idx))
		for i, x := range idx {
			out[i] = stored[x]
		}
		return out, nil
	})
	for i, l := range lines {
		hs, err := tlog.StoredHashes(int64(i), l, hr)
		if err != nil {
			t.Fatal(err)
		}
		stored = append(stored, hs...)
	}
	root, err := tlog.TreeHash(int64(len(lines)), hr)
	if err != nil {
		t.Fatal(err)
	}
	return root[:]
}

// editPredecessor rewrites the predecessor of the genesis (lines[0]),
// recomputes its statement and re-signs the epoch with key: what the
// holder of that epoch's key can do when the epoch is not attested.
func editPredecessor(t *testing.T, lines [][]byte, key ed25519.PrivateKey, edit func(p map[string]any)) {
	t.Helper()
	var line, body map[string]json.RawMessage
	if err := json.Unmarshal(lines[0], &line); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(line["body"], &body); err != nil {
		t.Fatal(err)
	}
	var p map[string]any
	if err := json.Unmarshal(body["predecessor"], &p); err != nil {
		t.Fatal(err)
	}
	edit(p)
	body["predecessor"], _ = json.Marshal(p)
	delete(body, "statement")
	raw, _ := json.Marshal(body)
	st, err := auditlog.StatementOf(raw)
	if err != nil {
		t.Fatal(err)
	}
	body["statement"], _ = json.Marshal(st.String())
	line["body"], _ = json.Marshal(body)
	raw, _ = json.Marshal(line)
	if lines[0], err = digest.Canonicalize(raw); err != nil {
		t.Fatal(err)
	}
	rechain(t, lines, 1, key)
}

// TestTailRewrittenAfterRestartFails: the unsigned tail a crashed epoch
// left is rewritten after the next epoch began: the next genesis fixed it
// as the writer found it, so verify-chain fails (exit 10), with every
// option an auditor has or none.
func TestTailRewrittenAfterRestartFails(t *testing.T) {
	f := newSNPFake(t)
	live := filepath.Join(t.TempDir(), "log")
	w1 := openAttested(t, live, f, auditlog.Options{CheckpointEvery: 1000, CheckpointInterval: time.Hour})
	appendCalls(t, w1, 5, "fs__read")
	if err := w1.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	appendCalls(t, w1, 3, "fs__delete_everything")
	dir := crashedCopy(t, live, w1)
	w2 := openAttested(t, dir, f, auditlog.Options{CheckpointEvery: 1000})
	appendCalls(t, w2, 2, "fs__read")
	w2.Close()
	if code, out, errOut := runCLI(t, "verify-chain", dir, "--roots", f.roots); code != 0 {
		t.Fatalf("genuine: exit %d\n%s%s", code, out, errOut)
	}
	seg := epochSeg(dir, 1)
	ls := readLines(t, seg)
	cp := lastIndexOfKind(ls, "checkpoint")
	for i := cp + 1; i < len(ls); i++ {
		ls[i] = bytes.ReplaceAll(ls[i], []byte("fs__delete_everything"), []byte("fs__read_everything__"))
	}
	_, anyKey, _ := ed25519.GenerateKey(rand.Reader) // signs nothing: no checkpoint follows cp
	rechain(t, ls, cp+1, anyKey)
	writeLines(t, seg, ls)
	code, out, errOut := runCLI(t, "verify-chain", dir, "--roots", f.roots)
	if code != exitcode.ExitLogInteg || !strings.Contains(errOut, "epoch 1") {
		t.Fatalf("a crashed epoch's tail rewritten after the restart: exit %d, want %d\n%s%s", code, exitcode.ExitLogInteg, out, errOut)
	}
}

// TestSealedEpochRewrittenWithItsOwnKeyFails: a sealed epoch rewritten and
// re-signed with its own key (a key that leaked after its epoch ended)
// after the next epoch began verifies on its own; the next genesis's
// predecessor root, which that key cannot change, fails it. A sealed epoch
// has no recovery record: the root is the only check.
func TestSealedEpochRewrittenWithItsOwnKeyFails(t *testing.T) {
	_, k1, _ := ed25519.GenerateKey(rand.Reader)
	_, k2, _ := ed25519.GenerateKey(rand.Reader)
	dir := filepath.Join(t.TempDir(), "log")
	w1 := openKeyed(t, dir, k1)
	appendCalls(t, w1, 5, "fs__delete_everything")
	v1 := w1.VerifierKey()
	w1.Close()
	w2 := openKeyed(t, dir, k2)
	appendCalls(t, w2, 2, "fs__read")
	v2 := w2.VerifierKey()
	w2.Close()
	args := []string{"verify-chain", dir, "--key", v1, "--key", v2, "--require-signed"}
	if code, out, errOut := runCLI(t, args...); code != 0 {
		t.Fatalf("genuine: exit %d\n%s%s", code, out, errOut)
	}
	seg := epochSeg(dir, 1)
	ls := readLines(t, seg)
	first := -1
	for i := range ls {
		if bytes.Contains(ls[i], []byte("fs__delete_everything")) {
			ls[i] = bytes.ReplaceAll(ls[i], []byte("fs__delete_everything"), []byte("fs__read_everything__"))
			if first < 0 {
				first = i
			}
		}
	}
	rechain(t, ls, first, k1)
	writeLines(t, seg, ls)
	// Epoch 1 alone verifies: it is signed by its own key.
	alone := filepath.Join(t.TempDir(), "log")
	if err := os.CopyFS(filepath.Join(alone, "epoch-000001"), os.DirFS(filepath.Dir(seg))); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := runCLI(t, "verify-chain", alone, "--key", v1, "--require-signed"); code != 0 {
		t.Fatalf("the re-signed epoch alone: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut := runCLI(t, args...)
	if code != exitcode.ExitLogInteg || !strings.Contains(errOut, "epoch 1's records hash to another root than epoch 2's genesis recorded") {
		t.Fatalf("a sealed epoch re-signed after the next began: exit %d, want %d\n%s%s", code, exitcode.ExitLogInteg, out, errOut)
	}
}

// TestRecordsAppendedToACrashedEpochAfterRestartFail: records appended to a
// crashed epoch's unsigned tail after the next epoch began are reported as
// appended (not only as a changed root).
func TestRecordsAppendedToACrashedEpochAfterRestartFail(t *testing.T) {
	dir, _, args := crashedThenRestarted(t, 4, "fs__read")
	seg := epochSeg(dir, 1)
	ls := readLines(t, seg)
	n := len(ls)
	for i := range 2 {
		forged := bytes.Replace(ls[n-1], []byte(`"agent":"agent-a"`), []byte(`"agent":"mallory"`), 1)
		ls = append(ls, setSeq(t, forged, n+i))
	}
	_, anyKey, _ := ed25519.GenerateKey(rand.Reader)
	rechain(t, ls, n, anyKey)
	writeLines(t, seg, ls)
	code, out, errOut := runCLI(t, args...)
	want := fmt.Sprintf("epoch 1 has %d records but had %d when epoch 2 began: 2 records were appended to it afterwards", n+2, n)
	if code != exitcode.ExitLogInteg || !strings.Contains(errOut, want) {
		t.Fatalf("records appended to a crashed epoch after the restart: exit %d, want %d and %q\n%s%s", code, exitcode.ExitLogInteg, want, out, errOut)
	}
}

// TestGenesisWithAFlippedSealedFlagFails: a genesis that says its
// predecessor was not sealed when it was (a writer that could start a new
// epoch without noticing a clean close, or a forgery by the holder of the
// new epoch's key) fails, although size and root match.
func TestGenesisWithAFlippedSealedFlagFails(t *testing.T) {
	_, k1, _ := ed25519.GenerateKey(rand.Reader)
	_, k2, _ := ed25519.GenerateKey(rand.Reader)
	dir := filepath.Join(t.TempDir(), "log")
	w1 := openKeyed(t, dir, k1)
	appendCalls(t, w1, 3, "fs__read")
	v1 := w1.VerifierKey()
	w1.Close()
	w2 := openKeyed(t, dir, k2)
	v2 := w2.VerifierKey()
	w2.Close()
	args := []string{"verify-chain", dir, "--key", v1, "--key", v2}
	seg := epochSeg(dir, 2)
	ls := readLines(t, seg)
	editPredecessor(t, ls, k2, func(p map[string]any) {
		if p["sealed"] != true {
			t.Fatalf("epoch 2's genesis says epoch 1 was not sealed: %v", p)
		}
		p["sealed"] = false
	})
	writeLines(t, seg, ls)
	code, out, errOut := runCLI(t, args...)
	if code != exitcode.ExitLogInteg || !strings.Contains(errOut, "epoch 2's genesis says epoch 1 was sealed=false, the log says true") {
		t.Fatalf("a flipped sealed flag: exit %d, want %d\n%s%s", code, exitcode.ExitLogInteg, out, errOut)
	}
}

// TestRecoveryRecordThatDisagreesFails: the recovery record describes the
// crashed epoch as the writer found it; a crashed epoch's tail rewritten
// after the restart, and the genesis's predecessor rewritten to match it
// by the holder of the new epoch's key (not attested), still fails on the
// recovery record left as it was.
func TestRecoveryRecordThatDisagreesFails(t *testing.T) {
	dir, k2, args := crashedThenRestarted(t, 3, "fs__delete_everything")
	if kindOf(readLines(t, epochSeg(dir, 2))[1]) != "recovery" {
		t.Fatal("epoch 2 has no recovery record")
	}
	seg1 := epochSeg(dir, 1)
	ls := readLines(t, seg1)
	cp := lastIndexOfKind(ls, "checkpoint")
	for i := cp + 1; i < len(ls); i++ {
		ls[i] = bytes.ReplaceAll(ls[i], []byte("fs__delete_everything"), []byte("fs__read_everything__"))
	}
	_, anyKey, _ := ed25519.GenerateKey(rand.Reader)
	rechain(t, ls, cp+1, anyKey)
	writeLines(t, seg1, ls)
	root := base64.StdEncoding.EncodeToString(recordsRoot(t, ls))
	seg2 := epochSeg(dir, 2)
	ls2 := readLines(t, seg2)
	editPredecessor(t, ls2, k2, func(p map[string]any) { p["root"] = root })
	writeLines(t, seg2, ls2)
	code, out, errOut := runCLI(t, args...)
	if code != exitcode.ExitLogInteg || !strings.Contains(errOut, "epoch 2's recovery record does not describe epoch 1 as it is now") {
		t.Fatalf("a recovery record that disagrees with its genesis: exit %d, want %d\n%s%s", code, exitcode.ExitLogInteg, out, errOut)
	}
}

// crashedThenRestarted writes an epoch of n calls of tool under its own key
// that crashes after its last checkpoint, and a second epoch, under another
// key, started on it with two calls; it checks that the genuine log
// verifies, and returns the directory, the second epoch's key and the
// verify-chain arguments that name both keys.
func crashedThenRestarted(t *testing.T, n int, tool string) (dir string, k2 ed25519.PrivateKey, args []string) {
	t.Helper()
	_, k1, _ := ed25519.GenerateKey(rand.Reader)
	_, k2, _ = ed25519.GenerateKey(rand.Reader)
	live := filepath.Join(t.TempDir(), "log")
	w1 := openKeyed(t, live, k1)
	appendCalls(t, w1, n, tool)
	v1 := w1.VerifierKey()
	dir = crashedCopy(t, live, w1)
	w2 := openKeyed(t, dir, k2)
	appendCalls(t, w2, 2, "fs__read")
	v2 := w2.VerifierKey()
	w2.Close()
	args = []string{"verify-chain", dir, "--key", v1, "--key", v2}
	if code, out, errOut := runCLI(t, args...); code != 0 {
		t.Fatalf("genuine: exit %d\n%s%s", code, out, errOut)
	}
	return dir, k2, args
}
