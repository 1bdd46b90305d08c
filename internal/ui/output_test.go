package ui

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
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
		if err := o.Validate(); CodeOf(err) != ExitUsage {
			t.Errorf("Validate(%+v) = %v (code %d), want a usage error", o, err, CodeOf(err))
		}
	}
	if err := (&Options{"json", "never"}).Validate(); err != nil {
		t.Fatal(err)
	}
}

type coded struct{}

func (coded) Error() string   { return "coded" }
func (coded) ExitCode() int   { return ExitLogFork }
func (coded) Hints() []string { return []string{"from the library"} }

func TestCodesAndHints(t *testing.T) {
	if CodeOf(nil) != ExitOK || CodeOf(errors.New("x")) != ExitFailure {
		t.Fatal("nil must be 0 and an uncoded error 1")
	}
	err := fmt.Errorf("open log: %w", Errorf(ExitIO, "read: %w", coded{}).Hint("check the path"))
	if CodeOf(err) != ExitIO {
		t.Fatalf("outermost *Error must decide the code, got %d", CodeOf(err))
	}
	if h := HintsOf(err); len(h) != 2 || h[0] != "check the path" || h[1] != "from the library" {
		t.Fatalf("hints = %q", h)
	}
	if CodeOf(fmt.Errorf("wrapped: %w", coded{})) != ExitLogFork {
		t.Fatal("a Coder in the chain must give its code")
	}
	seen := map[int]bool{}
	for _, c := range ExitCodes {
		if seen[c.Code] {
			t.Fatalf("exit code %d listed twice", c.Code)
		}
		seen[c.Code] = true
	}
}
