package auditlog

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"filippo.io/age"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logtest"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// TestInlineAndQueuedAppends mixes appends that commit their own record
// (the log was idle) with appends queued for the committer goroutine
// (another commit was running), while timed checkpoints, forced
// checkpoints, interval syncs, the vault and segment rotation run too.
// After Close the log must verify, hold every acknowledged record at the
// index and with the leaf hash of its receipt, each appender's records in
// the order it appended them, and both paths must have been taken.
func TestInlineAndQueuedAppends(t *testing.T) {
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{record.DurabilityStrict, record.DurabilityGroup, record.DurabilityInterval} {
		t.Run(mode, func(t *testing.T) {
			dir := t.TempDir()
			w, err := Open(dir, Options{
				Key: logtest.Key(t), Durability: mode,
				CheckpointEvery: 37, CheckpointInterval: 3 * time.Millisecond, SyncInterval: 2 * time.Millisecond,
				SegmentBytes: 24 << 10, Recipients: []string{id.Recipient().String()}, Vault: true,
			})
			if err != nil {
				t.Fatal(err)
			}
			type ack struct {
				tag string
				rc  Receipt
			}
			const appenders, per = 12, 60
			acks := make([][]ack, appenders)
			stop := make(chan struct{})
			var cpWG sync.WaitGroup
			cpWG.Go(func() { // forced checkpoints alongside the appends
				for {
					select {
					case <-stop:
						return
					case <-time.After(time.Duration(rand.IntN(4000)) * time.Microsecond):
					}
					if err := w.Checkpoint(); err != nil {
						t.Error(err)
						return
					}
				}
			})
			var wg sync.WaitGroup
			for g := range appenders {
				wg.Go(func() {
					for i := range per {
						// Some appenders pause (the log is often idle when
						// they come back: inline commits), others append
						// back to back (they queue behind each other).
						if g%3 == 0 {
							time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
						}
						ctx := context.Background()
						var cancel context.CancelFunc = func() {}
						if g == 1 && i%4 == 0 { // a context that may end while queued
							ctx, cancel = context.WithTimeout(ctx, time.Duration(rand.IntN(200))*time.Microsecond)
						}
						tag := fmt.Sprintf("g%d-%d", g, i)
						rec := &record.Call{Session: tag, Agent: "a", Tool: "t", Upstream: "u", EvidenceClass: "plaintext",
							Args: w.Commit([]byte(tag)), Decision: record.DecisionAllow, PolicyMode: "enforcing", Outcome: record.OutcomeForwarded}
						rc, err := w.Append(ctx, rec)
						cancel()
						if errors.Is(err, context.DeadlineExceeded) {
							continue // maybe written, not acknowledged
						}
						if err != nil {
							t.Error(err)
							return
						}
						acks[g] = append(acks[g], ack{tag, rc})
					}
				})
			}
			wg.Wait()
			close(stop)
			cpWG.Wait()
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %d appends committed by their caller, %d by the committer", mode, w.nInline, w.nQueued)
			if w.nInline == 0 || w.nQueued == 0 {
				t.Fatalf("inline %d, queued %d: the test did not mix both paths", w.nInline, w.nQueued)
			}

			rep, err := Verify(dir, VerifyOptions{Keys: []string{w.VerifierKey()}})
			if err != nil {
				t.Fatal(err)
			}
			if ep := rep.Epochs[0]; !ep.Sealed || ep.Segments < 2 {
				t.Fatalf("sealed=%v segments=%d: want a sealed epoch that rotated", ep.Sealed, ep.Segments)
			}
			entries, recs := logtest.ReaderEntries(t, dir)
			calls := 0
			for _, r := range recs {
				if _, ok := r.(*record.Call); ok {
					calls++
				}
			}
			acked := 0
			for g, as := range acks {
				last := int64(-1)
				for _, a := range as {
					acked++
					i := a.rc.Index
					if i <= last {
						t.Fatalf("appender %d: %s at index %d, after its previous record at %d", g, a.tag, i, last)
					}
					last = i
					if i >= int64(len(entries)) || entries[i].Hash != a.rc.Hash {
						t.Fatalf("acknowledged record %s (index %d) is not in the log as its receipt says", a.tag, i)
					}
					if c, ok := recs[i].(*record.Call); !ok || c.Session != a.tag {
						t.Fatalf("index %d holds %#v, want call %s", i, recs[i], a.tag)
					}
				}
			}
			if calls < acked || acked < appenders*per/2 {
				t.Fatalf("%d calls in the log, %d acknowledged", calls, acked)
			}

			// Every payload reached the vault and opens its commitment.
			o, err := NewOpener(rep.Epochs[0].Genesis, id)
			if err != nil {
				t.Fatal(err)
			}
			if err := o.LoadVault(filepath.Join(dir, "epoch-000001"), id); err != nil {
				t.Fatal(err)
			}
			for _, r := range recs {
				if c, ok := r.(*record.Call); ok {
					if p, err := o.Payload(c.Args); err != nil || string(p) != c.Session {
						t.Fatalf("vault payload of %s: %q, %v", c.Session, p, err)
					}
				}
			}
		})
	}
}
