package auditlog

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// TestRandomDamageDetected changes one random byte of a sealed log (or cuts
// it at a random offset) many times. With the trusted key and the final
// checkpoint kept outside, every change must fail verification, except one
// that only breaks the last line (the final checkpoint record), which is
// then reported as an incomplete line after records the checkpoint covers.
func TestRandomDamageDetected(t *testing.T) {
	dir := t.TempDir()
	w1 := writeLog(t, dir, Options{CheckpointEvery: 9, SegmentBytes: 6 << 10, Durability: DurabilityInterval}, 40, 1)
	w := writeLog(t, dir, Options{CheckpointEvery: 9, SegmentBytes: 6 << 10, Durability: DurabilityInterval}, 40, 1)
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
}
