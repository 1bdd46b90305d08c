package auditlog

import (
	"errors"
	"strings"
	"testing"

	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logtest"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// TestProveEpochArgument: an epoch that cannot exist is a usage error that
// says which epochs there are, not an I/O error about "epoch--00001".
func TestProveEpochArgument(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, dir, Options{Key: logtest.Key(t), Durability: record.DurabilityInterval}, 5, 1)
	if _, err := Prove(dir, 1, 2, VerifyOptions{}); err != nil {
		t.Fatal(err)
	}
	for epoch, want := range map[int]string{-1: "numbered from 1", 7: "has epochs 1-1; there is no epoch 7"} {
		_, err := Prove(dir, epoch, 2, VerifyOptions{})
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
	writeLog(t, dir, Options{Key: logtest.Key(t), Durability: record.DurabilityInterval}, 5, 1)
	rep, err := Verify(dir, VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	last := rep.Epochs[0].Records - 1
	_, err = Prove(dir, 1, last, VerifyOptions{})
	if err == nil || !strings.Contains(err.Error(), "is epoch 1's last checkpoint") || strings.Contains(err.Error(), "unsealed") {
		t.Fatalf("Prove(last checkpoint) = %v", err)
	}
	if _, err := Prove(dir, 1, last-1, VerifyOptions{}); err != nil {
		t.Fatal(err)
	}
}
