package digest

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseScript(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		want       *Script // nil: not a script
		err        error
	}{
		{"elf", "\x7fELF\x02\x01", nil, nil},
		{"empty", "", nil, nil},
		{"plain", "#!/bin/sh\necho\n", &Script{Line: "/bin/sh", Interpreter: "/bin/sh"}, nil},
		{"one argument", "#! /usr/bin/python3 -E -s \t\nx", &Script{Line: " /usr/bin/python3 -E -s \t", Interpreter: "/usr/bin/python3", Arg: "-E -s"}, nil},
		{"tab", "#!/bin/bash\t-e\n", &Script{Line: "/bin/bash\t-e", Interpreter: "/bin/bash", Arg: "-e"}, nil},
		{"no newline", "#!/bin/sh", &Script{Line: "/bin/sh", Interpreter: "/bin/sh"}, nil},
		{"env", "#!/usr/bin/env node\n", &Script{Line: "/usr/bin/env node", Interpreter: "node", Env: true}, nil},
		{"env elsewhere", "#!/bin/env  python3 \n", &Script{Line: "/bin/env  python3 ", Interpreter: "python3", Env: true}, nil},
		{"env -S", "#!/usr/bin/env -S node --flag\n", nil, ErrShebang},
		{"env assignment", "#!/usr/bin/env A=1 node\n", nil, ErrShebang},
		{"env path", "#!/usr/bin/env ./node\n", nil, ErrShebang},
		{"env alone", "#!/usr/bin/env\n", nil, ErrShebang},
		{"relative", "#!bin/sh\n", nil, ErrShebang},
		{"no interpreter", "#!  \n", nil, ErrShebang},
		{"nul", "#!/bin/sh\x00x\n", nil, ErrShebang},
		{"too long", "#!/bin/" + strings.Repeat("x", 300) + "\n", nil, ErrShebang},
		{"carriage return kept", "#!/bin/sh\r\n", &Script{Line: "/bin/sh\r", Interpreter: "/bin/sh\r"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseScript(strings.NewReader(tc.file))
			if !errors.Is(err, tc.err) || (err == nil) != (tc.err == nil) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			switch {
			case got == nil && tc.want == nil:
			case got == nil || tc.want == nil || *got != *tc.want:
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestScriptResolve(t *testing.T) {
	dir := t.TempDir()
	interp := filepath.Join(dir, "interp")
	if err := os.WriteFile(interp, []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink("interp", link); err != nil {
		t.Fatal(err)
	}
	abs := &Script{Line: link, Interpreter: link}
	if err := abs.Resolve("/nonexistent"); err != nil || abs.Resolved != interp {
		t.Fatalf("absolute: %v, %q", err, abs.Resolved)
	}
	env := &Script{Line: "/usr/bin/env link", Interpreter: "link", Env: true}
	if err := env.Resolve("relative:" + dir); err != nil || env.Resolved != interp {
		t.Fatalf("env: %v, %q", err, env.Resolved)
	}
	if err := env.Resolve("/nonexistent"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("env, not on PATH: %v", err)
	}
}

func FuzzParseScript(f *testing.F) {
	for _, s := range []string{"#!/bin/sh\n", "#!/usr/bin/env node\n", "#! /usr/bin/python3 -E\n", "#!/usr/bin/env -S a b\n", "\x7fELF", "#!"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sc, err := ParseScript(strings.NewReader(s))
		if err != nil {
			return
		}
		if sc == nil {
			if strings.HasPrefix(s, "#!") {
				t.Fatalf("%q: a #! file read as no script", s)
			}
			return
		}
		if !filepath.IsAbs(sc.Interpreter) && !sc.Env || sc.Env && sc.Arg != "" || strings.ContainsAny(sc.Interpreter, " \t\n") {
			t.Fatalf("%q: %+v", s, sc)
		}
	})
}
