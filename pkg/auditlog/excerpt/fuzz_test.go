package excerpt

import (
	"bytes"
	"testing"

	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/c2sp"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// FuzzParseProof fuzzes offline proof parsing and checking: no panics, an
// accepted proof round-trips through Format, and VerifyProof never accepts
// a proof that was changed.
func FuzzParseProof(f *testing.F) {
	dir := f.TempDir()
	w := writeLog(f, dir, auditlog.Options{CheckpointEvery: 4, Durability: record.DurabilityInterval}, 12, 1)
	var good []byte
	for _, idx := range []int64{0, 3, 7, 12} {
		p, err := Prove(dir, 1, idx, auditlog.VerifyOptions{Keys: []string{w.VerifierKey()}})
		if err != nil {
			f.Fatal(err)
		}
		good = p.Format()
		f.Add(good)
	}
	f.Add([]byte("c2sp.org/tlog-proof@v1\nindex 1\n\no\n1\nAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n\n— o x\n"))
	key := w.VerifierKey()
	f.Fuzz(func(t *testing.T, in []byte) {
		p, err := c2sp.ParseProof(in)
		if err == nil && !bytes.Equal(p.Format(), in) {
			t.Fatalf("proof does not round-trip:\n in %q\nout %q", in, p.Format())
		}
		if _, err := VerifyProof(in, []string{key}); err == nil && !bytes.Equal(in, good) {
			// Another valid proof must be for another record of the same log.
			p2, _ := c2sp.ParseProof(in)
			if _, err := record.ParseLine(p2.Record); err != nil {
				t.Fatalf("accepted a proof with a malformed record %q", p2.Record)
			}
		}
	})
}
