package ui

import (
	"bytes"
	"strings"
	"testing"

	"github.com/confidential-mcp/cmcp/internal/exitcode"
)

func TestPrinterColour(t *testing.T) {
	tests := []struct {
		name    string
		opts    Options
		env     []string
		wantESC bool
	}{
		{"pipe gets plain text", Options{Output: "text", Color: "auto"}, []string{"TERM=xterm-256color"}, false},
		{"always forces colour on a pipe", Options{Output: "text", Color: "always"}, []string{"TERM=xterm-256color"}, true},
		{"never is plain", Options{Output: "text", Color: "never"}, []string{"TERM=xterm-256color"}, false},
		{"NO_COLOR in auto is plain", Options{Output: "text", Color: "auto"}, []string{"TERM=xterm-256color", "NO_COLOR=1"}, false},
		{"json is never styled", Options{Output: "json", Color: "always"}, []string{"TERM=xterm-256color"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			p := NewPrinter(&out, &errb, tt.opts, tt.env)
			if p.JSONOut {
				if err := p.JSON(map[string]any{"schema_version": SchemaVersion, "ok": p.OK("yes")}); err != nil {
					t.Fatal(err)
				}
			} else {
				p.Printf("%s %s\n", p.OK("ok"), p.Bad("bad"))
				p.Table([]string{"a"}, [][]string{{p.Warn("w")}})
			}
			if got := strings.Contains(out.String(), "\x1b["); got != tt.wantESC {
				t.Fatalf("escape sequences present = %v, want %v; output %q", got, tt.wantESC, out.String())
			}
			if errb.Len() != 0 {
				t.Fatalf("diagnostics written for plain output: %q", errb.String())
			}
		})
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, o := range []Options{{"xml", "auto"}, {"text", "sometimes"}} {
		if err := o.Validate(); exitcode.CodeOf(err) != exitcode.ExitUsage {
			t.Errorf("Validate(%+v) = %v (code %d), want a usage error", o, err, exitcode.CodeOf(err))
		}
	}
	if err := (&Options{"json", "never"}).Validate(); err != nil {
		t.Fatal(err)
	}
}
