package auditlog

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"golang.org/x/mod/sumdb/tlog"
)

// benchLog returns a directory holding a sealed log of n call records,
// building it once per machine under the temp dir.
func benchLog(b *testing.B, n int) (string, string) {
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("cmcp-auditlog-bench-%d", n))
	if kb, err := os.ReadFile(dir + ".vkey"); err == nil {
		return dir, string(kb)
	}
	os.RemoveAll(dir)
	w := writeLog(b, dir, Options{Durability: DurabilityInterval, SegmentBytes: 128 << 20}, n, 8)
	if err := os.WriteFile(dir+".vkey", []byte(w.VerifierKey()), 0o644); err != nil {
		b.Fatal(err)
	}
	return dir, w.VerifierKey()
}

// BenchmarkVerify1M verifies a 1,000,000-record log (target: under 10 s on
// 2 cores). Build it once with -run XXX -bench Verify1M -benchtime 1x.
func BenchmarkVerify1M(b *testing.B) {
	dir, key := benchLog(b, 1_000_000)
	b.SetBytes(LogBytes(dir))
	b.ResetTimer()
	for range b.N {
		rep, err := Verify(dir, VerifyOptions{Keys: []string{key}})
		if err != nil {
			b.Fatal(err)
		}
		if rep.Records < 1_000_000 {
			b.Fatalf("%d records", rep.Records)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Seconds())/float64(b.N), "s/verify")
}

// BenchmarkProofVerify measures checking one offline proof (signature +
// inclusion) in a 1M-record epoch.
func BenchmarkProofVerify(b *testing.B) {
	dir, key := benchLog(b, 1_000_000)
	pr, err := Prove(dir, 1, 654321, VerifyOptions{Keys: []string{key}})
	if err != nil {
		b.Fatal(err)
	}
	text := pr.Format()
	b.ReportMetric(float64(len(pr.Hashes)), "hashes")
	b.ReportMetric(float64(len(text)), "proof-bytes")
	b.ResetTimer()
	for range b.N {
		if _, err := VerifyProof(text, []string{key}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkInclusionOnly isolates tlog.CheckRecord from the signature check.
func BenchmarkInclusionOnly(b *testing.B) {
	dir, key := benchLog(b, 1_000_000)
	pr, err := Prove(dir, 1, 654321, VerifyOptions{Keys: []string{key}})
	if err != nil {
		b.Fatal(err)
	}
	cp, _ := ParseCheckpoint(pr.Checkpoint)
	leaf := tlog.RecordHash(pr.Record)
	b.ResetTimer()
	for range b.N {
		if err := tlog.CheckRecord(pr.Hashes, cp.Size, cp.Root, pr.Index, leaf); err != nil {
			b.Fatal(err)
		}
	}
}

var _ = context.Background
var _ = sort.Ints
var _ = sync.Mutex{}
var _ = time.Now
