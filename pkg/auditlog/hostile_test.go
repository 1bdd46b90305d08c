package auditlog

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logdir"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logtest"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// TestFIFOInPlaceOfASegmentIsRefused: a FIFO where a segment should be is
// refused, saying what it is, by the verifier, the reader and the writer's
// recovery (and the single-segment check: excerpt's
// TestVerifySegmentRefusesAFIFO), instead of blocking them for ever in open.
func TestFIFOInPlaceOfASegmentIsRefused(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, dir, Options{}, 20, 1)
	segs, _ := filepath.Glob(filepath.Join(dir, "epoch-*", "seg-*.jsonl"))
	last := segs[len(segs)-1]
	if err := os.Remove(last); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(last, 0o600); err != nil {
		t.Fatal(err)
	}
	err := logtest.Within(t, 10*time.Second, "Verify", func() error { _, err := Verify(dir, VerifyOptions{}); return err })
	if err == nil || !strings.Contains(err.Error(), "not a regular file") && !strings.Contains(err.Error(), "named pipe") {
		t.Fatalf("Verify: %v", err)
	}
	err = logtest.Within(t, 10*time.Second, "the reader", func() error {
		r, err := NewReader(dir)
		if err != nil {
			return err
		}
		defer r.Close()
		for {
			if _, err := r.Next(); err != nil {
				return err
			}
		}
	})
	if err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("reader: %v", err)
	}
	err = logtest.Within(t, 10*time.Second, "Open", func() error {
		w, err := Open(dir, Options{Key: logtest.Key(t)})
		if err == nil {
			w.Close()
		}
		return err
	})
	if err == nil {
		t.Fatal("Open recovered a log whose last segment is a FIFO")
	}
}

// TestSignedNamesAreNotEpochs: "epoch-+00001" and "seg-+00009.jsonl" are not
// names of the log (six ASCII digits are): they are ignored, not read as
// epoch 1 or segment 9.
func TestSignedNamesAreNotEpochs(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, dir, Options{}, 20, 1)
	if err := os.Mkdir(filepath.Join(dir, "epoch-+00001"), 0o700); err != nil {
		t.Fatal(err)
	}
	ep, _ := filepath.Glob(filepath.Join(dir, "epoch-0*"))
	if err := os.WriteFile(filepath.Join(ep[0], "seg-+00009.jsonl"), []byte("hi\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Verify(dir, VerifyOptions{}); err != nil {
		t.Fatalf("a log with stray signed names: %v", err)
	}
	if n, ok := logdir.ParseNumbered("epoch-+00001", "epoch-", ""); ok {
		t.Fatalf("epoch-+00001 parsed as %d", n)
	}
}

// TestVaultLineTooLong: a vault line past the bound is refused with the
// file and line, not read into memory whole.
func TestVaultLineTooLong(t *testing.T) {
	defer func(n int) { maxVaultLine = n }(maxVaultLine)
	maxVaultLine = 1 << 10
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, VaultFile), []byte(strings.Repeat("a", 4<<10)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := (&Opener{}).LoadVault(dir)
	if err == nil || !strings.Contains(err.Error(), VaultFile+":1") {
		t.Fatalf("LoadVault: %v", err)
	}
}

// TestAppendErrorMeansNotWritten: an Append whose context ends while its
// record waits reports an error only if the record was not written, and
// success only if it was: the log never holds a record its appender was
// told failed (appends race short deadlines in group durability).
func TestAppendErrorMeansNotWritten(t *testing.T) {
	dir := t.TempDir()
	w, err := Open(dir, Options{Key: logtest.Key(t), Durability: record.DurabilityGroup})
	if err != nil {
		t.Fatal(err)
	}
	const n = 400
	ok := make([]bool, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%7)*50*time.Microsecond)
			defer cancel()
			_, err := w.Append(ctx, &record.Session{ID: fmt.Sprint(i), Event: "start", Agent: "a", Front: "http"})
			ok[i] = err == nil
		}()
	}
	wg.Wait()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	written := make([]bool, n)
	r, err := NewReader(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for {
		e, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		rec, err := e.Decode()
		if err != nil {
			t.Fatal(err)
		}
		if s, isSession := rec.(*record.Session); isSession {
			var i int
			fmt.Sscan(s.ID, &i)
			written[i] = true
		}
	}
	failed := 0
	for i := range n {
		if ok[i] != written[i] {
			t.Fatalf("record %d: Append succeeded %v, written %v", i, ok[i], written[i])
		}
		if !ok[i] {
			failed++
		}
	}
	t.Logf("%d of %d appends ended by their context before being queued", failed, n)
}

// TestVaultTornLineIsReported: the payloads before a torn final line are
// read, and the torn line's length is reported, not passed over.
func TestVaultTornLineIsReported(t *testing.T) {
	dir := t.TempDir()
	whole := `{"age":"YQ==","id":"1"}` + "\n"
	if err := os.WriteFile(filepath.Join(dir, VaultFile), []byte(whole+`{"age":"Y`), 0o600); err != nil {
		t.Fatal(err)
	}
	o := &Opener{}
	if err := o.LoadVault(dir); err != nil {
		t.Fatal(err)
	}
	if o.VaultTorn() != 9 || len(o.vault) != 1 || string(o.vault[1]) != "a" {
		t.Fatalf("torn %d, vault %v", o.VaultTorn(), o.vault)
	}
	if err := os.WriteFile(filepath.Join(dir, VaultFile), []byte(whole), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := o.LoadVault(dir); err != nil || o.VaultTorn() != 0 {
		t.Fatalf("whole vault: torn %d, %v", o.VaultTorn(), err)
	}
}
