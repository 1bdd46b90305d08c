package auditlog

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/confidential-mcp/cmcp/pkg/auditlog/c2sp"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logdir"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logtest"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// writeEpochs writes epochs with a log identity and returns every log
// checkpoint they made, in order.
func writeEpochs(t *testing.T, dir string, logKey ed25519.PrivateKey, records ...int) []LogCheckpoint {
	t.Helper()
	var cps []LogCheckpoint
	for _, n := range records {
		w, err := Open(dir, Options{Key: logtest.Key(t), Name: "test.example/audit", CheckpointEvery: 7,
			Log: &LogIdentity{Origin: "test.example/gw1", Key: logKey, OnCheckpoint: func(c LogCheckpoint) { cps = append(cps, c) }}})
		if err != nil {
			t.Fatal(err)
		}
		for i := range n {
			if _, err := w.Append(context.Background(), logtest.SampleCall(w, i)); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return cps
}

// TestLogTreeFollowsEveryEpoch: the log checkpoints of three epochs form one
// tree that only grows: every log checkpoint is consistent with every
// earlier one (consistency proofs from LogTree check with tlog.CheckTree),
// each genesis names the size and frontier of the epochs before it, and
// Verify recomputes the same log tree.
func TestLogTreeFollowsEveryEpoch(t *testing.T) {
	dir := t.TempDir()
	logKey := logtest.Key(t)
	cps := writeEpochs(t, dir, logKey, 20, 3, 40)
	lv, err := note.NewVerifier(logtest.MustVkey(t, "test.example/gw1", logKey))
	if err != nil {
		t.Fatal(err)
	}
	tree, err := NewLogTree(dir, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range cps {
		cp, err := c2sp.OpenCheckpoint(c.Note, note.VerifierList(lv))
		if err != nil {
			t.Fatalf("log checkpoint %d: %v", i, err)
		}
		if cp.Size != c.Size || cp.Root != c.Root || cp.Origin != "test.example/gw1" {
			t.Fatalf("log checkpoint %d: note says %s %d, writer says %d", i, cp.Origin, cp.Size, c.Size)
		}
		if tree.Size()+int64(len(c.Leaves)) != c.Size {
			t.Fatalf("log checkpoint %d: size %d, but the tree had %d entries and %d new leaves", i, c.Size, tree.Size(), len(c.Leaves))
		}
		tree.Append(c.Leaves...)
		if r, _ := tree.Root(c.Size); r != c.Root {
			t.Fatalf("log checkpoint %d: root differs from the followed tree", i)
		}
		for j := range i {
			old := cps[j]
			if old.Size == c.Size {
				continue
			}
			p, err := tree.Prove(old.Size, c.Size)
			if err != nil {
				t.Fatal(err)
			}
			if err := tlog.CheckTree(p, c.Size, c.Root, old.Size, old.Root); err != nil {
				t.Fatalf("log checkpoint %d (size %d) is not consistent with %d (size %d): %v", i, c.Size, j, old.Size, err)
			}
		}
	}
	// Trimmed, and from the disk below the floor.
	tree.Trim(cps[len(cps)/2].Size)
	last := cps[len(cps)-1]
	for _, old := range cps[:len(cps)-1] {
		p, err := tree.Prove(old.Size, last.Size)
		if err != nil {
			t.Fatal(err)
		}
		if err := tlog.CheckTree(p, last.Size, last.Root, old.Size, old.Root); err != nil {
			t.Fatalf("after Trim: size %d -> %d: %v", old.Size, last.Size, err)
		}
	}
	rep, err := Verify(dir, VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Log == nil || rep.Log.Size != rep.Records || rep.Log.Size != last.Size || rep.Log.Origin != "test.example/gw1" {
		t.Fatalf("log report %+v, want the log tree of all %d records", rep.Log, rep.Records)
	}
	// Each genesis names the records before it.
	var before int64
	for _, e := range rep.Epochs {
		if e.Genesis.Log == nil || e.Genesis.Log.Size != before {
			t.Fatalf("epoch %d genesis log %+v, want size %d", e.Epoch, e.Genesis.Log, before)
		}
		before += e.Records
	}
}

// TestWitnessedLogVerifies: with the newest checkpoint cosigned by a quorum
// of the given witnesses, Verify reports it witnessed and drops the
// truncation warning; without the quorum, with a cosignature that does not
// verify, or with the log cut below a cosigned size, it fails.
func TestWitnessedLogVerifies(t *testing.T) {
	dir := t.TempDir()
	logKey := logtest.Key(t)
	cps := writeEpochs(t, dir, logKey, 10, 12)
	w1, w2 := logtest.NewCosigner(t, "w1.example/w"), logtest.NewCosigner(t, "w2.example/w")
	_, e2 := filepath.Split(filepath.Join(dir, logdir.EpochName(2)))
	ed := filepath.Join(dir, e2)
	mid, last := cps[len(cps)/2], cps[len(cps)-1]
	for _, c := range []LogCheckpoint{mid, last} {
		for _, w := range []*logtest.Cosigner{w1, w2} {
			if err := AppendCosigned(ed, logtest.Cosign(t, c.Note, w)); err != nil {
				t.Fatal(err)
			}
		}
	}
	opt := VerifyOptions{Witnesses: []string{w1.Vkey(), w2.Vkey()}, WitnessQuorum: 2}
	rep, err := Verify(dir, opt)
	if err != nil {
		t.Fatal(err)
	}
	wc := rep.Log.Witnessed
	if wc == nil || wc.Size != last.Size || len(wc.Witnesses) != 2 || rep.Log.Cosigned != 4 {
		t.Fatalf("witnessed %+v (cosigned %d), want size %d by 2 witnesses", wc, rep.Log.Cosigned, last.Size)
	}
	for _, w := range rep.Warnings {
		if strings.Contains(w, "truncation of the tail cannot be detected") {
			t.Fatalf("a witnessed log still warns: %s", w)
		}
	}
	if _, err := c2sp.NewCosignatureVerifier(w1.Vkey()); err != nil {
		t.Fatal(err)
	}
	// A third witness the log never met: quorum 2 of (w1, w3) fails.
	w3 := logtest.NewCosigner(t, "w3.example/w")
	_, err = Verify(dir, VerifyOptions{Witnesses: []string{w1.Vkey(), w3.Vkey()}, WitnessQuorum: 2})
	logtest.WantClass(t, err, record.ClassTruncation, "carries 1 of the 2 cosignatures")

	// Freshness.
	_, err = Verify(dir, VerifyOptions{Witnesses: []string{w1.Vkey()}, WitnessMaxAge: time.Minute, Now: func() time.Time { return time.Now().Add(time.Hour) }})
	logtest.WantClass(t, err, record.ClassTruncation, "--witness-max-age")

	// A cosignature that does not verify is an error, not ignored.
	good := string(logtest.Cosign(t, last.Note, w1))
	i := strings.LastIndex(good, " ") + 1
	raw, _ := base64.StdEncoding.DecodeString(strings.TrimSpace(good[i:]))
	raw[len(raw)-1] ^= 1
	bad := good[:i] + base64.StdEncoding.EncodeToString(raw) + "\n"
	if err := AppendCosigned(ed, []byte(bad)); err != nil {
		t.Fatal(err)
	}
	_, err = Verify(dir, opt)
	logtest.WantClass(t, err, record.ClassSignature, "w1.example/w does not verify")
	os.Remove(filepath.Join(ed, WitnessFile))

	// The log cut below what a witness cosigned.
	if err := AppendCosigned(ed, logtest.Cosign(t, last.Note, w1)); err != nil {
		t.Fatal(err)
	}
	seg := filepath.Join(ed, logdir.SegmentName(1))
	b, _ := os.ReadFile(seg)
	lines := strings.SplitAfter(string(b), "\n")
	if err := os.WriteFile(seg, []byte(strings.Join(lines[:len(lines)-6], "")), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Verify(dir, VerifyOptions{Witnesses: []string{w1.Vkey()}})
	logtest.WantClass(t, err, record.ClassTruncation, "records were cut from its tail")
}
