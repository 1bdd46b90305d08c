package excerpt

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/c2sp"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logdir"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logtest"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// TestProveEpochArgument: an epoch that cannot exist is a usage error that
// says which epochs there are, not an I/O error about "epoch--00001".
func TestProveEpochArgument(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, dir, auditlog.Options{Key: logtest.Key(t), Durability: record.DurabilityInterval}, 5, 1)
	if _, err := Prove(dir, 1, 2, auditlog.VerifyOptions{}); err != nil {
		t.Fatal(err)
	}
	for epoch, want := range map[int]string{-1: "numbered from 1", 7: "has epochs 1-1; there is no epoch 7"} {
		_, err := Prove(dir, epoch, 2, auditlog.VerifyOptions{})
		var ve *record.VerifyError
		if !errors.As(err, &ve) || ve.Class != record.ClassUsage || !strings.Contains(err.Error(), want) {
			t.Errorf("epoch %d: %v, want a usage error with %q", epoch, err, want)
		}
	}
}

// TestProveLastCheckpoint: the final checkpoint of a sealed epoch cannot be proved (no
// later checkpoint covers it); before, a sealed epoch's final checkpoint was
// said to be "in the unsealed tail".
func TestProveLastCheckpoint(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, dir, auditlog.Options{Key: logtest.Key(t), Durability: record.DurabilityInterval}, 5, 1)
	rep, err := auditlog.Verify(dir, auditlog.VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	last := rep.Epochs[0].Records - 1
	_, err = Prove(dir, 1, last, auditlog.VerifyOptions{})
	if err == nil || !strings.Contains(err.Error(), "is epoch 1's last checkpoint") || strings.Contains(err.Error(), "unsealed") {
		t.Fatalf("Prove(last checkpoint) = %v", err)
	}
	if _, err := Prove(dir, 1, last-1, auditlog.VerifyOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestProveTakesEmptyNewestEpochAsAbortedStart: when the newest epoch is
// an aborted start (an epoch without one complete record, which Verify
// takes as such: TestVerifyTakesEmptyNewestEpochAsAbortedStart),
// --prove's "newest epoch" is the one before it.
func TestProveTakesEmptyNewestEpochAsAbortedStart(t *testing.T) {
	for _, tc := range logtest.AbortedStarts() {
		if tc.Fail {
			continue
		}
		t.Run(tc.Name, func(t *testing.T) {
			dir := t.TempDir()
			for range tc.Epochs {
				writeLog(t, dir, auditlog.Options{}, 5, 1)
			}
			edir := filepath.Join(dir, logdir.EpochName(tc.Empty))
			if err := os.MkdirAll(edir, 0o700); err != nil {
				t.Fatal(err)
			}
			tc.Make(edir)
			p, err := Prove(dir, 0, 1, auditlog.VerifyOptions{})
			if err != nil {
				t.Fatalf("prove in the newest epoch: %v", err)
			}
			if cp, err := c2sp.ParseCheckpoint(p.Checkpoint); err != nil || logdir.EpochOfOrigin(cp.Origin) != tc.Epochs {
				t.Fatalf("proof against %+v (%v), want a checkpoint of epoch %d", cp, err, tc.Epochs)
			}
		})
	}
}
