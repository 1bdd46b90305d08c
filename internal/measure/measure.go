// Package measure computes and checks the pins of stdio upstreams, exactly
// as the gateway will before it spawns them: resolve the command (PATH, then
// symlinks), digest the file through its descriptor, and digest the measure
// target (a file, or a directory as a tree). It is the library behind
// `cmcp spawn-digest`.
package measure

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/confidential-mcp/cmcp/internal/config"
	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// Kinds of measured things.
const (
	KindFile = "file"
	KindTree = "tree"
)

// Target is a measured script or package directory.
type Target struct {
	Path   string        `json:"path"`
	Kind   string        `json:"kind"` // KindFile or KindTree
	Digest digest.Digest `json:"digest"`
	Files  int64         `json:"files"` // 1 for a file
	Bytes  int64         `json:"bytes"`
}

// Result is what spawn-digest measured.
type Result struct {
	Command       string        `json:"command"` // as given
	Args          []string      `json:"args"`
	Resolved      string        `json:"resolved"` // the real file the gateway will execute
	CommandDigest digest.Digest `json:"command_digest"`
	CommandBytes  int64         `json:"command_bytes"`
	Target        *Target       `json:"target,omitempty"`
	// Script is set when the command is a "#!" script: the command's
	// digest covers the script's bytes, Script.Digest its interpreter.
	Script *Script `json:"script,omitempty"`
}

// Script is the interpreter of a "#!" command, measured as the gateway
// will measure it before every spawn.
type Script struct {
	Line        string        `json:"line"`               // the #! line, without "#!"
	Interpreter string        `json:"interpreter"`        // as named (env's NAME for #!/usr/bin/env NAME)
	Env         bool          `json:"env,omitempty"`      // found on PATH (#!/usr/bin/env NAME)
	Resolved    string        `json:"resolved,omitempty"` // its real path
	Digest      digest.Digest `json:"digest,omitzero"`    // the digest of that file
	Bytes       int64         `json:"bytes,omitempty"`    // its size
	Error       string        `json:"error,omitempty"`    // why it cannot be measured
	err         error
}

// script reads f's "#!" line, resolves its interpreter on pathEnv and
// digests it, or returns nil for a file that is not a script.
func script(f *os.File, pathEnv string) *Script {
	s, err := digest.ParseScript(f)
	if err != nil {
		return &Script{Error: err.Error(), err: err}
	}
	if s == nil {
		return nil
	}
	out := &Script{Line: s.Line, Interpreter: s.Interpreter, Env: s.Env}
	fail := func(err error) *Script {
		out.Error, out.err = err.Error(), err
		return out
	}
	if err := s.Resolve(pathEnv); err != nil {
		return fail(err)
	}
	out.Resolved = s.Resolved
	in, d, err := digest.OpenFile(s.Resolved)
	if err != nil {
		return fail(err)
	}
	defer in.Close()
	out.Digest = d
	if nested, err := digest.ParseScript(in); nested != nil || err != nil {
		//lint:ignore ST1005 the message ends with the "#!" it asks the reader to fix
		return fail(fmt.Errorf("%w: %s (the interpreter of #!%s) starts with \"#!\": name the real interpreter after #!", digest.ErrNestedInterpreter, s.Resolved, s.Line))
	}
	if st, err := in.Stat(); err == nil {
		out.Bytes = st.Size()
	}
	return out
}

// Progress is told how far the measurement of a tree has got.
type Progress func(path string, files, bytes int64)

// Command resolves command on pathEnv and measures it, and target if it is
// not "".
func Command(ctx context.Context, command string, args []string, pathEnv, target string, progress Progress) (*Result, error) {
	resolved, err := digest.ResolveCommand(command, pathEnv)
	if err != nil {
		return nil, fileError(err, "check the command name, or give its path")
	}
	f, d, err := digest.OpenFile(resolved)
	if err != nil {
		return nil, fileError(err, "the gateway must read the file to measure it")
	}
	fi, _ := f.Stat()
	sc := script(f, pathEnv)
	f.Close()
	if sc != nil && sc.err != nil {
		return nil, fileError(fmt.Errorf("%s is a #! script whose interpreter cannot be measured: %w", resolved, sc.err),
			"the gateway would refuse to spawn it: name the interpreter as the command, with the script as its argument and --target: cmcp spawn-digest --target SCRIPT -- INTERPRETER SCRIPT")
	}
	r := &Result{Command: command, Args: args, Resolved: resolved, CommandDigest: d, Script: sc}
	if r.Args == nil {
		r.Args = []string{}
	}
	if fi != nil {
		r.CommandBytes = fi.Size()
	}
	if target != "" {
		abs, err := filepath.Abs(target)
		if err != nil {
			return nil, fileError(err, "")
		}
		t, err := MeasureTarget(ctx, abs, progress)
		if err != nil {
			return nil, err
		}
		r.Target = t
	}
	return r, nil
}

