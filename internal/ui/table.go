package ui

import (
	"bytes"
	"strings"

	"charm.land/lipgloss/v2"
)

// TableRows writes n rows under headers as Table does (the same borders,
// padding and header style), without holding them: row(i) is called twice
// for each row, once to measure the columns and once to print it, and the
// lines are written to Out in batches as they are made. Table renders the
// whole table in memory first (about 0.4 ms a row through lipgloss), which
// for a replay of a million calls took minutes and gigabytes. A cell is one
// line: a line break in it is printed as a space.
func (p *Printer) TableRows(headers []string, n int, row func(i int) []string) {
	widths := make([]int, len(headers))
	measure := func(cells []string) {
		for j, c := range cells {
			if j < len(widths) {
				widths[j] = max(widths[j], lipgloss.Width(oneLine(c)))
			}
		}
	}
	measure(headers)
	for i := range n {
		measure(row(i))
	}
	var buf bytes.Buffer
	rule := func(left, mid, right string) {
		buf.WriteString(left)
		for j, w := range widths {
			if j > 0 {
				buf.WriteString(mid)
			}
			buf.WriteString(strings.Repeat("─", w+2))
		}
		buf.WriteString(right)
		buf.WriteByte('\n')
	}
	line := func(cells []string, style func(string) string) {
		buf.WriteString("│")
		for j, w := range widths {
			c := ""
			if j < len(cells) {
				c = oneLine(cells[j])
			}
			if j > 0 {
				buf.WriteString("│")
			}
			buf.WriteByte(' ')
			buf.WriteString(style(c))
			buf.WriteString(strings.Repeat(" ", w-lipgloss.Width(c)+1))
		}
		buf.WriteString("│\n")
	}
	// Whole lines only: an escape sequence is never split between two
	// writes to the colorprofile writer.
	flush := func(force bool) {
		if buf.Len() >= 64<<10 || force && buf.Len() > 0 {
			p.Out.Write(buf.Bytes())
			buf.Reset()
		}
	}
	rule("┌", "┬", "┐")
	line(headers, func(s string) string { return styleBold.Render(s) })
	rule("├", "┼", "┤")
	for i := range n {
		line(row(i), func(s string) string { return s })
		flush(false)
	}
	rule("└", "┴", "┘")
	flush(true)
}

func oneLine(s string) string {
	if strings.ContainsAny(s, "\r\n") {
		return strings.NewReplacer("\r\n", " ", "\n", " ", "\r", " ").Replace(s)
	}
	return s
}
