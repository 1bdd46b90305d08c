package auditlog

import (
	"context"
	"errors"
	"os"
	"syscall"
	"testing"

	"filippo.io/age"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logtest"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// TestFatalSyncError: a failed fdatasync stops the writer like a failed
// write, for the segment and for the vault. The file's descriptor is
// replaced by a pipe: the write succeeds, fdatasync fails (EINVAL). Only a
// failed write was tested, and a writer that ignored fdatasync's error
// passed (found in review).
func TestFatalSyncError(t *testing.T) {
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		file func(w *Writer) *os.File
	}{
		{"segment", func(w *Writer) *os.File { return w.f }},
		{"vault", func(w *Writer) *os.File { return w.vaultF }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, err := Open(t.TempDir(), Options{Key: logtest.Key(t), Recipients: []string{id.Recipient().String()}, Vault: true, Durability: record.DurabilityStrict})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := w.Append(context.Background(), logtest.SampleCall(w, 0)); err != nil {
				t.Fatal(err)
			}
			pr, pw, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			defer pr.Close()
			defer pw.Close()
			if err := syscall.Dup2(int(pw.Fd()), int(tc.file(w).Fd())); err != nil {
				t.Fatal(err)
			}
			_, err1 := w.Append(context.Background(), logtest.SampleCall(w, 1))
			var fe *FatalError
			if !errors.As(err1, &fe) || !errors.Is(err1, syscall.EINVAL) {
				t.Fatalf("append whose fdatasync fails: %v, want a FatalError (EINVAL)", err1)
			}
			for i := range 3 {
				if _, err := w.Append(context.Background(), logtest.SampleCall(w, 2+i)); err != err1 {
					t.Fatalf("append %d after the fatal error: %v", i, err)
				}
			}
			if err := w.Checkpoint(); !errors.Is(err, syscall.EINVAL) {
				t.Fatalf("checkpoint: %v", err)
			}
			if err := w.Close(); !errors.Is(err, syscall.EINVAL) {
				t.Fatalf("close: %v", err)
			}
		})
	}
}
