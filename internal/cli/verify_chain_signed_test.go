package cli

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/mod/sumdb/tlog"

	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/c2sp"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// What verify-chain counts as verified is what a signature covers: records
// no checkpoint signs are never in a ✓ line, a count, a time range or a
// "VERIFIED" result.

// forgeAfter returns lines[:n] followed by k records linked to them, copied
// from template with their seq set (and, if ts is not empty, their time):
// what anyone able to write the file can add without a key.
func forgeAfter(t *testing.T, lines [][]byte, n, k int, template []byte, ts string) [][]byte {
	t.Helper()
	out := append([][]byte{}, lines[:n]...)
	var last struct {
		Seq string `json:"seq"`
	}
	if err := json.Unmarshal(out[n-1], &last); err != nil {
		t.Fatal(err)
	}
	var seq int
	fmt.Sscan(last.Seq, &seq)
	for i := range k {
		l := setSeq(t, template, seq+1+i)
		var m map[string]json.RawMessage
		json.Unmarshal(l, &m)
		prev := tlog.RecordHash(out[len(out)-1])
		m["prev"], _ = json.Marshal(base64.StdEncoding.EncodeToString(prev[:]))
		if ts != "" {
			m["ts"], _ = json.Marshal(ts)
		}
		raw, _ := json.Marshal(m)
		out = append(out, setSeq(t, raw, seq+1+i))
	}
	return out
}

