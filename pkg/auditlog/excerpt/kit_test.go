package excerpt

import (
	"testing"

	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logtest"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// writeLog writes n call records with conc appenders and closes the writer
// (auditlog's writeLog: the kit cannot import auditlog).
func writeLog(t testing.TB, dir string, opts auditlog.Options, n, conc int) *auditlog.Writer {
	t.Helper()
	if opts.Key == nil {
		opts.Key = logtest.Key(t)
	}
	return logtest.WriteLog(t, func() (*auditlog.Writer, error) { return auditlog.Open(dir, opts) }, n, conc)
}

// benchLog returns a directory holding a sealed log of n call records (the
// one auditlog's benchmarks use), building it once per machine.
func benchLog(b *testing.B, n int) (string, string) {
	return logtest.BenchLog(b, n, func(dir string) string {
		return writeLog(b, dir, auditlog.Options{Durability: record.DurabilityInterval, SegmentBytes: 128 << 20}, n, 8).VerifierKey()
	})
}
