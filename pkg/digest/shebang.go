package digest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
)

// Errors returned (wrapped) by ParseScript and Script.Resolve.
var (
	// ErrShebang is a "#!" line the gateway does not run: one longer than
	// the kernel reads, a relative interpreter path, env with options.
	ErrShebang = errors.New("unsupported #! line")
	// ErrNestedInterpreter is an interpreter that is itself a "#!" script.
	ErrNestedInterpreter = errors.New("the interpreter is itself a #! script")
)

// shebangMax is how much of a file the kernel reads for its "#!" line
// (BINPRM_BUF_SIZE).
const shebangMax = 256

// Script is the "#!" line of a script, read as the kernel reads it: the
// interpreter's path up to the first space or tab, then at most one
// argument, the rest of the line. "#!/usr/bin/env NAME" is read as the
// program NAME looked up on PATH, which is what env would run.
type Script struct {
	Line        string // the line after "#!", without the line break
	Interpreter string // the interpreter's path as written, or env's NAME
	Arg         string // the one optional argument ("" = none); never set with Env
	Env         bool   // "#!/usr/bin/env NAME"
	// Resolved is the real absolute path of the interpreter, set by Resolve.
	Resolved string
}

// ParseScript reads the "#!" line at the start of r. It returns nil and no
// error when r does not start with "#!".
func ParseScript(r io.ReaderAt) (*Script, error) {
	buf := make([]byte, shebangMax)
	n, err := r.ReadAt(buf, 0)
	if err != nil && err != io.EOF {
		return nil, err
	}
	buf = buf[:n]
	if !bytes.HasPrefix(buf, []byte("#!")) {
		return nil, nil
	}
	rest := buf[2:]
	line, _, found := bytes.Cut(rest, []byte("\n"))
	if !found && n == shebangMax {
		return nil, fmt.Errorf("%w: the #! line is longer than the %d bytes the kernel reads", ErrShebang, shebangMax-1)
	}
	if bytes.IndexByte(line, 0) >= 0 {
		return nil, fmt.Errorf("%w: the #! line holds a NUL byte", ErrShebang)
	}
	s := &Script{Line: string(line)}
	l := strings.Trim(s.Line, " \t")
	end := strings.IndexAny(l, " \t")
	if end < 0 {
		end = len(l)
	}
	interp, arg := l[:end], strings.TrimLeft(l[end:], " \t")
	switch {
	case interp == "":
		return nil, fmt.Errorf("%w: #! names no interpreter", ErrShebang)
	case !filepath.IsAbs(interp):
		return nil, fmt.Errorf("%w: the interpreter %q is a relative path, which the kernel resolves against the working directory: name it by its absolute path", ErrShebang, interp)
	}
	s.Interpreter, s.Arg = interp, arg
	if filepath.Base(interp) == "env" {
		switch {
		case arg == "":
			return nil, fmt.Errorf("%w: #!%s names no program", ErrShebang, s.Line)
		case strings.HasPrefix(arg, "-") || strings.ContainsAny(arg, " \t=/"):
			//lint:ignore ST1005 the message ends with the "#!" it asks the reader to fix
			return nil, fmt.Errorf("%w: #!%s: only \"env NAME\" is understood (no options, assignments or paths): name the interpreter's absolute path after #!", ErrShebang, s.Line)
		}
		s.Interpreter, s.Arg, s.Env = arg, "", true
	}
	return s, nil
}

// Resolve finds the interpreter's real absolute path: an absolute path
// with its symbolic links resolved, or env's NAME looked up in the
// absolute directories of pathEnv as ResolveCommand does.
func (s *Script) Resolve(pathEnv string) error {
	p := pathEnv
	if !s.Env {
		p = ""
	}
	r, err := ResolveCommand(s.Interpreter, p)
	if err != nil {
		return fmt.Errorf("interpreter of #!%s: %w", s.Line, err)
	}
	s.Resolved = r
	return nil
}

// Describe names the interpreter for people: "/usr/bin/dash (#!/bin/sh)".
func (s *Script) Describe() string {
	switch {
	case s.Resolved == "":
		return "#!" + s.Line
	case s.Resolved == s.Line:
		return s.Resolved
	}
	return s.Resolved + " (#!" + s.Line + ")"
}
