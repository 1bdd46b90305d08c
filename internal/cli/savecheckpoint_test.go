package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/confidential-mcp/cmcp/internal/exitcode"
)

// TestVerifyChainSaveCheckpointChecksTheOldOne: --save-checkpoint onto a
// file that already holds a checkpoint checks the log against it first, so
// that a log rolled back since cannot overwrite the proof of the rollback.
func TestVerifyChainSaveCheckpointChecksTheOldOne(t *testing.T) {
	l, saved := base(t)
	before, err := os.ReadFile(saved)
	if err != nil {
		t.Fatal(err)
	}

	// The intact log: checked against the old checkpoint, then saved.
	code, out, errOut := runCLI(t, "verify-chain", l.dir, "--key", l.vkey, "--save-checkpoint", saved)
	if code != exitcode.ExitOK || !strings.Contains(out, "consistent with the saved checkpoint") || !strings.Contains(out, "Saved checkpoint") {
		t.Fatalf("intact log: exit %d\n%s\n%s", code, out, errOut)
	}
	// Named both ways (--checkpoint F --save-checkpoint F) it is read once.
	code, out, errOut = runCLI(t, "verify-chain", l.dir, "--key", l.vkey, "--checkpoint", saved, "--save-checkpoint", filepath.Join(filepath.Dir(saved), ".", filepath.Base(saved)))
	if code != exitcode.ExitOK || strings.Count(out, "consistent with the saved checkpoint") != 1 {
		t.Fatalf("--checkpoint and --save-checkpoint on one file: exit %d\n%s\n%s", code, out, errOut)
	}

	// Rolled back: truncation is detected and the saved checkpoint is kept.
	writeLines(t, segPath(l), readLines(t, segPath(l))[:200])
	code, out, errOut = runCLI(t, "verify-chain", l.dir, "--key", l.vkey, "--save-checkpoint", saved)
	if code != exitcode.ExitLogTrunc || !strings.Contains(out+errOut, "has 200 records but the saved checkpoint commits to") {
		t.Fatalf("rolled-back log: exit %d, want %d\n%s\n%s", code, exitcode.ExitLogTrunc, out, errOut)
	}
	after, err := os.ReadFile(saved)
	if err != nil || !bytes.Equal(before, after) {
		t.Fatalf("the saved checkpoint was replaced by the rolled-back log's (err %v)", err)
	}

	// A --save-checkpoint file that cannot be read is an I/O error.
	dirAsFile := t.TempDir()
	if code, _, errOut := runCLI(t, "verify-chain", l.dir, "--key", l.vkey, "--save-checkpoint", dirAsFile); code != exitcode.ExitIO || !strings.Contains(errOut, "--save-checkpoint") {
		t.Fatalf("directory as --save-checkpoint: exit %d\n%s", code, errOut)
	}
}

// TestVerifyChainCheckpointFileNotACheckpoint: a --checkpoint file, or an
// existing --save-checkpoint file, that holds no checkpoint is a usage
// error naming the file (it said "external checkpoint 1" and quoted a whole
// line); the file given to --save-checkpoint is left alone.
func TestVerifyChainCheckpointFileNotACheckpoint(t *testing.T) {
	l, _ := base(t)
	other := filepath.Join(t.TempDir(), "notes.txt")
	junk := "origin.example/log\n" + strings.Repeat("x", 5000) + "\nthird\n\n— sig\n"
	os.WriteFile(other, []byte(junk), 0o644)

	code, _, errOut := runCLI(t, "verify-chain", l.dir, "--key", l.vkey, "--checkpoint", other)
	if code != exitcode.ExitUsage || !strings.Contains(errOut, "--checkpoint "+other+": malformed checkpoint: size") || len(errOut) > 600 {
		t.Fatalf("--checkpoint junk: exit %d\n%s", code, errOut)
	}
	code, _, errOut = runCLI(t, "verify-chain", l.dir, "--key", l.vkey, "--save-checkpoint", other)
	if code != exitcode.ExitUsage || !strings.Contains(errOut, "--save-checkpoint "+other+": the file exists and holds no checkpoint") {
		t.Fatalf("--save-checkpoint onto junk: exit %d\n%s", code, errOut)
	}
	if b, _ := os.ReadFile(other); string(b) != junk {
		t.Fatal("--save-checkpoint overwrote a file that was not a checkpoint")
	}
}
