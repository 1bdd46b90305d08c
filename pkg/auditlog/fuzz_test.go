package auditlog

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/confidential-mcp/cmcp/pkg/auditlog/c2sp"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/jcs"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// seedLines returns real lines of a small log (every writer-made kind).
func seedLines(f *testing.F) ([][]byte, string) {
	dir := f.TempDir()
	w := writeLog(f, dir, Options{CheckpointEvery: 4, SegmentBytes: 2048, Durability: record.DurabilityInterval}, 12, 1)
	var lines [][]byte
	segs, _ := filepath.Glob(filepath.Join(dir, "epoch-000001", "seg-*.jsonl"))
	for _, s := range segs {
		b, _ := os.ReadFile(s)
		lines = append(lines, bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n"))...)
	}
	return lines, w.VerifierKey()
}

// FuzzScanLine checks the single-pass canonical-form checker against
// jsontext's canonicalizer (via digest.Canonicalize): a line is accepted
// exactly when it is a JSON object equal to its own RFC 8785 form.
func FuzzScanLine(f *testing.F) {
	lines, _ := seedLines(f)
	for _, l := range lines {
		f.Add(l)
	}
	for _, s := range []string{`{}`, `{"a":1}`, `{"a":1.5}`, `{"a":1e3}`, `{"a":-0}`, `{"b":1,"a":2}`, `{"a":"\u00e9"}`, "{\"a\":\"\u00e9\"}",
		`{"a":"\u001f"}`, `{"a":"\n"}`, `{"a":"\u000a"}`, `{"\ud83d\ude00":1,"\ufb33":2}`, "{\"\U0001F600\":1,\"\ufb33\":2}", "{\"\ufb33\":2,\"\U0001F600\":1}",
		`{"a":9007199254740993}`, `{"a":9007199254740992}`, `{"a":[1,{"b":null}],"c":true}`, `{"a":"\/"}`, `{"a":0.1}`, `{"a":1E3}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		_, err := jcs.ScanLine(in)
		ref, rerr := digest.Canonicalize(in)
		want := rerr == nil && bytes.Equal(ref, in) && len(in) > 0 && in[0] == '{'
		if (err == nil) != want {
			t.Fatalf("scanLine(%q) = %v; reference canonical=%v (%q, %v)", in, err, want, ref, rerr)
		}
	})
}

// FuzzParseLine fuzzes the record parser: no panics, and an accepted line
// is rebuilt byte for byte from its parsed members (so no member can hide).
func FuzzParseLine(f *testing.F) {
	lines, _ := seedLines(f)
	for _, l := range lines {
		f.Add(l)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		e, err := record.ParseLine(in)
		if err != nil {
			return
		}
		if got := record.AppendLine(nil, e.Kind, e.Body, e.Prev, e.Seq, string(e.TS)); !bytes.Equal(got, in) {
			t.Fatalf("parsed line does not round-trip:\n in %q\nout %q", in, got)
		}
		record.DecodeBody(e.Kind, e.Body) // must not panic
	})
}

// FuzzParseCheckpoint fuzzes checkpoint parsing: no panics, and an
// accepted checkpoint's body is exactly origin, size and root.
func FuzzParseCheckpoint(f *testing.F) {
	lines, vkey := seedLines(f)
	for _, l := range lines {
		if e, err := record.ParseLine(l); err == nil && e.Kind == record.KindCheckpoint {
			r, _ := record.DecodeBody(record.KindCheckpoint, e.Body)
			f.Add([]byte(r.(*record.CheckpointRecord).Note))
		}
	}
	f.Add([]byte("o\n1\nAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\nextension\n\n— o abc\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		cp, err := c2sp.ParseCheckpoint(in)
		if err != nil {
			return
		}
		text, _, _ := bytes.Cut(in, []byte("\n\n"))
		body := c2sp.CheckpointBody(cp.Origin, cp.Size, cp.Root)
		if !bytes.HasPrefix(append(text, '\n'), []byte(body)) {
			t.Fatalf("checkpoint %q parsed as %q", in, body)
		}
		c2sp.OpenCheckpoint(in, nil) // nil verifiers: must not panic
		_ = vkey
	})
}
