package scan_test

import (
	"bytes"
	"fmt"
	"io"
	"math/rand"
	"os"
	"path/filepath"
	"testing"

	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logdir"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logtest"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/scan"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// wholeFileLastCheckpoint is the reference for lastCheckpointLine: the
// scan that read the whole segment into memory (before ebb2f30's chunked
// scan), whose answers the chunked scan must give.
func wholeFileLastCheckpoint(b []byte) int64 {
	end := bytes.LastIndexByte(b, '\n')
	for end > 0 {
		start := bytes.LastIndexByte(b[:end], '\n') + 1
		if e, err := record.ParseLine(b[start:end]); err == nil && e.Kind == record.KindCheckpoint {
			return int64(start)
		}
		end = start - 1
	}
	return -1
}

// countingReader counts the ReadAt calls and the bytes they read.
type countingReader struct {
	r            io.ReaderAt
	calls, bytes int64
}

func (c *countingReader) ReadAt(p []byte, off int64) (int, error) {
	c.calls++
	n, err := c.r.ReadAt(p, off)
	c.bytes += int64(n)
	return n, err
}

// checkpointedSegment writes a log with a checkpoint every cpEvery records
// and returns its first segment and its checkpoint lines.
func checkpointedSegment(t *testing.T, cpEvery, n int) ([]byte, [][]byte) {
	t.Helper()
	dir := t.TempDir()
	writeLog(t, dir, auditlog.Options{CheckpointEvery: int64(cpEvery)}, n, 1)
	base, err := os.ReadFile(filepath.Join(dir, logdir.EpochName(1), logdir.SegmentName(1)))
	if err != nil {
		t.Fatal(err)
	}
	var cps [][]byte
	for _, l := range bytes.SplitAfter(base, []byte("\n")) {
		if e, err := record.ParseLine(bytes.TrimSuffix(l, []byte("\n"))); err == nil && e.Kind == record.KindCheckpoint {
			cps = append(cps, l)
		}
	}
	if len(cps) == 0 {
		t.Fatal("no checkpoint in the log")
	}
	return base, cps
}

// TestLastCheckpointLineAgreesWithTheWholeFileScan: the chunked backward
// scan finds the checkpoint the whole-file scan finds, on tails built
// around the chunk boundaries (zero runs, line breaks at and across a
// boundary, a checkpoint line straddling one, CR LF, lines longer than a
// chunk or than MaxLineBytes, random cuts with zero tails), for the real
// chunk size and for small ones that put many boundaries inside lines.
func TestLastCheckpointLineAgreesWithTheWholeFileScan(t *testing.T) {
	base, cps := checkpointedSegment(t, 7, 40)
	const chunk = scan.ScanChunk
	pad := func(n int, c byte) []byte { return bytes.Repeat([]byte{c}, max(n, 0)) }
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	variants := map[string][]byte{
		"log":           base,
		"crlf":          bytes.ReplaceAll(base, []byte("\n"), []byte("\r\n")),
		"long line":     cat(base, pad(3*chunk, 'q'), []byte("\n")),
		"huge line":     cat(base, pad(record.MaxLineBytes+10, 'q'), []byte("\n")),
		"empty":         nil,
		"only newlines": []byte("\n\n\n"),
		"one cp":        cps[0],
		"one cp no nl":  bytes.TrimSuffix(cps[0], []byte("\n")),
		"newline tail":  cat(base, pad(20000, '\n')),
		"cp after nls":  cat(pad(3*chunk, '\n'), cps[0], pad(chunk+5, '\n')),
	}
	for d := -2; d <= 2; d++ {
		variants[fmt.Sprintf("zeros to chunk%+d", d)] = cat(base, pad(chunk-len(base)+d, 0))
		variants[fmt.Sprintf("newline at chunk%+d", d)] = cat(base, pad(chunk-len(base)+d, 'x'), []byte("\n"))
		variants[fmt.Sprintf("cp straddles%+d", d)] = cat(base, pad(chunk, 'y'), []byte("\n"), cps[0], pad(chunk-len(cps[0])/2+d, 'z'))
	}
	rng := rand.New(rand.NewSource(1))
	for i := range 100 {
		variants[fmt.Sprintf("random %d", i)] = cat(base[:rng.Intn(len(base)+1)], pad(rng.Intn(2*chunk), 0))
	}
	for name, b := range variants {
		want := wholeFileLastCheckpoint(b)
		for _, size := range []int{chunk, 4096, 97, 1} {
			if size == 1 && len(b) > 1<<20 {
				continue
			}
			if got := scan.LastCheckpointIn(bytes.NewReader(b), int64(len(b)), size); got != want {
				t.Errorf("%s, chunk %d: %d, the whole-file scan %d", name, size, got, want)
			}
		}
	}
	// And through the file.
	for _, name := range []string{"log", "cp straddles+1", "newline tail", "empty"} {
		p := filepath.Join(t.TempDir(), logdir.SegmentName(1))
		if err := os.WriteFile(p, variants[name], 0o600); err != nil {
			t.Fatal(err)
		}
		if got, want := scan.LastCheckpointLine(p), wholeFileLastCheckpoint(variants[name]); got != want {
			t.Errorf("%s from the file: %d, want %d", name, got, want)
		}
	}
}

// TestLastCheckpointLineReadsEachChunkOnce: the backward scan reads the
// tail after the last checkpoint about once, whatever the number of lines
// in it: a torn tail of 20,000 line breaks (or a megabyte of them) costs a
// few chunk reads, not one 256 KiB read per line (5 GB for 20,000 lines:
// 198 ms against 3.6 ms for the whole-file scan; a megabyte of "\n" took
// about 10 s).
func TestLastCheckpointLineReadsEachChunkOnce(t *testing.T) {
	base, _ := checkpointedSegment(t, 1000, 995)
	for _, tc := range []struct {
		name string
		tail []byte
	}{
		{"20000 newlines", bytes.Repeat([]byte("\n"), 20000)},
		{"1 MiB of newlines", bytes.Repeat([]byte("\n"), 1<<20)},
		{"short lines", bytes.Repeat([]byte("x\n"), 300000)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := append(append([]byte{}, base...), tc.tail...)
			r := &countingReader{r: bytes.NewReader(b)}
			got := scan.LastCheckpointIn(r, int64(len(b)), scan.ScanChunk)
			if want := wholeFileLastCheckpoint(b); got != want || got < 0 {
				t.Fatalf("checkpoint at %d, want %d", got, want)
			}
			// What is scanned is the file after the checkpoint's line; the
			// lines it parses are read again only where they cross a chunk.
			scanned := int64(len(b)) - got
			chunks := scanned/scan.ScanChunk + 2
			if r.calls > 2*chunks+2 || r.bytes > 2*(chunks*scan.ScanChunk) {
				t.Fatalf("%d ReadAt calls reading %d bytes to scan %d bytes back (%d chunks)", r.calls, r.bytes, scanned, chunks)
			}
		})
	}
}

