package auditlog

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// TestRandomDamageDetected changes one random byte of a sealed log (or cuts
// it at a random offset) many times. With the trusted key and the final
// checkpoint kept outside, every change must fail verification, except one
// that only breaks the last line (the final checkpoint record), which is
// then reported as an incomplete line after records the checkpoint covers.
//
// Most random damage fails as a malformed record before the chain is
// consulted, so the test also makes well-formed damage that only the chain
// can find: a call record rewritten in place (agent-a -> agent-b: the line
// stays canonical) must be reported by the broken hash link of the record
// after it, naming the record; the same rewrite with every later record's
// prev in its segment rewritten to match (the hash links all hold) must be
// reported by the Merkle root the next checkpoint signs (every segment
// ends with one). Turning off either
// check in scanEpoch fails the test.
func TestRandomDamageDetected(t *testing.T) {
	dir := t.TempDir()
	w1 := writeLog(t, dir, Options{CheckpointEvery: 9, SegmentBytes: 6 << 10, Durability: record.DurabilityInterval}, 40, 1)
	w := writeLog(t, dir, Options{CheckpointEvery: 9, SegmentBytes: 6 << 10, Durability: record.DurabilityInterval}, 40, 1)
	// Only the newest epoch's final checkpoint is kept outside; epoch 1 is
	// protected through epoch 2's genesis.
	opt := VerifyOptions{Keys: []string{w1.VerifierKey(), w.VerifierKey()}, Checkpoints: [][]byte{w.LatestCheckpoint()}}
	if _, err := Verify(dir, opt); err != nil {
		t.Fatal(err)
	}
	segs, _ := filepath.Glob(filepath.Join(dir, "epoch-*", "seg-*.jsonl"))
	orig := make(map[string][]byte)
	for _, s := range segs {
		orig[s], _ = os.ReadFile(s)
	}
	last := segs[len(segs)-1]
	lastLineStart := int64(bytes.LastIndexByte(orig[last][:len(orig[last])-1], '\n') + 1)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 200 {
		seg := segs[rng.IntN(len(segs))]
		b := bytes.Clone(orig[seg])
		var what string
		var off int64
		if i%5 == 4 {
			off = int64(rng.IntN(len(b)))
			b = b[:off]
			what = "cut"
		} else {
			off = int64(rng.IntN(len(b)))
			old := b[off]
			for b[off] == old {
				b[off] = byte(rng.IntN(256))
			}
			what = "flip"
		}
		os.WriteFile(seg, b, 0o600)
		_, err := Verify(dir, opt)
		os.WriteFile(seg, orig[seg], 0o600)
		onlyLastLine := seg == last && off >= lastLineStart
		if err == nil && !onlyLastLine {
			t.Fatalf("%s at %s byte %d (of %d) was not detected", what, filepath.Base(seg), off, len(b))
		}
	}
	var rewrites [2]int // in place, relinked
	for i := range 40 {
		relink := i%2 == 1
		seg := segs[rng.IntN(len(segs))]
		lines := bytes.SplitAfter(orig[seg], []byte("\n"))
		lines = lines[:len(lines)-1] // the empty string after the last line break
		var calls []int
		for j, l := range lines {
			if bytes.Contains(l, []byte(`"kind":"call"`)) {
				calls = append(calls, j)
			}
		}
		if len(calls) == 0 {
			continue
		}
		j := calls[rng.IntN(len(calls))]
		var rec struct{ Seq string }
		if err := json.Unmarshal(lines[j], &rec); err != nil {
			t.Fatal(err)
		}
		damaged := make([][]byte, len(lines))
		for k, l := range lines {
			damaged[k] = bytes.Clone(l)
		}
		if bytes.Count(damaged[j], []byte(`"agent":"agent-a"`)) != 1 {
			t.Fatalf("record %s: %s", rec.Seq, damaged[j])
		}
		damaged[j] = bytes.Replace(damaged[j], []byte(`"agent":"agent-a"`), []byte(`"agent":"agent-b"`), 1)
		if relink {
			for k := j + 1; k < len(damaged); k++ {
				h := sha256.Sum256(append([]byte{0}, bytes.TrimSuffix(damaged[k-1], []byte("\n"))...))
				damaged[k] = relinked(t, damaged[k], base64.StdEncoding.EncodeToString(h[:]))
			}
		}
		os.WriteFile(seg, bytes.Join(damaged, nil), 0o600)
		_, err := Verify(dir, opt)
		os.WriteFile(seg, orig[seg], 0o600)
		var ve *record.VerifyError
		if !errors.As(err, &ve) || ve.Class != record.ClassIntegrity {
			t.Fatalf("record %s of %s rewritten (relinked %v): got %v, want an integrity failure", rec.Seq, filepath.Base(seg), relink, err)
		}
		want := fmt.Sprintf("broken hash link: prev does not match the hash of record %s: record %s was modified", rec.Seq, rec.Seq)
		if relink {
			want = "Merkle root mismatch"
		}
		if !strings.Contains(ve.Msg, want) {
			t.Fatalf("record %s of %s rewritten (relinked %v): got %v, want %q", rec.Seq, filepath.Base(seg), relink, err, want)
		}
		if relink {
			rewrites[1]++
		} else {
			rewrites[0]++
		}
	}
	if rewrites[0] < 10 || rewrites[1] < 10 {
		t.Fatalf("rewrote %d records in place and %d relinked, want 10 of each", rewrites[0], rewrites[1])
	}
}

// relinked returns line with its prev member set to prev (the line stays
// canonical: prev is always 44 base64 characters).
func relinked(t *testing.T, line []byte, prev string) []byte {
	t.Helper()
	const key = `"prev":"`
	i := bytes.Index(line, []byte(key))
	if i < 0 || len(prev) != 44 {
		t.Fatalf("no prev to relink in %s", line)
	}
	i += len(key)
	out := bytes.Clone(line)
	copy(out[i:i+44], prev)
	return out
}
