package excerpt

import (
	"testing"

	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/c2sp"
	"golang.org/x/mod/sumdb/tlog"
)

// BenchmarkProofVerify measures checking one offline proof (signature +
// inclusion) in a 1M-record epoch.
func BenchmarkProofVerify(b *testing.B) {
	dir, key := benchLog(b, 1_000_000)
	pr, err := Prove(dir, 1, 654321, auditlog.VerifyOptions{Keys: []string{key}})
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
	pr, err := Prove(dir, 1, 654321, auditlog.VerifyOptions{Keys: []string{key}})
	if err != nil {
		b.Fatal(err)
	}
	cp, _ := c2sp.ParseCheckpoint(pr.Checkpoint)
	leaf := tlog.RecordHash(pr.Record)
	b.ResetTimer()
	for range b.N {
		if err := tlog.CheckRecord(pr.Hashes, cp.Size, cp.Root, pr.Index, leaf); err != nil {
			b.Fatal(err)
		}
	}
}
