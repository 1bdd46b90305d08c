package execimage

import (
	"fmt"
	"os"

	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// A "#!" script is run by its interpreter, which the script's pin does not
// cover. The gateway reads the "#!" line as the kernel would
// (digest.ParseScript: "#!/usr/bin/env NAME" is NAME looked up on the
// child's PATH, as env would find it), opens the interpreter, digests it
// through that descriptor and executes that descriptor itself
// (/proc/self/fd/4), the script passed as /proc/self/fd/3: the interpreter
// is not looked up again by path at exec time, so the interpreter that
// runs is the one measured and compared with the pin. The script is another
// matter: Python reads /proc/self/fd/3, the measured descriptor, but node
// resolves that link to the path it names and reads the path, as it reads
// every module it loads. So the script's file is re-checked at its path
// after the start and once the child answered the MCP handshake (a file
// renamed over, moved or written gets the child stopped and the spawn
// refused: recheck.go, upstream.Child.verifyMeasured); what node reads later
// (modules it loads on demand) is covered by a --target tree only as far
// as that re-check goes.

// Interpreter is the measured interpreter of a "#!" command.
type Interpreter struct {
	Script *digest.Script
	File   *os.File // executed as the child's fd 4
	Digest digest.Digest
	Before Stamp // File's stamp before its digest
}

// OpenInterpreter reads the "#!" line of the command file cmd, resolves its
// interpreter on pathEnv, and opens and digests it. It returns nil and no
// error when cmd is not a script. An interpreter that is itself a "#!"
// script is refused: the kernel would run a second interpreter, which no
// pin covers.
func OpenInterpreter(cmd *os.File, pathEnv string) (*Interpreter, error) {
	s, err := digest.ParseScript(cmd)
	if err != nil || s == nil {
		return nil, err
	}
	if err := s.Resolve(pathEnv); err != nil {
		return nil, err
	}
	f, d, before, err := Open(s.Resolved)
	if err != nil {
		return nil, err
	}
	nested, err := digest.ParseScript(f)
	if nested != nil || err != nil {
		f.Close()
		//lint:ignore ST1005 the message ends with the "#!" it asks the reader to fix
		return nil, fmt.Errorf("%w: %s (digest %s, the interpreter of #!%s) starts with \"#!\": name the real interpreter after #!", digest.ErrNestedInterpreter, s.Resolved, d, s.Line)
	}
	return &Interpreter{Script: s, File: f, Digest: d, Before: before}, nil
}

// Argv is the child's argument list: the interpreter, its one optional
// argument, the script (the child's fd 3) and the command's arguments, as
// the kernel would build it.
func (in *Interpreter) Argv(args []string) []string {
	// argv[0] is what the kernel or env would pass: the path as written,
	// or env's NAME. Programs read it (Python finds its prefix, and so a
	// virtual environment on PATH, through it; busybox picks its applet by
	// it); the bytes run are the measured descriptor whatever it says.
	out := []string{in.Script.Interpreter}
	if in.Script.Arg != "" {
		out = append(out, in.Script.Arg)
	}
	out = append(out, "/proc/self/fd/3")
	return append(out, args...)
}
