package auditlog

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/confidential-mcp/cmcp/pkg/auditlog/c2sp"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logdir"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logtest"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// TestVerifyTakesEmptyNewestEpochAsAbortedStart: an epoch without one
// complete record is what a start that stopped before its genesis record
// was durable leaves, and the writer's recovery moves it aside. When it is
// the newest epoch, Verify agrees: the log is the epochs before it, with a
// warning, and --prove's "newest epoch" is the one before it too. Anywhere
// else, or as the only epoch, it stays a failure.
func TestVerifyTakesEmptyNewestEpochAsAbortedStart(t *testing.T) {
	for _, tc := range []struct {
		name   string
		epochs int               // complete epochs written
		empty  int               // the epoch emptied
		make   func(edir string) // how it is emptied
		fail   bool              // Verify fails
	}{
		{"newest with an empty segment", 2, 3, func(edir string) { os.WriteFile(filepath.Join(edir, logdir.SegmentName(1)), nil, 0o600) }, false},
		{"newest without segments", 2, 3, func(edir string) {}, false},
		{"newest with a torn genesis", 1, 2, func(edir string) {
			os.WriteFile(filepath.Join(edir, logdir.SegmentName(1)), []byte(`{"body":{"checkpoint_every":"10`), 0o600)
		}, false},
		{"before the newest", 3, 2, func(edir string) { os.Truncate(filepath.Join(edir, logdir.SegmentName(1)), 0) }, true},
		{"the only epoch", 0, 1, func(edir string) { os.WriteFile(filepath.Join(edir, logdir.SegmentName(1)), nil, 0o600) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for range tc.epochs {
				writeLog(t, dir, Options{}, 5, 1)
			}
			edir := filepath.Join(dir, logdir.EpochName(tc.empty))
			if err := os.MkdirAll(edir, 0o700); err != nil {
				t.Fatal(err)
			}
			tc.make(edir)
			rep, err := Verify(dir, VerifyOptions{})
			if tc.fail {
				var ve *record.VerifyError
				if !errors.As(err, &ve) || ve.Class != record.ClassIntegrity || ve.Pos.Epoch != tc.empty {
					t.Fatalf("verify: %v", err)
				}
				if tc.epochs == 0 && !strings.Contains(strings.Join(ve.Hints(), " "), "first start") {
					t.Fatalf("hints %q", ve.Hints())
				}
				return
			}
			if err != nil {
				t.Fatalf("verify: %v", err)
			}
			if len(rep.Epochs) != tc.epochs || rep.Epochs[len(rep.Epochs)-1].Epoch != tc.epochs {
				t.Fatalf("report has %d epochs", len(rep.Epochs))
			}
			if w := strings.Join(rep.Warnings, "\n"); !strings.Contains(w, "aborted start") || !strings.Contains(w, logdir.EpochName(tc.empty)) {
				t.Fatalf("warnings:\n%s", w)
			}
			p, err := Prove(dir, 0, 1, VerifyOptions{})
			if err != nil {
				t.Fatalf("prove in the newest epoch: %v", err)
			}
			if cp, err := c2sp.ParseCheckpoint(p.Checkpoint); err != nil || logdir.EpochOfOrigin(cp.Origin) != tc.epochs {
				t.Fatalf("proof against %+v (%v), want a checkpoint of epoch %d", cp, err, tc.epochs)
			}
			// The writer's recovery agrees: it moves the epoch aside and
			// takes its number.
			w, err := Open(dir, Options{Key: logtest.Key(t)})
			if err != nil {
				t.Fatal(err)
			}
			if e, _ := w.Epoch(); e != tc.empty {
				t.Fatalf("next start: epoch %d, want %d", e, tc.empty)
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := Verify(dir, VerifyOptions{}); err != nil {
				t.Fatal(err)
			}
		})
	}
}
