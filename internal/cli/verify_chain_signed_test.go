package cli

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/mod/sumdb/tlog"

	"github.com/confidential-mcp/cmcp/internal/ui"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
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
	if code != ui.ExitLogSig || !strings.Contains(out, "NOT VERIFIED") || strings.Contains(out, "✓ 0 checkpoints") ||
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
	if err := json.Unmarshal([]byte(out), &doc); err != nil || code != ui.ExitLogSig || doc.Status != "failed" || doc.CoveredThrough != nil || doc.Records != 4 || doc.ExitCode != ui.ExitLogSig {
		t.Fatalf("forged records after the carried checkpoint, JSON: exit %d, %+v, %v\n%s", code, doc, err, out)
	}
}

// segmentLog writes a sealed log of several segments; it returns its
// directory and key.
func segmentLog(t *testing.T) (string, string) {
	t.Helper()
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	dir := filepath.Join(t.TempDir(), "log")
	w, err := auditlog.Open(dir, auditlog.Options{Key: key, SegmentBytes: 8 << 10, Durability: auditlog.DurabilityInterval, CheckpointEvery: 10})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		if _, err := w.Append(context.Background(), &auditlog.Session{ID: fmt.Sprint("s", i), Event: "start", Agent: "a"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return dir, w.VerifierKey()
}
