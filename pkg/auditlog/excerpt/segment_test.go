package excerpt

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logtest"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"golang.org/x/mod/sumdb/tlog"
)

func TestVerifySegmentAlone(t *testing.T) {
	dir := t.TempDir()
	w := writeLog(t, dir, auditlog.Options{SegmentBytes: 8 << 10, CheckpointEvery: 7, Durability: record.DurabilityInterval}, 200, 1)
	keys := []string{w.VerifierKey()}
	segs, _ := filepath.Glob(filepath.Join(dir, "epoch-000001", "seg-*.jsonl"))
	if len(segs) < 4 {
		t.Fatalf("only %d segments", len(segs))
	}
	var total int64
	for _, s := range segs {
		r, err := VerifySegment(s, auditlog.VerifyOptions{Keys: keys})
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		if r.Unsealed != 0 || r.Checkpoints == 0 {
			t.Fatalf("%s: %+v", s, r)
		}
		total += r.Records
	}
	if rep, err := auditlog.Verify(dir, auditlog.VerifyOptions{Keys: keys}); err != nil || rep.Records != total {
		t.Fatalf("whole epoch %d records (%v), segments add up to %d", rep.Records, err, total)
	}

	// A frontier hash changed in the segment record of segment 3: the next
	// checkpoint in the file no longer matches.
	p := segs[2]
	b, _ := os.ReadFile(p)
	lines := bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n"))
	e, _ := record.ParseLine(lines[0])
	r, _ := record.DecodeBody(record.KindSegment, e.Body)
	s := r.(*record.Segment)
	s.Frontier[0][0] ^= 1
	body, _ := record.EncodeBody(s)
	lines[0] = record.AppendLine(nil, record.KindSegment, body, e.Prev, e.Seq, string(e.TS))
	// Re-link the unsigned records up to the file's first checkpoint, as a
	// forger would.
	for i := 1; i < len(lines); i++ {
		e, _ := record.ParseLine(lines[i])
		lines[i] = record.AppendLine(nil, e.Kind, e.Body, hashOf(lines[i-1]), e.Seq, string(e.TS))
		if e.Kind == record.KindCheckpoint {
			break
		}
	}
	os.WriteFile(p, append(bytes.Join(lines, []byte("\n")), '\n'), 0o600)
	_, err := VerifySegment(p, auditlog.VerifyOptions{Keys: keys})
	var ve *record.VerifyError
	if !errors.As(err, &ve) || ve.Class != record.ClassIntegrity || ve.Pos.Kind != record.KindCheckpoint {
		t.Fatalf("forged frontier: %v", err)
	}
	if _, err := VerifySegment(segs[1], auditlog.VerifyOptions{}); err == nil {
		t.Fatal("a segment verified without a trusted key")
	}
	if _, err := VerifySegment(segs[1], auditlog.VerifyOptions{Keys: []string{writeLog(t, t.TempDir(), auditlog.Options{}, 1, 1).VerifierKey()}}); !errors.As(err, &ve) || ve.Class != record.ClassKey {
		t.Fatalf("foreign key: %v", err)
	}
}

func hashOf(line []byte) tlog.Hash { return tlog.RecordHash(line) }

// TestVerifySegmentErrorPosition: errors name the segment's epoch and the
// record index. Before, every error said "epoch 0", and a failure on the
// first record of a segment said "record 0".
func TestVerifySegmentErrorPosition(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, dir, auditlog.Options{SegmentBytes: 8 << 10, CheckpointEvery: 7, Durability: record.DurabilityInterval}, 100, 1)
	seg := filepath.Join(dir, "epoch-000001", "seg-000003.jsonl")
	// A key that is not the epoch's: the carried checkpoint fails on record 0 of the file.
	_, err := VerifySegment(seg, auditlog.VerifyOptions{Keys: []string{writeLog(t, t.TempDir(), auditlog.Options{Key: otherKey(t), Durability: record.DurabilityInterval}, 1, 1).VerifierKey()}})
	var ve *record.VerifyError
	b, _ := os.ReadFile(seg)
	e, _ := record.ParseLine(bytes.SplitN(b, []byte("\n"), 2)[0])
	if !errors.As(err, &ve) || ve.Pos.Epoch != 1 || ve.Pos.Index != e.Seq || ve.Pos.Line != 1 {
		t.Fatalf("untrusted key: %v (position %+v, want epoch 1 record %d)", err, ve.Pos, e.Seq)
	}
	// A segment copied out of its directory: the epoch comes from its origin.
	lines := bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n"))
	lines[3] = bytes.Replace(lines[3], []byte(`"seq":"`), []byte(`"seq":"9`), 1)
	out := filepath.Join(t.TempDir(), "copy.jsonl")
	os.WriteFile(out, append(bytes.Join(lines, []byte("\n")), '\n'), 0o600)
	_, err = VerifySegment(out, auditlog.VerifyOptions{Keys: []string{keyOf(t, dir)}})
	if !errors.As(err, &ve) || ve.Pos.Epoch != 1 || ve.Pos.Line != 4 {
		t.Fatalf("copied segment: %v (position %+v)", err, ve.Pos)
	}
}

