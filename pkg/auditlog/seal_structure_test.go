package auditlog

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/confidential-mcp/cmcp/pkg/auditlog/c2sp"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logtest"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"github.com/confidential-mcp/cmcp/pkg/digest"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// TestRecordsAfterSeal: an epoch closed by the writer ends with seal and
// one checkpoint. Before, a checkpoint signing records after them (a key
// holder extending a closed epoch) verified, unsigned records appended
// after them (no key needed) were only an ordinary "unsealed tail", and a
// recovery record could sit anywhere. (The single-segment check of the same
// file: excerpt's TestVerifySegmentRefusesRecordsAfterSeal.)
func TestRecordsAfterSeal(t *testing.T) {
	dir := t.TempDir()
	w := writeLog(t, dir, Options{CheckpointEvery: 40, Durability: record.DurabilityInterval}, 100, 1)

	// Unsigned records after the final checkpoint: refused (they once were
	// only a warning, and the log verified).
	seg, orig, lines, n := logtest.AppendAfterSeal(t, dir)
	rep, err := Verify(dir, VerifyOptions{})
	var ve *record.VerifyError
	if !errors.As(err, &ve) || ve.Class != record.ClassIntegrity || !strings.Contains(err.Error(), "a call record after the epoch's seal") || ve.Pos.Index != n {
		t.Fatalf("Verify = %v, want an integrity failure at record %d", err, n)
	}

	// Signed by the key after the seal: refused.
	signer, _, err := c2sp.NewNoteKeys(rep.Epochs[0].Origin, w.opts.Key)
	if err != nil {
		t.Fatal(err)
	}
	cpLine := signedCheckpointAfter(t, signer, rep.Epochs[0].Origin, lines, n)
	if err := os.WriteFile(seg, append(bytes.Clone(orig), append(cpLine, '\n')...), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Verify(dir, VerifyOptions{})
	if !errors.As(err, &ve) || ve.Class != record.ClassIntegrity || !strings.Contains(err.Error(), "a checkpoint after the epoch's seal") || ve.Pos.Index != n {
		t.Fatalf("Verify = %v, want an integrity failure at record %d", err, n)
	}

	// A recovery record anywhere but index 1 (here: appended to the
	// unsealed tail of a crashed epoch).
	recovery := []byte(`{"body":{"dropped_bytes":"0","dropped_sha256":"` + base64.StdEncoding.EncodeToString(make([]byte, 32)) + `","epoch":"1","file":"seg-000001.jsonl","offset":"0","origin":"x/epoch-000001-00000000","reason":"x","records":"1","root":"` + base64.StdEncoding.EncodeToString(make([]byte, 32)) + `","unsealed":"0"},"kind":"recovery","prev":"","seq":"0","ts":"2026-01-01T00:00:00Z","v":1}`)
	kept := append([][]byte{}, lines[:n-2]...)
	rl := logtest.Relink(t, recovery, kept[len(kept)-1], n-2)
	os.WriteFile(seg, append(bytes.Join(append(kept, rl), []byte("\n")), '\n'), 0o600)
	_, err = Verify(dir, VerifyOptions{})
	if !errors.As(err, &ve) || ve.Class != record.ClassIntegrity || !strings.Contains(err.Error(), "a recovery record at index") {
		t.Fatalf("Verify = %v, want an integrity failure for the recovery record", err)
	}
	os.WriteFile(seg, orig, 0o600)
}

// signedCheckpointAfter returns a checkpoint line at index size over lines,
// signed with signer: what a holder of the epoch key can write.
func signedCheckpointAfter(t *testing.T, signer note.Signer, origin string, lines [][]byte, size int64) []byte {
	t.Helper()
	var leaves []tlog.Hash
	for _, l := range lines {
		leaves = append(leaves, tlog.RecordHash(l))
	}
	root, err := tlog.TreeHash(size, logtest.MemHashes(logtest.StoredHashes(t, leaves)))
	if err != nil {
		t.Fatal(err)
	}
	msg, err := note.Sign(&note.Note{Text: origin + "\n" + strconv.FormatInt(size, 10) + "\n" + base64.StdEncoding.EncodeToString(root[:]) + "\n"}, signer)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(map[string]string{"note": string(msg)})
	prev := tlog.RecordHash(lines[size-1])
	line := `{"body":` + string(body) + `,"kind":"checkpoint","prev":"` + base64.StdEncoding.EncodeToString(prev[:]) + `","seq":"` + strconv.FormatInt(size, 10) + `","v":1}`
	out, err := digest.Canonicalize([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestRecoveryAfterSealedEpochWithTornTail: bytes appended to a sealed
// epoch (a partial line after its final checkpoint) are cut by the next
// start. Before, the new genesis then described its predecessor as unsealed
// while what was left was sealed, and the log failed verification forever
// ("genesis says epoch 1 was sealed=false, the log says true").
func TestRecoveryAfterSealedEpochWithTornTail(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, dir, Options{CheckpointEvery: 40, Durability: record.DurabilityInterval}, 50, 1)
	seg := filepath.Join(dir, "epoch-000001", "seg-000001.jsonl")
	f, err := os.OpenFile(seg, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"body":{"part`)
	f.Close()
	w, err := Open(dir, Options{Key: logtest.Key(t)})
	if err != nil {
		t.Fatal(err)
	}
	// What was recovered is available to the caller (the gateway logs it).
	if r := w.Recovery(); r == nil || r.Epoch != 1 || r.DroppedBytes != int64(len(`{"body":{"part`)) || r.SavedAs == "" {
		t.Fatalf("Writer.Recovery() = %+v", r)
	}
	w.Close()
	// After a clean close there is nothing to recover.
	w, err = Open(dir, Options{Key: logtest.Key(t)})
	if err != nil {
		t.Fatal(err)
	}
	if r := w.Recovery(); r != nil {
		t.Fatalf("Writer.Recovery() after a sealed epoch = %+v", r)
	}
	w.Close()
	rep, err := Verify(dir, VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r := rep.Epochs[1].Recovery; len(rep.Epochs) != 3 || !rep.Epochs[0].Sealed || r == nil || r.DroppedBytes != int64(len(`{"body":{"part`)) {
		t.Fatalf("epoch 1 sealed=%v, recovery %+v", rep.Epochs[0].Sealed, r)
	}
}

// TestRecoveryCutsRecordsAfterASeal: records someone appended to a sealed
// epoch are not taken into the next epoch's chain as that epoch's records:
// the next start cuts them (kept aside, described in its recovery record),
// and the predecessor it names is the sealed epoch as the writer closed it.
func TestRecoveryCutsRecordsAfterASeal(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, dir, Options{CheckpointEvery: 40, Durability: record.DurabilityInterval}, 50, 1)
	seg := filepath.Join(dir, "epoch-000001", "seg-000001.jsonl")
	orig, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.Split(bytes.TrimSuffix(orig, []byte("\n")), []byte("\n"))
	n := int64(len(lines))
	extra := logtest.Relink(t, lines[5], lines[n-1], n)
	if err := os.WriteFile(seg, append(append(bytes.Clone(orig), extra...), '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	w, err := Open(dir, Options{Key: logtest.Key(t)})
	if err != nil {
		t.Fatal(err)
	}
	r := w.Recovery()
	w.Close()
	if r == nil || r.DroppedBytes != int64(len(extra)+1) || !strings.Contains(r.Reason, "after the epoch's seal") {
		t.Fatalf("recovery %+v", r)
	}
	rep, err := Verify(dir, VerifyOptions{RequireSigned: true})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Epochs[0].Sealed || rep.Epochs[0].Records != n || len(rep.Unsigned) != 0 {
		t.Fatalf("epoch 1: sealed %v, %d records, unsigned %v", rep.Epochs[0].Sealed, rep.Epochs[0].Records, rep.Unsigned)
	}
}
