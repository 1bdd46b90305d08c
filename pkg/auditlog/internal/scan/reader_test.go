package scan_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logdir"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logtest"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/scan"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// TestReaderLongLines: the Reader's buffer is smaller than the longest
// line it accepts. A record longer than the buffer is read whole, the same
// bytes as in the file; a line of MaxLineBytes (and its '\n') is a line
// (here malformed), and MaxLineBytes+1 bytes without a line break are
// refused as too long (MaxLineBytes of them are a torn write).
func TestReaderLongLines(t *testing.T) {
	dir := t.TempDir()
	w, err := auditlog.Open(dir, auditlog.Options{Key: logtest.Key(t)})
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("s", 3*scan.ReaderBuffer+17)
	for _, id := range []string{"short", long, "after"} {
		if _, err := w.Append(context.Background(), &record.Session{ID: id, Event: "start", Agent: "a"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	seg := filepath.Join(dir, logdir.EpochName(1), logdir.SegmentName(1))
	file, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	es, recs := logtest.ReaderEntries(t, dir)
	var ids []string
	for i, e := range es {
		if !bytes.Contains(file, append(append([]byte{}, e.Line...), '\n')) {
			t.Fatalf("entry %d is not a line of the file", i)
		}
		if s, ok := recs[i].(*record.Session); ok {
			ids = append(ids, s.ID)
		}
	}
	if len(ids) != 3 || ids[0] != "short" || ids[1] != long || ids[2] != "after" {
		t.Fatalf("sessions read: %d, want short, the long one, after", len(ids))
	}

	next := func(b []byte) error {
		if err := os.WriteFile(seg, b, 0o600); err != nil {
			t.Fatal(err)
		}
		r, err := scan.NewReader(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		_, err = r.Next()
		return err
	}
	// One buffer for every case (4 MiB under the race detector is slow to
	// fill and copy).
	b := bytes.Repeat([]byte("x"), record.MaxLineBytes+1)
	var ve *record.VerifyError
	b[record.MaxLineBytes] = '\n'
	if err := next(b[:record.MaxLineBytes+1]); !errors.As(err, &ve) || !strings.Contains(ve.Msg, "malformed record") {
		t.Fatalf("a line of MaxLineBytes: %v, want a malformed record", err)
	}
	b[record.MaxLineBytes] = 'x'
	if err := next(b[:record.MaxLineBytes]); err != io.EOF {
		t.Fatalf("MaxLineBytes without a line break (a torn write): %v, want io.EOF", err)
	}
	if err := next(b[:record.MaxLineBytes+1]); !errors.As(err, &ve) || !strings.Contains(ve.Msg, "line is longer than") {
		t.Fatalf("MaxLineBytes+1, no line break: %v, want a line longer than MaxLineBytes", err)
	}
}
