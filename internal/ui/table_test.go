package ui

import (
	"bytes"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"charm.land/lipgloss/v2"
)

// TestTableRowsLooksLikeTable: TableRows prints what Table prints for the
// same rows (plain, through a pipe), styled words and wide characters
// included.
func TestTableRowsLooksLikeTable(t *testing.T) {
	head := []string{"RECORD", "TOOL", "REPLAY"}
	for _, tc := range []struct {
		name string
		rows func(p *Printer) [][]string
	}{
		{"one row", func(p *Printer) [][]string { return [][]string{{"1:2", "fs__read_file", p.OK("same")}} }},
		{"widths from rows and header", func(p *Printer) [][]string {
			return [][]string{{"1:2", "x", p.Bad("differs: recorded allow")}, {"12:345", "größe→ツール", ""}, {"", "", p.Warn("not-replayable")}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var want, got bytes.Buffer
			pw := NewPrinter(&want, &bytes.Buffer{}, Options{Output: "text", Color: "auto"}, []string{"TERM=xterm-256color"})
			pg := NewPrinter(&got, &bytes.Buffer{}, Options{Output: "text", Color: "auto"}, []string{"TERM=xterm-256color"})
			rows := tc.rows(pw)
			pw.Table(head, rows)
			pg.TableRows(head, len(rows), func(i int) []string { return rows[i] })
			if got.String() != want.String() {
				t.Fatalf("TableRows:\n%s\nTable:\n%s", got.String(), want.String())
			}
		})
	}
}

// TestTableRowsStreams: TableRows writes rows while it is still asked for
// later ones, so that a table of a million rows is never held whole (Table
// renders it in memory first, about 0.4 ms a row).
func TestTableRowsStreams(t *testing.T) {
	var out bytes.Buffer
	p := NewPrinter(&out, &bytes.Buffer{}, Options{Output: "text", Color: "never"}, nil)
	const n = 20000
	seen, early := 0, -1
	p.TableRows([]string{"A", "B"}, n, func(i int) []string {
		if i == n-1 {
			if seen++; seen == 2 && early < 0 {
				early = out.Len() // asked for the last row while printing
			}
		}
		return []string{fmt.Sprint(i), "row"}
	})
	if early <= 0 {
		t.Fatalf("nothing written before the last row was asked for (%d bytes)", early)
	}
	if got := bytes.Count(out.Bytes(), []byte("\n")); got != n+4 {
		t.Fatalf("%d lines, want %d", got, n+4)
	}
}

// BenchmarkTableRows: the cost of a replay-sized row through TableRows
// (compare BenchmarkTable).
func BenchmarkTableRows(b *testing.B) {
	p := NewPrinter(&bytes.Buffer{}, &bytes.Buffer{}, Options{Output: "text", Color: "never"}, nil)
	row := benchRow(p)
	b.ResetTimer()
	p.TableRows(benchHead, b.N, func(int) []string { return row })
}

// BenchmarkTable: the cost of a row through Table (lipgloss), for 2000-row tables.
func BenchmarkTable(b *testing.B) {
	p := NewPrinter(&bytes.Buffer{}, &bytes.Buffer{}, Options{Output: "text", Color: "never"}, nil)
	row := benchRow(p)
	rows := make([][]string, 2000)
	for i := range rows {
		rows[i] = row
	}
	b.ResetTimer()
	for i := 0; i < b.N; i += len(rows) {
		p.Table(benchHead, rows[:min(len(rows), b.N-i)])
	}
}

var benchHead = []string{"RECORD", "TIME", "SESSION", "AGENT", "TOOL", "CLASS", "DECISION", "POLICIES", "MODE", "OUTCOME", "LATENCY", "REPLAY"}

func benchRow(p *Printer) []string {
	return []string{"1:123456", "2026-12-02T00:27:05.149Z", "2O4CCVWEA6SUZFTPUEL2V75I2T", "alice", "fs__read_file", "spawn-measured",
		p.Bad("deny"), "fs-path-outside-data", "enforcing", "refused", "1.413ms", p.Bad("differs: recorded allow by [x], replay gives deny by [y]")}
}

// TestCleanEscapesControlCharacters: Clean makes text from a log safe to
// print on a terminal as one line: tabs and line breaks (CR, LF, NEL,
// U+2028, U+2029) become spaces, and every other control character (C0,
// DEL, C1) and bidirectional control is shown escaped, so that an agent-
// or log-chosen name cannot carry an escape sequence into an auditor's
// terminal or misalign a table.
func TestCleanEscapesControlCharacters(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"plain größe→ツール", "plain größe→ツール"},
		{"tab\there", "tab here"},
		{"esc\x1b[31mred", `esc\x1b[31mred`},
		{"osc\x1b]0;title\x07x", `osc\x1b]0;title\x07x`},
		{"cr\rx", "cr x"},
		{"crlf\r\nx", "crlf x"},
		{"nel\u0085x", "nel x"},
		{"ls\u2028x\u2029y", "ls x y"},
		{"nul\x00del\x7f", `nul\x00del\x7f`},
		{"csi\u009b31mx", `csi\u009b31mx`},
		{"bidi\u202egnp.exe", `bidi\u202egnp.exe`},
		{"bad\xffutf8", "bad\\xffutf8"},
	} {
		if got := Clean(tc.in); got != tc.want {
			t.Errorf("Clean(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestTableRowsNeutralisesControlCharacters: a cell's tab, line breaks and
// control characters are replaced or escaped before it is measured and
// printed, so every line of the table has the same width and nothing but
// the colour (SGR) sequences of styled cells reaches the terminal; a
// colour a cell sets ends with the cell. Before, a tab was printed raw and
// measured as width 0, and an OSC or cursor sequence went to the terminal.
func TestTableRowsNeutralisesControlCharacters(t *testing.T) {
	var out bytes.Buffer
	p := NewPrinter(&out, &bytes.Buffer{}, Options{Output: "text", Color: "always"}, []string{"TERM=xterm-256color", "COLORTERM=truecolor"})
	rows := [][]string{
		{"tab\there", p.Bad("deny")},
		{"esc\x1b[31mred", "z"},
		{"cr\rx", "osc\x1b]0;title\x07x"},
		{"nel\u0085x", "clear\x1b[2J\x1b[Hx"},
		{"ls\u2028x", "csi\u009b31mx\x07"},
	}
	p.TableRows([]string{"A", "B"}, len(rows), func(i int) []string { return rows[i] })
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != len(rows)+4 {
		t.Fatalf("%d lines:\n%s", len(lines), out.String())
	}
	sgr := regexp.MustCompile(`\x1b\[[0-9;:]*m`)
	for _, l := range lines {
		if w, w0 := lipgloss.Width(l), lipgloss.Width(lines[0]); w != w0 {
			t.Errorf("line %q is %d wide, the table %d", l, w, w0)
		}
		for _, r := range sgr.ReplaceAllString(l, "") {
			if r < 0x20 || r == 0x7f || r >= 0x80 && r < 0xa0 || r == '\u2028' {
				t.Errorf("line %q holds control character %U", l, r)
			}
		}
	}
	if !strings.Contains(out.String(), "│ esc\x1b[31mred\x1b[m ") {
		t.Errorf("a cell's colour does not end with it:\n%q", out.String())
	}
}

// TestWarningsAreCleaned: a warning quoting text from a log or an agent (a
// forged session id carrying an OSC title and a clear-screen) reaches the
// terminal escaped, like the tables; the line breaks of a warning of
// several lines are kept.
func TestWarningsAreCleaned(t *testing.T) {
	var out, errOut strings.Builder
	p := &Printer{Out: &out, Err: &errOut}
	p.Warnf("epoch 1, session %s: the recorded session_calls are not 0..0", "EVIL\x1b]0;pwned\x07\x1b[2J")
	p.Warnf("first line\nsecond\tline")
	got := errOut.String()
	if strings.ContainsAny(got, "\x1b\x07\t") {
		t.Fatalf("a raw control character reached the terminal: %q", got)
	}
	want := "cmcp: warning: epoch 1, session EVIL\\x1b]0;pwned\\x07\\x1b[2J: the recorded session_calls are not 0..0\n" +
		"cmcp: warning: first line\nsecond line\n"
	if got != want {
		t.Fatalf("warnings:\n%q\nwant\n%q", got, want)
	}
}
