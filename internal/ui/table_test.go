package ui

import (
	"bytes"
	"fmt"
	"testing"
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
