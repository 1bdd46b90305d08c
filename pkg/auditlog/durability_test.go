package auditlog

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logtest"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"golang.org/x/mod/sumdb/tlog"
)

// TestDurabilityModesReceipts: in strict and group modes Append returns a
// receipt marked durable (fdatasync'd); in interval mode it returns once the
// record is written to the segment file, marked not durable, and the
// genesis names the mode (and the sync period). In every mode the record is
// in the file, with the leaf hash of the receipt, when Append returns.
func TestDurabilityModesReceipts(t *testing.T) {
	for _, mode := range []string{record.DurabilityStrict, record.DurabilityGroup, record.DurabilityInterval} {
		t.Run(mode, func(t *testing.T) {
			dir := t.TempDir()
			w, err := Open(dir, Options{Key: logtest.Key(t), Durability: mode, SyncInterval: 250 * time.Millisecond, CheckpointEvery: 1 << 30, CheckpointInterval: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			const conc, per = 8, 10
			receipts := make(chan Receipt, conc*per)
			var wg sync.WaitGroup
			for g := range conc {
				wg.Go(func() {
					for i := range per {
						rc, err := w.Append(context.Background(), logtest.SampleCall(w, g*per+i))
						if err != nil {
							t.Error(err)
							return
						}
						receipts <- rc
					}
				})
			}
			wg.Wait()
			close(receipts)
			// Read the segment while the writer is still open.
			seg, err := os.ReadFile(filepath.Join(dir, "epoch-000001", "seg-000001.jsonl"))
			if err != nil {
				t.Fatal(err)
			}
			lines := bytes.Split(bytes.TrimSuffix(seg, []byte("\n")), []byte("\n"))
			n := 0
			for rc := range receipts {
				n++
				if want := mode != record.DurabilityInterval; rc.Durable != want {
					t.Fatalf("%s: receipt of record %d says durable=%v, want %v", mode, rc.Index, rc.Durable, want)
				}
				if rc.Index >= int64(len(lines)) || tlog.RecordHash(lines[rc.Index]) != rc.Hash {
					t.Fatalf("%s: record %d of the receipt is not in the segment file when Append returns (%d lines)", mode, rc.Index, len(lines))
				}
			}
			if n != conc*per {
				t.Fatalf("%d receipts, want %d", n, conc*per)
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			rep, err := Verify(dir, VerifyOptions{})
			if err != nil {
				t.Fatal(err)
			}
			g := rep.Epochs[0].Genesis
			if g.Durability != mode {
				t.Fatalf("genesis names durability %q, want %q", g.Durability, mode)
			}
			if mode == record.DurabilityInterval && g.IntervalMillis != 250 {
				t.Fatalf("genesis interval_ms %d, want 250", g.IntervalMillis)
			}
		})
	}
}