// MeasureTarget measures path: a file digest for a file, a tree digest for a
// directory.
func MeasureTarget(ctx context.Context, path string, progress Progress) (*Target, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fileError(fmt.Errorf("measure target: %w", err), "")
	}
	if fi.IsDir() {
		t := &Target{Path: path, Kind: KindTree}
		d, err := digest.Tree(ctx, path, digest.TreeOptions{Progress: func(files, bytes int64) {
			t.Files, t.Bytes = files, bytes
			if progress != nil {
				progress(path, files, bytes)
			}
		}})
		if err != nil {
			return nil, fileError(fmt.Errorf("measure target: %w", err), treeHint(err))
		}
		t.Digest = d
		return t, nil
	}
	f, d, err := digest.OpenFile(path)
	if err != nil {
		return nil, fileError(fmt.Errorf("measure target: %w", err), "")
	}
	defer f.Close()
	st, _ := f.Stat()
	return &Target{Path: path, Kind: KindFile, Digest: d, Files: 1, Bytes: st.Size()}, nil
}

func treeHint(err error) string {
	switch {
	case errors.Is(err, digest.ErrSymlinkEscape):
		return "a measured tree must be self-contained: copy the link's target into the tree, or measure a directory that contains it"
	case errors.Is(err, digest.ErrSpecialFile):
		return "remove devices, sockets and FIFOs from the package directory"
	case errors.Is(err, digest.ErrSymlinkDangling), errors.Is(err, digest.ErrSymlinkLoop):
		return "fix or remove the link"
	}
	return ""
}

// fileError gives err the I/O exit code and a hint.
func fileError(err error, hint string) error {
	e := exitcode.WithCode(exitcode.ExitIO, err).(*exitcode.Error)
	if errors.Is(err, fs.ErrPermission) {
		e.Hint("run cmcp as a user who can read the file: the gateway reads it to measure it")
	} else if hint != "" {
		e.Hint("%s", hint)
	}
	return e
}

// Statuses of a checked pin.
const (
	StatusMatch    = "match"
	StatusMismatch = "mismatch"
	StatusMissing  = "missing"   // the command or target does not exist
	StatusError    = "error"     // it exists but cannot be measured
	StatusUnpinned = "unpinned"  // allow_unmeasured: nothing to check
	StatusSkipped  = "not-stdio" // an HTTP upstream: its pin is checked at connect
	// StatusUncovered is a "#!" command whose pin has no interpreter
	// digest: the gateway refuses to spawn it.
	StatusUncovered = "interpreter-unpinned"
)

// Row is one checked pin.
type Row struct {
	Upstream string        `json:"upstream"`
	What     string        `json:"what"` // "command" or "target"
	Path     string        `json:"path"` // the resolved file or the target
	Kind     string        `json:"kind,omitempty"`
	Pinned   digest.Digest `json:"pinned,omitzero"`
	Actual   digest.Digest `json:"actual,omitzero"`
	Status   string        `json:"status"`
	Error    string        `json:"error,omitempty"`
}

// Failed reports whether the row fails the check.
func (r Row) Failed() bool {
	return r.Status == StatusMismatch || r.Status == StatusMissing || r.Status == StatusError || r.Status == StatusUncovered
}

// ChildPATH is the PATH the gateway resolves a stdio upstream's command
// with: the child's environment, built from env (explicit values win) and
// env_allow (nil means the gateway's default list, which includes PATH).
func ChildPATH(s *config.Stdio, environ []string) string {
	if v, ok := s.Env["PATH"]; ok {
		return v
	}
	if s.EnvAllow != nil && !slices.Contains(s.EnvAllow, "PATH") {
		return ""
	}
	for i := len(environ) - 1; i >= 0; i-- { // the last definition wins
		if v, ok := strings.CutPrefix(environ[i], "PATH="); ok {
			return v
		}
	}
	return ""
}

// Check re-measures every pinned stdio upstream of c, resolving commands as
// the gateway would with the environment environ, and returns one row per
// pin (command, a "#!" command's interpreter, then target). It fails only
// on a cancelled context; the rows say what matched.
func Check(ctx context.Context, c *config.Config, environ []string, progress Progress) ([]Row, error) {
	var rows []Row
	for i := range c.Upstreams {
		u := &c.Upstreams[i]
		switch {
		case u.Tunnel != nil:
			// Its machines pin their own servers (cmcp connect --pin).
			rows = append(rows, Row{Upstream: u.Name, What: "tunnel", Path: "(its machines' connectors)", Status: StatusSkipped})
			continue
		case u.Stdio == nil:
			rows = append(rows, Row{Upstream: u.Name, What: "http", Path: u.HTTP.Endpoint(), Status: StatusSkipped})
			continue
		case u.Pin == nil:
			rows = append(rows, Row{Upstream: u.Name, What: "command", Path: u.Stdio.Command, Status: StatusUnpinned})
			continue
		}
		row := Row{Upstream: u.Name, What: "command", Path: u.Stdio.Command, Kind: KindFile, Pinned: u.Pin.Command}
		pathEnv := ChildPATH(u.Stdio, environ)
		resolved, err := digest.ResolveCommand(u.Stdio.Command, pathEnv)
		var sc *Script
		if err == nil {
			row.Path = resolved
			var f *os.File
			f, row.Actual, err = digest.OpenFile(resolved)
			if err == nil {
				sc = script(f, pathEnv)
				f.Close()
			}
		}
		rows = append(rows, finish(row, err))
		if sc != nil || (err == nil && !u.Pin.Interpreter.IsZero()) {
			rows = append(rows, interpreterRow(u.Name, sc, u.Pin.Interpreter))
		}
		if u.Pin.Target != "" {
			row := Row{Upstream: u.Name, What: "target", Path: u.Pin.Target, Pinned: u.Pin.TargetDigest}
			t, err := MeasureTarget(ctx, u.Pin.Target, progress)
			if err == nil {
				row.Kind, row.Actual = t.Kind, t.Digest
			}
			if ctx.Err() != nil {
				return rows, context.Cause(ctx)
			}
			rows = append(rows, finish(row, err))
		}
	}
	return rows, nil
}

