package auditlog

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/confidential-mcp/cmcp/pkg/auditlog/c2sp"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logdir"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// testCosigner is a cosignature/v1 signer (c2sp.org/tlog-cosignature), as
// a witness signs; the tests against a real witness use litewitness.
type testCosigner struct {
	name string
	key  ed25519.PrivateKey
	now  int64
}

func (c *testCosigner) pubRaw() []byte {
	return append([]byte{0x04}, c.key.Public().(ed25519.PublicKey)...)
}
func (c *testCosigner) Name() string    { return c.name }
func (c *testCosigner) KeyHash() uint32 { return c2sp.NoteKeyHash(c.name, c.pubRaw()) }
func (c *testCosigner) Sign(msg []byte) ([]byte, error) {
	m := fmt.Appendf(nil, "cosignature/v1\ntime %d\n", c.now)
	sig := ed25519.Sign(c.key, append(m, msg...))
	return append(binary.BigEndian.AppendUint64(nil, uint64(c.now)), sig...), nil
}
func (c *testCosigner) vkey() string {
	return fmt.Sprintf("%s+%08x+%s", c.name, c.KeyHash(), base64.StdEncoding.EncodeToString(c.pubRaw()))
}

func newTestCosigner(t *testing.T, name string) *testCosigner {
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return &testCosigner{name: name, key: k, now: time.Now().Unix()}
}

// cosign adds c's cosignature to a signed log checkpoint.
func cosign(t *testing.T, signed []byte, c *testCosigner) []byte {
	t.Helper()
	text, _, _ := strings.Cut(string(signed), "\n\n")
	n, err := note.Sign(&note.Note{Text: text + "\n"}, c)
	if err != nil {
		t.Fatal(err)
	}
	_, line, _ := strings.Cut(string(n), "\n\n")
	return append(append([]byte(nil), signed...), line...)
}

// writeEpochs writes epochs with a log identity and returns every log
// checkpoint they made, in order.
func writeEpochs(t *testing.T, dir string, logKey ed25519.PrivateKey, records ...int) []LogCheckpoint {
	t.Helper()
	var cps []LogCheckpoint
	for _, n := range records {
		w, err := Open(dir, Options{Key: testKey(t), Name: "test.example/audit", CheckpointEvery: 7,
			Log: &LogIdentity{Origin: "test.example/gw1", Key: logKey, OnCheckpoint: func(c LogCheckpoint) { cps = append(cps, c) }}})
		if err != nil {
			t.Fatal(err)
		}
		for i := range n {
			if _, err := w.Append(context.Background(), sampleCall(w, i)); err != nil {
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
	logKey := testKey(t)
	cps := writeEpochs(t, dir, logKey, 20, 3, 40)
	lv, err := note.NewVerifier(mustVkey(t, "test.example/gw1", logKey))
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

func mustVkey(t *testing.T, name string, k ed25519.PrivateKey) string {
	_, v, err := c2sp.NewNoteKeys(name, k)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestWitnessedLogVerifies: with the newest checkpoint cosigned by a quorum
// of the given witnesses, Verify reports it witnessed and drops the
// truncation warning; without the quorum, with a cosignature that does not
// verify, or with the log cut below a cosigned size, it fails.
func TestWitnessedLogVerifies(t *testing.T) {
	dir := t.TempDir()
	logKey := testKey(t)
	cps := writeEpochs(t, dir, logKey, 10, 12)
	w1, w2 := newTestCosigner(t, "w1.example/w"), newTestCosigner(t, "w2.example/w")
	_, e2 := filepath.Split(filepath.Join(dir, logdir.EpochName(2)))
	ed := filepath.Join(dir, e2)
	mid, last := cps[len(cps)/2], cps[len(cps)-1]
	for _, c := range []LogCheckpoint{mid, last} {
		for _, w := range []*testCosigner{w1, w2} {
			if err := AppendCosigned(ed, cosign(t, c.Note, w)); err != nil {
				t.Fatal(err)
			}
		}
	}
	opt := VerifyOptions{Witnesses: []string{w1.vkey(), w2.vkey()}, WitnessQuorum: 2}
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
	if _, err := c2sp.NewCosignatureVerifier(w1.vkey()); err != nil {
		t.Fatal(err)
	}
	// A third witness the log never met: quorum 2 of (w1, w3) fails.
	w3 := newTestCosigner(t, "w3.example/w")
	_, err = Verify(dir, VerifyOptions{Witnesses: []string{w1.vkey(), w3.vkey()}, WitnessQuorum: 2})
	wantClass(t, err, record.ClassTruncation, "carries 1 of the 2 cosignatures")

	// Freshness.
	_, err = Verify(dir, VerifyOptions{Witnesses: []string{w1.vkey()}, WitnessMaxAge: time.Minute, Now: func() time.Time { return time.Now().Add(time.Hour) }})
	wantClass(t, err, record.ClassTruncation, "--witness-max-age")

	// A cosignature that does not verify is an error, not ignored.
	good := string(cosign(t, last.Note, w1))
	i := strings.LastIndex(good, " ") + 1
	raw, _ := base64.StdEncoding.DecodeString(strings.TrimSpace(good[i:]))
	raw[len(raw)-1] ^= 1
	bad := good[:i] + base64.StdEncoding.EncodeToString(raw) + "\n"
	if err := AppendCosigned(ed, []byte(bad)); err != nil {
		t.Fatal(err)
	}
	_, err = Verify(dir, opt)
	wantClass(t, err, record.ClassSignature, "w1.example/w does not verify")
	os.Remove(filepath.Join(ed, WitnessFile))

	// The log cut below what a witness cosigned.
	if err := AppendCosigned(ed, cosign(t, last.Note, w1)); err != nil {
		t.Fatal(err)
	}
	seg := filepath.Join(ed, logdir.SegmentName(1))
	b, _ := os.ReadFile(seg)
	lines := strings.SplitAfter(string(b), "\n")
	if err := os.WriteFile(seg, []byte(strings.Join(lines[:len(lines)-6], "")), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Verify(dir, VerifyOptions{Witnesses: []string{w1.vkey()}})
	wantClass(t, err, record.ClassTruncation, "records were cut from its tail")
}

func wantClass(t *testing.T, err error, c record.Class, sub string) {
	t.Helper()
	var ve *record.VerifyError
	if !errors.As(err, &ve) || ve.Class != c || !strings.Contains(ve.Error(), sub) {
		t.Fatalf("got %v, want a %s failure saying %q", err, c, sub)
	}
}
