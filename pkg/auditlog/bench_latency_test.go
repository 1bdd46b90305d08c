package auditlog

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logtest"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// BenchmarkAppendLatency measures one appender (concurrency 1) appending
// gateway call records back to back, the way the gateway appends a call
// record before it forwards a tools/call: ns/op is the mean latency of one
// Append, and the p50/p90/p99 of the individual Appends are reported too.
// The records (and their commitments) are built before the timer starts.
func BenchmarkAppendLatency(b *testing.B) {
	for _, mode := range []string{record.DurabilityInterval, record.DurabilityGroup} {
		b.Run(mode, func(b *testing.B) {
			w, err := Open(b.TempDir(), Options{Key: logtest.Key(b), Durability: mode})
			if err != nil {
				b.Fatal(err)
			}
			recs := make([]*record.Call, 256)
			for i := range recs {
				recs[i] = gatewayCall(w, i)
			}
			lat := make([]time.Duration, b.N)
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				t0 := time.Now()
				if _, err := w.Append(ctx, recs[i%len(recs)]); err != nil {
					b.Fatal(err)
				}
				lat[i] = time.Since(t0)
			}
			b.StopTimer()
			if err := w.Close(); err != nil {
				b.Fatal(err)
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
			b.ReportMetric(float64(lat[len(lat)*9/10].Nanoseconds()), "p90-ns")
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
		})
	}
}
