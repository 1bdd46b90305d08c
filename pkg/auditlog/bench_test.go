package auditlog

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logdir"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logtest"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"github.com/confidential-mcp/cmcp/pkg/digest"
	"golang.org/x/mod/sumdb/tlog"
)

// benchLog returns a directory holding a sealed log of n call records,
// building it once per machine under the temp dir.
func benchLog(b *testing.B, n int) (string, string) {
	return logtest.BenchLog(b, n, func(dir string) string {
		return writeLog(b, dir, Options{Durability: record.DurabilityInterval, SegmentBytes: 128 << 20}, n, 8).VerifierKey()
	})
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

// BenchmarkAppend measures Append throughput and latency for each
// durability mode at 1, 8 and 64 concurrent appenders, against a baseline
// measured in the same run: the same number of goroutines each writing the
// same line bytes with write(2) + fdatasync on one O_APPEND file. Run with
// a fixed count, e.g. -bench Append -benchtime 3000x.
func BenchmarkAppend(b *testing.B) {
	for _, conc := range []int{1, 8, 64} {
		for _, mode := range []string{"baseline", record.DurabilityStrict, record.DurabilityGroup, record.DurabilityInterval} {
			b.Run(fmt.Sprintf("%s/c%d", mode, conc), func(b *testing.B) {
				benchAppend(b, mode, conc)
			})
		}
	}
}

func benchAppend(b *testing.B, mode string, conc int) {
	dir := b.TempDir()
	var do func(i int) error
	var closeFn func() error
	if mode == "baseline" {
		// The bytes of a real record line.
		tmp := b.TempDir()
		w := writeLog(b, tmp, Options{Durability: record.DurabilityInterval}, 1, 1)
		_ = w
		r, _ := NewReader(tmp)
		var line []byte
		for {
			e, err := r.Next()
			if err != nil {
				break
			}
			if e.Kind == record.KindCall {
				line = append(e.Line, '\n')
			}
		}
		r.Close()
		f, err := os.OpenFile(filepath.Join(dir, "raw"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			b.Fatal(err)
		}
		do = func(int) error {
			if _, err := f.Write(line); err != nil {
				return err
			}
			return logdir.Fdatasync(f)
		}
		closeFn = f.Close
		b.SetBytes(int64(len(line)))
	} else {
		w, err := Open(dir, Options{Key: logtest.Key(b), Durability: mode})
		if err != nil {
			b.Fatal(err)
		}
		calls := make([]*record.Call, 64)
		for i := range calls {
			calls[i] = logtest.SampleCall(w, i)
		}
		do = func(i int) error {
			_, err := w.Append(context.Background(), calls[i%len(calls)])
			return err
		}
		closeFn = w.Close
	}
	lat := make([][]time.Duration, conc)
	per := (b.N + conc - 1) / conc
	b.ResetTimer()
	var wg sync.WaitGroup
	for g := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := make([]time.Duration, 0, per)
			for i := range per {
				t0 := time.Now()
				if err := do(i); err != nil {
					b.Error(err)
					return
				}
				l = append(l, time.Since(t0))
			}
			lat[g] = l
		}()
	}
	wg.Wait()
	b.StopTimer()
	if err := closeFn(); err != nil {
		b.Fatal(err)
	}
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	b.ReportMetric(float64(len(all))/b.Elapsed().Seconds(), "rec/s")
	b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkParseLine measures the per-line work of the verifier (strict
// canonical check, common members) and the leaf hash.
func BenchmarkParseLine(b *testing.B) {
	dir := b.TempDir()
	writeLog(b, dir, Options{Durability: record.DurabilityInterval}, 2, 1)
	r, _ := NewReader(dir)
	var line []byte
	for {
		e, err := r.Next()
		if err != nil {
			break
		}
		if e.Kind == record.KindCall {
			line = e.Line
		}
	}
	r.Close()
	b.SetBytes(int64(len(line)))
	b.ReportAllocs()
	b.Run("parse", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			if _, err := record.ParseLine(line); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("hash", func(b *testing.B) {
		for range b.N {
			tlog.RecordHash(line)
		}
	})
}

// gatewayCall is a call record as the gateway writes it for an allowed
// tools/call decided by a Cedar policy.
func gatewayCall(w *Writer, i int) *record.Call {
	return &record.Call{
		Session: "3f1c9a7e-5b2d-4c8e-9a41-6d0b2e7f8c13", Agent: "agent-a", Tool: "fs__read_file", Upstream: "fs", UpstreamTool: "read_file",
		EvidenceClass: "spawn-measured", Args: w.Commit([]byte(fmt.Sprintf(`{"path":"/srv/data/report-%d.txt"}`, i))),
		Decision: record.DecisionAllow, PolicyIDs: []string{"policy0", "allow-read"}, PolicyMode: "enforcing",
		PolicyBundle: digest.Bytes([]byte("bundle")), Outcome: record.OutcomeForwarded,
		PolicyInput: &record.PolicyInput{
			Groups: []string{"readers"}, EvidenceClass: "spawn-measured",
			Hints:        record.ToolHints{ReadOnly: true, OpenWorld: true},
			SessionCalls: int64(i), ToolsUsed: []string{"fs__list", "fs__read_file"},
			Time: time.Date(2025, 3, 14, 15, 9, 26, 535_000_000, time.UTC),
		},
	}
}

// BenchmarkCommit measures one payload commitment (no vault): the
// per-commitment key and the MAC over a 200-byte payload.
func BenchmarkCommit(b *testing.B) {
	w, err := Open(b.TempDir(), Options{Key: logtest.Key(b), Durability: record.DurabilityInterval})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	payload := bytes.Repeat([]byte("x"), 200)
	b.Run("200B", func(b *testing.B) {
		b.SetBytes(int64(len(payload)))
		b.ReportAllocs()
		for range b.N {
			w.Commit(payload)
		}
	})
}

// BenchmarkEncodeBody measures encoding one record body to canonical JSON.
func BenchmarkEncodeBody(b *testing.B) {
	w, err := Open(b.TempDir(), Options{Key: logtest.Key(b), Durability: record.DurabilityInterval})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	recs := []record.Record{
		gatewayCall(w, 7),
		&record.Result{Call: 12345, Session: "3f1c9a7e-5b2d-4c8e-9a41-6d0b2e7f8c13", Outcome: record.ResultOK, Result: w.Commit(make([]byte, 900)), LatencyMicros: 1834},
	}
	for _, r := range recs {
		b.Run(string(r.Kind()), func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				if _, err := record.EncodeBody(r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkAppendGateway measures what the gateway does per tools/call
// with one appender in interval durability: commit the arguments, append
// the call record (waiting for its write), commit the result, append the
// result record.
func BenchmarkAppendGateway(b *testing.B) {
	w, err := Open(b.TempDir(), Options{Key: logtest.Key(b), Durability: record.DurabilityInterval})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	result := bytes.Repeat([]byte("r"), 900)
	b.Run("call", func(b *testing.B) {
		b.ReportAllocs()
		for i := range b.N {
			if _, err := w.Append(ctx, gatewayCall(w, i)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("call+result", func(b *testing.B) {
		b.ReportAllocs()
		for i := range b.N {
			r, err := w.Append(ctx, gatewayCall(w, i))
			if err != nil {
				b.Fatal(err)
			}
			res := &record.Result{Call: r.Index, Session: "3f1c9a7e-5b2d-4c8e-9a41-6d0b2e7f8c13", Outcome: record.ResultOK, Result: w.Commit(result), LatencyMicros: 1834}
			if _, err := w.Append(ctx, res); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.StopTimer()
	if err := w.Close(); err != nil {
		b.Fatal(err)
	}
}