// TestVerifyChainSegmentWithoutItsOwnCheckpointIsNotVerified: a segment
// file holding its genuine first record (which carries the previous
// segment's checkpoint) and forged, linked records after it was reported
// "Verified segment", "✓ 0 checkpoints in the file: signatures by a
// trusted key valid", JSON "verified", exit 0. It is NOT VERIFIED (exit
// 11); a segment with checkpoints says which records its last one covers.
func TestVerifyChainSegmentWithoutItsOwnCheckpointIsNotVerified(t *testing.T) {
	l, w := segmentLog(t)
	seg := filepath.Join(l, "epoch-000001", "seg-000002.jsonl")
	code, out, errOut := runCLI(t, "verify-chain", "--segment", seg, "--key", w)
	ls := readLines(t, seg)
	cpAt := lastIndexOfKind(ls, "checkpoint")
	var cp struct {
		Seq string `json:"seq"`
	}
	json.Unmarshal(ls[cpAt], &cp)
	var cpSeq int
	fmt.Sscan(cp.Seq, &cpSeq)
	want := fmt.Sprintf("Result: VERIFIED through record %d of epoch 1: ", cpSeq-1)
	if code != 0 || !strings.Contains(out, want) {
		t.Fatalf("intact segment: exit %d, want %q\n%s%s", code, want, out, errOut)
	}
	code, out, _ = runCLI(t, "-o", "json", "verify-chain", "--segment", seg, "--key", w)
	if code != 0 || !strings.Contains(out, fmt.Sprintf(`"covered_through": %d`, cpSeq-1)) {
		t.Fatalf("intact segment, JSON: exit %d\n%s", code, out)
	}

	tmpl := ls[1]
	if kindOf(tmpl) == "checkpoint" {
		tmpl = ls[2]
	}
	writeLines(t, seg, forgeAfter(t, ls, 1, 3, tmpl, ""))
	code, out, errOut = runCLI(t, "verify-chain", "--segment", seg, "--key", w)
	if code != exitcode.ExitLogSig || !strings.Contains(out, "NOT VERIFIED") || strings.Contains(out, "✓ 0 checkpoints") ||
		strings.Contains(out, "Verified segment") || strings.Contains(out, "Result: VERIFIED") {
		t.Fatalf("forged records after the carried checkpoint: exit %d\n%s%s", code, out, errOut)
	}
	code, out, _ = runCLI(t, "-o", "json", "verify-chain", "--segment", seg, "--key", w)
	var doc struct {
		Status         string `json:"status"`
		CoveredThrough *int64 `json:"covered_through"`
		Records        int64  `json:"records"`
		ExitCode       int    `json:"exit_code"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil || code != exitcode.ExitLogSig || doc.Status != "failed" || doc.CoveredThrough != nil || doc.Records != 4 || doc.ExitCode != exitcode.ExitLogSig {
		t.Fatalf("forged records after the carried checkpoint, JSON: exit %d, %+v, %v\n%s", code, doc, err, out)
	}

	// The first segment: its genuine genesis record, which no checkpoint
	// before it signs, and forged, linked records after it.
	seg1 := filepath.Join(l, "epoch-000001", "seg-000001.jsonl")
	ls1 := readLines(t, seg1)
	tmpl = ls1[1]
	if kindOf(tmpl) == "checkpoint" {
		tmpl = ls1[2]
	}
	writeLines(t, seg1, forgeAfter(t, ls1, 1, 3, tmpl, ""))
	code, out, errOut = runCLI(t, "verify-chain", "--segment", seg1, "--key", w)
	if code != exitcode.ExitLogSig || !strings.Contains(out, "NOT VERIFIED") || strings.Contains(out, "Result: VERIFIED") {
		t.Fatalf("the genesis and forged records after it: exit %d\n%s%s", code, out, errOut)
	}
	code, out, _ = runCLI(t, "-o", "json", "verify-chain", "--segment", seg1, "--key", w)
	doc.Status, doc.CoveredThrough = "", nil
	if err := json.Unmarshal([]byte(out), &doc); err != nil || code != exitcode.ExitLogSig || doc.Status != "failed" || doc.CoveredThrough != nil {
		t.Fatalf("the genesis and forged records after it, JSON: exit %d, %+v, %v\n%s", code, doc, err, out)
	}
}

// segmentLog writes a sealed log of several segments; it returns its
// directory and key.
func segmentLog(t *testing.T) (string, string) {
	t.Helper()
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	dir := filepath.Join(t.TempDir(), "log")
	w, err := auditlog.Open(dir, auditlog.Options{Key: key, SegmentBytes: 8 << 10, Durability: record.DurabilityInterval, CheckpointEvery: 10})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		if _, err := w.Append(context.Background(), &record.Session{ID: fmt.Sprint("s", i), Event: "start", Agent: "a"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return dir, w.VerifierKey()
}

// crashedOnceRestarted writes epoch 1 (genesis, a session record, a
// checkpoint, then a record no checkpoint signs), SIGKILLs it and restarts
// the gateway once: epoch 2 follows the crashed epoch 1.
func crashedOnceRestarted(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "audit")
	w := openRarelySigning(t, dir)
	w.Append(ctx, &record.Session{ID: "s1", Event: "start", Agent: "alice"})
	if err := w.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	w.Append(ctx, &record.Session{ID: "s2", Event: "start", Agent: "alice"})
	crashed := snapshot(t, dir)
	w.Close()
	openRarelySigning(t, crashed).Close()
	return crashed
}

// TestNewestEpochWithOnlyItsGenesis: a crashed epoch 1 followed by an
// epoch 2 that holds only its genesis (no checkpoint). verify-chain said
// "Epoch 2's signed genesis fixes them as they were on disk" though nothing
// signs that genesis, printed no Result line (yet exit 0, "verified"), and
// --save-checkpoint failed "the log has no checkpoint to save" although
// epoch 1 has one. The binding is reported unsigned, the result is what
// epoch 1's last checkpoint signs, and that checkpoint is the one saved.
func TestNewestEpochWithOnlyItsGenesis(t *testing.T) {
	dir := crashedOnceRestarted(t)
	seg2 := filepath.Join(dir, "epoch-000002", "seg-000001.jsonl")
	writeLines(t, seg2, readLines(t, seg2)[:1])

	cp := lastIndexOfKind(readLines(t, filepath.Join(dir, "epoch-000001", "seg-000001.jsonl")), "checkpoint")
	code, out, errOut := runCLI(t, "verify-chain", dir)
	want := fmt.Sprintf("Result: VERIFIED through record %d of epoch 1: records 0-%d (%d records) are signed by epoch 1's last checkpoint, which is record %d", cp-1, cp-1, cp, cp)
	if code != 0 || strings.Contains(out, "signed genesis") || !strings.Contains(out, "no checkpoint of epoch 2 signs its genesis") || !strings.Contains(out, want) {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	saved := filepath.Join(t.TempDir(), "seen.cp")
	code, out, errOut = runCLI(t, "verify-chain", dir, "--save-checkpoint", saved)
	if code != 0 || !strings.Contains(out, "Saved checkpoint cmcp.local/audit/epoch-000001-") {
		t.Fatalf("--save-checkpoint: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := runCLI(t, "verify-chain", dir, "--checkpoint", saved); code != 0 {
		t.Fatalf("--checkpoint with the saved one: exit %d\n%s%s", code, out, errOut)
	}
	code, out, _ = runCLI(t, "-o", "json", "verify-chain", dir)
	var doc struct {
		Newest *struct {
			Size int64 `json:"size"`
		} `json:"newest_checkpoint"`
		NewestEpoch int `json:"newest_checkpoint_epoch"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil || code != 0 || doc.Newest == nil || doc.Newest.Size != int64(cp) || doc.NewestEpoch != 1 {
		t.Fatalf("JSON: exit %d, %+v, %v\n%s", code, doc, err, out)
	}

	// No checkpoint anywhere (epoch 1 cut to its genesis, epoch 2 removed):
	// nothing is verified, and the result says so (exit 11).
	os.RemoveAll(filepath.Join(dir, "epoch-000002"))
	seg1 := filepath.Join(dir, "epoch-000001", "seg-000001.jsonl")
	writeLines(t, seg1, readLines(t, seg1)[:1])
	code, out, errOut = runCLI(t, "verify-chain", dir)
	if code != exitcode.ExitLogSig || !strings.Contains(out, "Result: NOT VERIFIED: no checkpoint in the log signs any of its records") || strings.Contains(out, "✓ 0 checkpoints") {
		t.Fatalf("no checkpoint: exit %d\n%s%s", code, out, errOut)
	}
	code, out, _ = runCLI(t, "-o", "json", "verify-chain", dir)
	if code != exitcode.ExitLogSig || !strings.Contains(out, `"status": "failed"`) || !strings.Contains(out, `"class": "unsigned"`) {
		t.Fatalf("no checkpoint, JSON: exit %d\n%s", code, out)
	}

	// With a checkpoint of epoch 2 (the intact restart), its genesis is signed.
	dir = crashedOnceRestarted(t)
	if code, out, errOut := runCLI(t, "verify-chain", dir); code != 0 || !strings.Contains(out, "Epoch 2's signed genesis") ||
		!strings.Contains(out, "Result: VERIFIED through record ") || !strings.Contains(out, " of epoch 2: ") {
		t.Fatalf("intact restart: exit %d\n%s%s", code, out, errOut)
	}
}

// TestSummaryCountsOnlySignedRecords: three forged records dated 2099
// appended to the newest epoch's unsigned tail were counted in the ✓
// summary ("✓ N records ... to 2099-01-01") and in the JSON records, first
// and last of a "verified" document. The ✓ line and the JSON count and
// date only records a checkpoint signs; the rest are counted apart.
func TestSummaryCountsOnlySignedRecords(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "audit")
	w := openRarelySigning(t, dir)
	for i := range 3 {
		w.Append(ctx, &record.Session{ID: fmt.Sprint("s", i), Event: "start", Agent: "alice"})
	}
	if err := w.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	w.Append(ctx, &record.Session{ID: "s9", Event: "start", Agent: "alice"})
	crashed := snapshot(t, dir) // the newest epoch, unsealed, one record after its checkpoint
	w.Close()
	seg := filepath.Join(crashed, "epoch-000001", "seg-000001.jsonl")
	ls := readLines(t, seg)
	cp := lastIndexOfKind(ls, "checkpoint")
	ls = forgeAfter(t, ls, len(ls), 3, ls[len(ls)-1], "2099-01-01T00:00:00Z")
	writeLines(t, seg, ls)
	signed, unsigned := cp+1, len(ls)-cp-1

	code, out, errOut := runCLI(t, "verify-chain", crashed)
	if code != 0 || strings.Contains(out, "2099") || !strings.Contains(out, fmt.Sprintf("✓ %d signed records (checkpoints included)", signed)) ||
		!strings.Contains(out, fmt.Sprintf("! %d records no signature covers", unsigned)) {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	code, out, _ = runCLI(t, "-o", "json", "verify-chain", crashed)
	var doc struct {
		Status          string `json:"status"`
		Records         int    `json:"records"`
		UnsignedRecords int    `json:"unsigned_records"`
		Last            string `json:"last"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil || code != 0 || doc.Records != signed || doc.UnsignedRecords != unsigned || doc.Last == "" || strings.HasPrefix(doc.Last, "2099") {
		t.Fatalf("JSON: exit %d, %+v, %v\n%s", code, doc, err, out)
	}

	// An earlier epoch's UNSIGNED records are counted apart too.
	openRarelySigning(t, crashed).Close()
	code, out, _ = runCLI(t, "-o", "json", "verify-chain", crashed)
	doc.UnsignedRecords = 0
	if err := json.Unmarshal([]byte(out), &doc); err != nil || code != 0 || doc.UnsignedRecords != unsigned || strings.HasPrefix(doc.Last, "2099") {
		t.Fatalf("after restart, JSON: exit %d, %+v, %v\n%s", code, doc, err, out)
	}
}

// TestProveAnUnsignedRecordOfACrashedEpoch: --prove for a record in the
// tail a crashed epoch left said it "is in the unsealed tail: no checkpoint
// covers it yet", exit 2 with a usage hint. No checkpoint of that epoch
// will ever cover it: it is UNSIGNED, and that is a verification finding
// (exit 11), not a usage error.
func TestProveAnUnsignedRecordOfACrashedEpoch(t *testing.T) {
	dir := crashedOnceRestarted(t)
	last := len(readLines(t, filepath.Join(dir, "epoch-000001", "seg-000001.jsonl"))) - 1
	code, out, errOut := runCLI(t, "verify-chain", dir, "--prove", fmt.Sprint(last), "--epoch", "1")
	if code != exitcode.ExitLogSig || !strings.Contains(errOut, "UNSIGNED") || !strings.Contains(errOut, "no proof can exist") ||
		strings.Contains(errOut, "unsealed tail") || strings.Contains(errOut, "--help") {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	// A signed record of the same epoch is proved as before.
	if code, out, errOut := runCLI(t, "verify-chain", dir, "--prove", "0", "--epoch", "1"); code != 0 || !strings.HasPrefix(out, c2sp.ProofHeader) {
		t.Fatalf("signed record: exit %d\n%s%s", code, out, errOut)
	}

	// A record after the last checkpoint of the newest epoch, still open
	// (no later epoch began): a checkpoint may yet cover it, so it is
	// "not covered yet", a usage error, never UNSIGNED.
	ctx := context.Background()
	live := filepath.Join(t.TempDir(), "audit")
	w := openRarelySigning(t, live)
	w.Append(ctx, &record.Session{ID: "s1", Event: "start", Agent: "alice"})
	if err := w.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	w.Append(ctx, &record.Session{ID: "s2", Event: "start", Agent: "alice"})
	open := snapshot(t, live)
	w.Close()
	last = len(readLines(t, filepath.Join(open, "epoch-000001", "seg-000001.jsonl"))) - 1
	code, out, errOut = runCLI(t, "verify-chain", open, "--prove", fmt.Sprint(last), "--epoch", "1")
	if code != exitcode.ExitUsage || !strings.Contains(errOut, "no checkpoint covers it yet") || strings.Contains(errOut, "UNSIGNED") {
		t.Fatalf("record %d after the newest epoch's last checkpoint: exit %d\n%s%s", last, code, out, errOut)
	}
}