// TestLastCheckpointLineIsParsed: crash recovery finds the last checkpoint
// by its kind, not by a body that holds the same bytes.
func TestLastCheckpointLineIsParsed(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, dir, auditlog.Options{}, 5, 1)
	seg := filepath.Join(dir, logdir.EpochName(1), logdir.SegmentName(1))
	want := scan.LastCheckpointLine(seg)
	if want < 0 {
		t.Fatal("no checkpoint found")
	}
	line := record.AppendLine(nil, record.KindSession, []byte(`{"x":{"a":1,"kind":"checkpoint","z":2}}`), [32]byte{}, 99, "2026-12-01T00:00:00Z")
	f, err := os.OpenFile(seg, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write(append(line, '\n'))
	f.Close()
	if got := scan.LastCheckpointLine(seg); got != want {
		t.Fatalf("last checkpoint at %d, want %d (a session record's body was taken for one)", got, want)
	}
}

// writeLog writes n call records with conc appenders and closes the writer.
func writeLog(t testing.TB, dir string, opts auditlog.Options, n, conc int) *auditlog.Writer {
	t.Helper()
	if opts.Key == nil {
		opts.Key = logtest.Key(t)
	}
	return logtest.WriteLog(t, func() (*auditlog.Writer, error) { return auditlog.Open(dir, opts) }, n, conc)
}
