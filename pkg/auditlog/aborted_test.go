package auditlog

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logdir"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logtest"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// TestVerifyTakesEmptyNewestEpochAsAbortedStart: an epoch without one
// complete record is what a start that stopped before its genesis record
// was durable leaves, and the writer's recovery moves it aside. When it is
// the newest epoch, Verify agrees: the log is the epochs before it, with a
// warning (and --prove's "newest epoch" is the one before it too:
// excerpt's TestProveTakesEmptyNewestEpochAsAbortedStart). Anywhere else,
// or as the only epoch, it stays a failure.
func TestVerifyTakesEmptyNewestEpochAsAbortedStart(t *testing.T) {
	for _, tc := range logtest.AbortedStarts() {
		t.Run(tc.Name, func(t *testing.T) {
			dir := t.TempDir()
			for range tc.Epochs {
				writeLog(t, dir, Options{}, 5, 1)
			}
			edir := filepath.Join(dir, logdir.EpochName(tc.Empty))
			if err := os.MkdirAll(edir, 0o700); err != nil {
				t.Fatal(err)
			}
			tc.Make(edir)
			rep, err := Verify(dir, VerifyOptions{})
			if tc.Fail {
				var ve *record.VerifyError
				if !errors.As(err, &ve) || ve.Class != record.ClassIntegrity || ve.Pos.Epoch != tc.Empty {
					t.Fatalf("verify: %v", err)
				}
				if tc.Epochs == 0 && !strings.Contains(strings.Join(ve.Hints(), " "), "first start") {
					t.Fatalf("hints %q", ve.Hints())
				}
				return
			}
			if err != nil {
				t.Fatalf("verify: %v", err)
			}
			if len(rep.Epochs) != tc.Epochs || rep.Epochs[len(rep.Epochs)-1].Epoch != tc.Epochs {
				t.Fatalf("report has %d epochs", len(rep.Epochs))
			}
			if w := strings.Join(rep.Warnings, "\n"); !strings.Contains(w, "aborted start") || !strings.Contains(w, logdir.EpochName(tc.Empty)) {
				t.Fatalf("warnings:\n%s", w)
			}
			// The writer's recovery agrees: it moves the epoch aside and
			// takes its number.
			w, err := Open(dir, Options{Key: logtest.Key(t)})
			if err != nil {
				t.Fatal(err)
			}
			if e, _ := w.Epoch(); e != tc.Empty {
				t.Fatalf("next start: epoch %d, want %d", e, tc.Empty)
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