func otherKey(t *testing.T) ed25519.PrivateKey {
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func keyOf(t *testing.T, dir string) string {
	rep, err := auditlog.Verify(dir, auditlog.VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return rep.Epochs[0].Key
}

// TestVerifySegmentNeedsACheckpointInTheFile: a segment file that holds its
// genuine first record (carrying the previous segment's checkpoint)
// followed by linked records no checkpoint signs is not verified: the
// carried checkpoint covers only records before the file. A segment with
// checkpoints reports the records its last one covers.
func TestVerifySegmentNeedsACheckpointInTheFile(t *testing.T) {
	dir := t.TempDir()
	w := writeLog(t, dir, auditlog.Options{SegmentBytes: 8 << 10, CheckpointEvery: 7, Durability: record.DurabilityInterval}, 100, 1)
	keys := []string{w.VerifierKey()}
	seg := filepath.Join(dir, "epoch-000001", "seg-000002.jsonl")
	r, err := VerifySegment(seg, auditlog.VerifyOptions{Keys: keys})
	if err != nil || r.CoveredThrough == nil || *r.CoveredThrough != r.LastCheckpoint.Size-1 || r.LastCheckpoint.Size <= r.FirstIndex {
		t.Fatalf("intact segment: %+v, %v", r, err)
	}

	b, _ := os.ReadFile(seg)
	lines := bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n"))
	first, _ := record.ParseLine(lines[0])
	tmpl, _ := record.ParseLine(lines[1])
	if tmpl.Kind == record.KindCheckpoint {
		tmpl, _ = record.ParseLine(lines[2])
	}
	forged := [][]byte{lines[0]}
	for i := range 3 {
		forged = append(forged, record.AppendLine(nil, tmpl.Kind, tmpl.Body, hashOf(forged[i]), first.Seq+1+int64(i), "2099-01-01T00:00:00Z"))
	}
	os.WriteFile(seg, append(bytes.Join(forged, []byte("\n")), '\n'), 0o600)
	r, err = VerifySegment(seg, auditlog.VerifyOptions{Keys: keys})
	var ve *record.VerifyError
	if !errors.As(err, &ve) || ve.Class != record.ClassUnsigned || r.Checkpoints != 0 || r.CoveredThrough != nil || r.Records != 4 {
		t.Fatalf("segment without a checkpoint: %+v, %v", r, err)
	}

	// The first segment: the genuine genesis, which no checkpoint before
	// it signs, followed by forged, linked records.
	seg1 := filepath.Join(dir, "epoch-000001", "seg-000001.jsonl")
	b, _ = os.ReadFile(seg1)
	lines = bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n"))
	first, _ = record.ParseLine(lines[0])
	forged = [][]byte{lines[0]}
	for i := range 3 {
		forged = append(forged, record.AppendLine(nil, tmpl.Kind, tmpl.Body, hashOf(forged[i]), first.Seq+1+int64(i), "2099-01-01T00:00:00Z"))
	}
	os.WriteFile(seg1, append(bytes.Join(forged, []byte("\n")), '\n'), 0o600)
	r, err = VerifySegment(seg1, auditlog.VerifyOptions{Keys: keys})
	if !errors.As(err, &ve) || ve.Class != record.ClassUnsigned || r.Checkpoints != 0 || r.CoveredThrough != nil || r.Records != 4 {
		t.Fatalf("first segment without a checkpoint: %+v, %v", r, err)
	}
}

// TestVerifySegmentRefusesAFIFO: a FIFO where a segment should be is
// refused by the single-segment check, instead of blocking it for ever in
// open (auditlog's TestFIFOInPlaceOfASegmentIsRefused: the verifier, the
// reader and the writer's recovery).
func TestVerifySegmentRefusesAFIFO(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, dir, auditlog.Options{}, 20, 1)
	segs, _ := filepath.Glob(filepath.Join(dir, "epoch-*", "seg-*.jsonl"))
	last := segs[len(segs)-1]
	if err := os.Remove(last); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(last, 0o600); err != nil {
		t.Fatal(err)
	}
	err := logtest.Within(t, 10*time.Second, "VerifySegment", func() error {
		_, err := VerifySegment(last, auditlog.VerifyOptions{})
		return err
	})
	if err == nil {
		t.Fatal("VerifySegment accepted a FIFO")
	}
}

// TestVerifySegmentRefusesRecordsAfterSeal: unsigned records appended after
// a closed epoch's seal and final checkpoint fail the check of their file
// on its own (verify-chain --segment), as they fail Verify
// (TestRecordsAfterSeal).
func TestVerifySegmentRefusesRecordsAfterSeal(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, dir, auditlog.Options{CheckpointEvery: 40, Durability: record.DurabilityInterval}, 100, 1)
	seg, _, _, n := logtest.AppendAfterSeal(t, dir)
	rep, err := auditlog.Verify(dir, auditlog.VerifyOptions{})
	var ve *record.VerifyError
	if !errors.As(err, &ve) || ve.Class != record.ClassIntegrity || !strings.Contains(err.Error(), "a call record after the epoch's seal") || ve.Pos.Index != n {
		t.Fatalf("Verify = %v, want an integrity failure at record %d", err, n)
	}
	// The same file checked on its own (verify-chain --segment).
	_, err = VerifySegment(seg, auditlog.VerifyOptions{Keys: []string{rep.Epochs[0].Key}})
	if !errors.As(err, &ve) || ve.Class != record.ClassIntegrity || !strings.Contains(err.Error(), "a call record after the epoch's seal") {
		t.Fatalf("VerifySegment = %v, want an integrity failure", err)
	}
}
