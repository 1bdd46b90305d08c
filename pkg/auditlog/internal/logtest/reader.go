package logtest

import (
	"io"
	"testing"

	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/scan"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// ReaderEntries reads a log with a Reader (and decodes every record).
func ReaderEntries(t *testing.T, dir string) ([]scan.Entry, []record.Record) {
	t.Helper()
	r, err := scan.NewReader(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var es []scan.Entry
	var recs []record.Record
	for {
		e, err := r.Next()
		if err == io.EOF {
			return es, recs
		}
		if err != nil {
			t.Fatal(err)
		}
		rec, err := e.Decode()
		if err != nil {
			t.Fatal(err)
		}
		es, recs = append(es, *e), append(recs, rec)
	}
}
