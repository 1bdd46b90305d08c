package ui

import (
	"bytes"
	"fmt"
	"strings"
	"unicode/utf8"

	"charm.land/lipgloss/v2"
)

// TableRows writes n rows under headers as Table does (the same borders,
// padding and header style), without holding them: row(i) is called twice
// for each row, once to measure the columns and once to print it, and the
// lines are written to Out in batches as they are made. Table renders the
// whole table in memory first (about 0.4 ms a row through lipgloss), which
// for a replay of a million calls took minutes and gigabytes. A cell is one
// line: a tab or line break in it is printed as a space, and any control
// character or escape sequence other than the colour of a styled cell is
// shown escaped (see Clean).
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

// oneLine makes a cell one line of text that is safe to print: its colour
// (SGR) sequences, which the Printer's styles put there, are kept, and a
// colour still set at its end is reset there; everything else goes through
// Clean (tabs and line breaks become spaces, other control characters and
// any other escape sequence are shown escaped).
func oneLine(s string) string {
	if strings.IndexByte(s, 0x1b) < 0 {
		return Clean(s)
	}
	var b strings.Builder
	styled := false
	for s != "" {
		i := strings.IndexByte(s, 0x1b)
		if i < 0 {
			b.WriteString(Clean(s))
			break
		}
		b.WriteString(Clean(s[:i]))
		s = s[i:]
		if n := sgrLen(s); n > 0 {
			b.WriteString(s[:n])
			styled = true
			s = s[n:]
			continue
		}
		b.WriteString(`\x1b`)
		s = s[1:]
	}
	out := b.String()
	if styled && !strings.HasSuffix(out, "\x1b[m") && !strings.HasSuffix(out, "\x1b[0m") {
		out += "\x1b[m"
	}
	return out
}

// sgrLen returns the length of the SGR sequence (ESC [ params m) s starts
// with, or 0.
func sgrLen(s string) int {
	if len(s) < 3 || s[0] != 0x1b || s[1] != '[' {
		return 0
	}
	for i := 2; i < len(s); i++ {
		switch c := s[i]; {
		case c == 'm':
			return i + 1
		case c >= '0' && c <= '9', c == ';', c == ':':
		default:
			return 0
		}
	}
	return 0
}

// Clean returns s as one line of plain text that is safe to print to a
// terminal, for text that comes from a log or an agent (a client name, a
// session id, a tool): a tab and every line break (CR, LF, CR LF, NEL,
// U+2028, U+2029) become a space, and every other control character (C0,
// DEL, C1), bidirectional control and byte that is not UTF-8 is shown
// escaped (\x1b, \u009b, \u202e), so that it can neither send an escape
// sequence to the terminal nor misalign a table.
func Clean(s string) string {
	if isClean(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\r' && strings.HasPrefix(s[i:], "\r\n"):
			b.WriteByte(' ')
			n = 2
		case r == '\t', r == '\n', r == '\r', r == 0x85, r == 0x2028, r == 0x2029:
			b.WriteByte(' ')
		case r < 0x20, r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r >= 0x80 && r < 0xa0, bidiControl(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// CleanLines is Clean for text of several lines (a warning, an error that
// may quote a log or an agent): each line is cleaned, the line breaks
// between them kept.
func CleanLines(s string) string {
	if isClean(strings.ReplaceAll(s, "\n", " ")) {
		return s
	}
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = Clean(l)
	}
	return strings.Join(lines, "\n")
}

// isClean reports whether Clean would leave s as it is.
func isClean(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == 0x7f {
			return false
		} else if c >= 0x80 {
			for j, r := range s[i:] {
				if r == utf8.RuneError && !strings.HasPrefix(s[i+j:], "\uFFFD") ||
					r < 0x20 || r == 0x7f || r >= 0x80 && r < 0xa0 || r == 0x2028 || r == 0x2029 || bidiControl(r) {
					return false
				}
			}
			return true
		}
	}
	return true
}

// bidiControl reports whether r reorders the text around it on display
// (the Unicode bidirectional formatting characters).
func bidiControl(r rune) bool {
	return r == 0x061c || r == 0x200e || r == 0x200f || r >= 0x202a && r <= 0x202e || r >= 0x2066 && r <= 0x2069
}