// interpreterRow checks a "#!" command's interpreter (sc, nil when the
// command is not a script) against the pin's.
func interpreterRow(name string, sc *Script, pin digest.Digest) Row {
	row := Row{Upstream: name, What: "interpreter", Kind: KindFile, Pinned: pin}
	switch {
	case sc == nil:
		row.Path, row.Status, row.Error = "(none)", StatusMismatch, "the pin names an interpreter, but the command is not a #! script"
		return row
	case sc.Resolved != "":
		row.Path = sc.Resolved
	default:
		row.Path = "#!" + sc.Line
	}
	if errors.Is(sc.err, digest.ErrNestedInterpreter) {
		// Replaced by a script, or pinned by hand: the gateway refuses it.
		row.Actual, row.Status, row.Error = sc.Digest, StatusMismatch, sc.Error
		return row
	}
	if sc.err != nil {
		return finish(row, sc.err)
	}
	row.Actual = sc.Digest
	if pin.IsZero() {
		row.Status, row.Error = StatusUncovered, "the command is a #! script and the pin has no interpreter digest: the gateway refuses to spawn it (cmcp spawn-digest prints it)"
		return row
	}
	return finish(row, nil)
}

func finish(r Row, err error) Row {
	switch {
	case err != nil && (errors.Is(err, fs.ErrNotExist) || errors.Is(err, digest.ErrNotFound)):
		r.Status, r.Error = StatusMissing, err.Error()
	case err != nil:
		r.Status, r.Error = StatusError, err.Error()
	case r.Actual.Equal(r.Pinned):
		r.Status = StatusMatch
	default:
		r.Status = StatusMismatch
	}
	return r
}

// Preflight is what serve would refuse at start that spawn-digest --check
// can see from here: a file it reads (TLS, CA and credential files) that
// is there but unusable is an error. One that is not there, or not
// readable here, is a warning, as is a credential variable unset in this
// environment (getenv): secrets are often deployed only where serve runs,
// and the pins are what the check gates.
func Preflight(c *config.Config, getenv func(string) string) (warnings []string, err error) {
	warnings = []string{}
	if err := c.CheckFiles(); err != nil {
		var all, bad config.Errors
		if !errors.As(err, &all) {
			return nil, err
		}
		for _, fe := range all {
			if errors.Is(fe, fs.ErrNotExist) || errors.Is(fe, fs.ErrPermission) {
				warnings = append(warnings, fmt.Sprintf("%v; not checked here: cmcp serve refuses to start unless it can read it", fe))
				continue
			}
			bad = append(bad, fe)
		}
		if len(bad) > 0 {
			return nil, bad
		}
	}
	var unset config.Errors
	if errors.As(c.CheckEnv(func(k string) (string, bool) { v := getenv(k); return v, v != "" }, "this environment; cmcp serve needs it in its own"), &unset) {
		for _, u := range unset {
			warnings = append(warnings, u.Error())
		}
	}
	return warnings, nil
}

// CheckError summarises the failed rows: it names every upstream with its
// pinned and actual digests. Its exit code is exitcode.ExitMismatch if a pin
// mismatched or a file is missing, else exitcode.ExitIO.
type CheckError struct {
	Config string
	Failed []Row
	Total  int
}

func (e *CheckError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d of %d pins in %s do not verify", len(e.Failed), e.Total, e.Config)
	for _, r := range e.Failed {
		switch r.Status {
		case StatusMismatch:
			fmt.Fprintf(&b, "\n  %s %s %s: pinned %s, actual %s", r.Upstream, r.What, r.Path, r.Pinned, r.Actual)
			if r.Error != "" {
				fmt.Fprintf(&b, " (%s)", r.Error)
			}
		default:
			fmt.Fprintf(&b, "\n  %s %s: %s: %s", r.Upstream, r.What, r.Status, r.Error)
		}
	}
	return b.String()
}

// ExitCode implements exitcode.Coder.
func (e *CheckError) ExitCode() int {
	for _, r := range e.Failed {
		if r.Status != StatusError {
			return exitcode.ExitMismatch
		}
	}
	return exitcode.ExitIO
}

// Hints implements exitcode.Hinter.
func (e *CheckError) Hints() []string {
	return []string{"if the change is expected, re-pin with: cmcp spawn-digest [--target PATH] -- COMMAND, and update the config; otherwise find out who changed the file"}
}
