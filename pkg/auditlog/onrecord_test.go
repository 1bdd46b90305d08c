package auditlog

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logtest"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// TestVerifyOnRecord checks that OnRecord sees exactly the records a Reader
// returns, in order, with the same positions, times, hashes and decoded
// bodies, whether decoded ahead or not.
func TestVerifyOnRecord(t *testing.T) {
	dir := filepath.Join(fixtureDir, "log")
	want, wantRecs := logtest.ReaderEntries(t, dir)
	for _, ahead := range []bool{false, true} {
		var got []Entry
		var gotRecs []record.Record
		opt := VerifyOptions{OnRecord: func(e *Entry) error {
			rec, err := e.Decode()
			if err != nil {
				return err
			}
			got, gotRecs = append(got, *e), append(gotRecs, rec)
			return nil
		}}
		if ahead {
			opt.Decode = func(k record.Kind) bool { return k == record.KindCall || k == record.KindGenesis }
		}
		if _, err := Verify(dir, opt); err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Fatalf("ahead=%v: OnRecord saw %d records, the Reader %d", ahead, len(got), len(want))
		}
		for i := range want {
			w, g := want[i], got[i]
			if g.Pos != w.Pos || g.Kind != w.Kind || g.Index != w.Index || !g.Time.Equal(w.Time) || g.Hash != w.Hash ||
				!bytes.Equal(g.Line, w.Line) || !bytes.Equal(g.Body, w.Body) {
				t.Fatalf("ahead=%v, record %d:\n got %+v\nwant %+v", ahead, i, g.Pos, w.Pos)
			}
			if !reflect.DeepEqual(gotRecs[i], wantRecs[i]) {
				t.Fatalf("ahead=%v, record %d decodes to\n%#v\nwant\n%#v", ahead, i, gotRecs[i], wantRecs[i])
			}
		}
	}
}

// TestVerifyOnRecordError checks that an error from OnRecord stops Verify
// and comes back unchanged.
func TestVerifyOnRecordError(t *testing.T) {
	stop := errors.New("stop here")
	n := 0
	_, err := Verify(filepath.Join(fixtureDir, "log"), VerifyOptions{OnRecord: func(e *Entry) error {
		n++
		if n == 5 {
			return stop
		}
		return nil
	}})
	if err != stop {
		t.Fatalf("Verify returned %v, want the OnRecord error", err)
	}
	if n != 5 {
		t.Fatalf("OnRecord called %d times after its error", n-5)
	}
}

// TestVerifyOnRecordStopsAtDamage alters one record: OnRecord sees it (its
// own form is valid) but nothing after the broken link, and Verify fails.
func TestVerifyOnRecordStopsAtDamage(t *testing.T) {
	dir := t.TempDir()
	for _, ep := range []string{"epoch-000001", "epoch-000002"} {
		if err := os.MkdirAll(filepath.Join(dir, ep), 0o755); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(fixtureDir, "log", ep, "seg-000001.jsonl"))
		if err != nil {
			t.Fatal(err)
		}
		if ep == "epoch-000001" {
			lines := bytes.SplitAfter(b, []byte("\n"))
			i := bytes.Index(lines[3], []byte(`"ts":"`))
			if i < 0 {
				t.Fatalf("no ts in %s", lines[3])
			}
			lines[3][i+len(`"ts":"`)+2] ^= 1 // another decade: still a valid record
			b = bytes.Join(lines, nil)
		}
		if err := os.WriteFile(filepath.Join(dir, ep, "seg-000001.jsonl"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var seen []int64
	_, err := Verify(dir, VerifyOptions{OnRecord: func(e *Entry) error {
		seen = append(seen, e.Index)
		return nil
	}})
	var ve *record.VerifyError
	if !errors.As(err, &ve) || ve.Class != record.ClassIntegrity || ve.Pos.Index != 4 {
		t.Fatalf("Verify: %v", err)
	}
	if len(seen) != 4 || seen[3] != 3 {
		t.Fatalf("OnRecord saw records %v, want 0-3", seen)
	}
}
