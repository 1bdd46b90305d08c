// Package ui renders cmcp's output: lipgloss styling for people, versioned
// JSON for programs and the single error voice. The exit codes and the error
// type it prints live in internal/errs.
package ui

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"charm.land/lipgloss/v2"
	"charm.land/lipgloss/v2/table"
	"github.com/charmbracelet/colorprofile"
	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/spf13/pflag"
	"golang.org/x/term"
)

// SchemaVersion is the version of every JSON document cmcp prints. It changes
// only when a field is removed or changes meaning:
//
//   - 2: verify-chain's records, first and last count and date only the
//     records a checkpoint signs (unsigned_records counts the others);
//     `attested` (attest verify, verify-chain's evidence) is true only for
//     SEV-SNP or TDX evidence that verified.
const SchemaVersion = 2

// Options are the output flags every verb has.
type Options struct {
	Output string // text or json
	Color  string // auto, always or never
}

// AddFlags registers --output and --color.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVarP(&o.Output, "output", "o", "text", "output format: text or json")
	fs.StringVar(&o.Color, "color", "auto", "colour: auto, always or never (any non-empty NO_COLOR means never in auto)")
}

// Validate checks the flag values.
func (o *Options) Validate() error {
	switch o.Output {
	case "text", "json":
	default:
		return exitcode.Errorf(exitcode.ExitUsage, "--output %q: want text or json", o.Output)
	}
	switch o.Color {
	case "auto", "always", "never":
	default:
		return exitcode.Errorf(exitcode.ExitUsage, "--color %q: want auto, always or never", o.Color)
	}
	return nil
}

// Printer writes a verb's results: styled text for people (plain in pipes),
// or a JSON document for programs. Diagnostics and progress go to Err.
type Printer struct {
	Out     io.Writer // results; a colorprofile.Writer in text mode
	Err     io.Writer // diagnostics, warnings, progress
	JSONOut bool
	styled  bool
	errTTY  bool
}

// NewPrinter builds a Printer for stdout and stderr from the output options
// and the environment (nil means os.Environ()).
func NewPrinter(stdout, stderr io.Writer, o Options, environ []string) *Printer {
	if environ == nil {
		environ = os.Environ()
	}
	p := &Printer{Err: stderr, JSONOut: o.Output == "json"}
	p.errTTY = isTerminal(stderr)
	if p.JSONOut {
		p.Out = stdout
		return p
	}
	cw := colorprofile.NewWriter(stdout, environ)
	noColor := false
	for _, kv := range environ {
		if v, ok := strings.CutPrefix(kv, "NO_COLOR="); ok && v != "" {
			noColor = true
		}
	}
	switch {
	case o.Color == "always":
		if cw.Profile < colorprofile.ANSI {
			cw.Profile = colorprofile.ANSI256
		}
	case o.Color == "never", noColor, !isTerminal(stdout):
		cw.Profile = colorprofile.NoTTY
	}
	p.styled = cw.Profile > colorprofile.Ascii
	p.Out = cw
	return p
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// Styled reports whether text output carries colour.
func (p *Printer) Styled() bool { return p.styled }

// JSON writes v as an indented JSON document followed by a newline. v should
// carry a "schema_version" field (see SchemaVersion).
func (p *Printer) JSON(v any) error {
	enc := json.NewEncoder(p.Out)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// Printf writes formatted text to Out.
func (p *Printer) Printf(format string, args ...any) { fmt.Fprintf(p.Out, format, args...) }

// Warnf writes a warning line to Err.
func (p *Printer) Warnf(format string, args ...any) {
	fmt.Fprintf(p.Err, "cmcp: warning: %s\n", CleanLines(fmt.Sprintf(format, args...)))
}

var (
	styleOK   = lipgloss.NewStyle().Foreground(lipgloss.Green).Bold(true)
	styleBad  = lipgloss.NewStyle().Foreground(lipgloss.Red).Bold(true)
	styleWarn = lipgloss.NewStyle().Foreground(lipgloss.Yellow)
	styleDim  = lipgloss.NewStyle().Foreground(lipgloss.BrightBlack)
	styleBold = lipgloss.NewStyle().Bold(true)
	styleHead = lipgloss.NewStyle().Bold(true).Padding(0, 1)
	styleCell = lipgloss.NewStyle().Padding(0, 1)
)

// OK, Bad, Warn, Dim and Bold style a word for text output. The
// colorprofile writer strips the styling when Out is not a colour terminal.
func (p *Printer) OK(s string) string   { return styleOK.Render(s) }
func (p *Printer) Bad(s string) string  { return styleBad.Render(s) }
func (p *Printer) Warn(s string) string { return styleWarn.Render(s) }
func (p *Printer) Dim(s string) string  { return styleDim.Render(s) }
func (p *Printer) Bold(s string) string { return styleBold.Render(s) }

// Table renders rows under headers as a bordered table and writes it to Out.
func (p *Printer) Table(headers []string, rows [][]string) {
	t := table.New().
		Border(lipgloss.NormalBorder()).
		Headers(headers...).
		Rows(rows...).
		StyleFunc(func(row, col int) lipgloss.Style {
			if row == table.HeaderRow {
				return styleHead
			}
			return styleCell
		})
	fmt.Fprintln(p.Out, t.Render())
}

// Progress shows the progress of long work on a terminal. On a pipe or in
// JSON mode it prints nothing. It is safe for concurrent use.
type Progress struct {
	mu    sync.Mutex
	w     io.Writer
	label string
	total int64
	done  int64
	last  time.Time
	on    bool
}

// Progress starts a progress line with the given total (0 if unknown).
func (p *Printer) Progress(label string, total int64) *Progress {
	return &Progress{w: p.Err, label: label, total: total, on: p.errTTY && !p.JSONOut}
}

// Add advances the progress by n units.
func (g *Progress) Add(n int64) {
	if g == nil || !g.on {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.done += n
	if now := time.Now(); now.Sub(g.last) >= 100*time.Millisecond {
		g.last = now
		g.draw()
	}
}

func (g *Progress) draw() {
	if g.total > 0 {
		fmt.Fprintf(g.w, "\r%s %d/%d (%d%%)", g.label, g.done, g.total, g.done*100/g.total)
	} else {
		fmt.Fprintf(g.w, "\r%s %d", g.label, g.done)
	}
}

// Done clears the progress line.
func (g *Progress) Done() {
	if g == nil || !g.on {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	fmt.Fprint(g.w, "\r\033[K")
}

// Status replaces the progress count with a short status text (for work
// whose progress is not one number), at most ten times a second.
func (g *Progress) Status(s string) {
	if g == nil || !g.on {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if now := time.Now(); now.Sub(g.last) >= 100*time.Millisecond {
		g.last = now
		fmt.Fprintf(g.w, "\r%s %s\033[K", g.label, s)
	}
}
