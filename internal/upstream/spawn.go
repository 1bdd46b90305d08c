package upstream

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/confidential-mcp/cmcp/internal/contain"
	"github.com/confidential-mcp/cmcp/internal/reaper"
	"github.com/confidential-mcp/cmcp/internal/upstream/execimage"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// Spawn resolves, measures and starts the child described by spec. It
// executes the bytes it measured: the executable is opened once, digested
// through that descriptor and executed through it (/proc/self/fd/3), so a
// file swapped in at the path is never run; a file written in place between
// the digest and the start (its status change time moved) gets the child
// stopped and the spawn refused. The program sees its real path, which
// interpreters (node, npx, python) need. With spec.Sealed the child
// executes a sealed memfd copy instead (the kept copy, without reading the
// file, while the file's stat is unchanged since it was measured, or when
// it hashes to the same digest), whose bytes nothing can change even while
// it runs; the program then sees the memfd as its path. A "#!" script's
// interpreter is measured and pinned as well, and the child executes the
// interpreter's descriptor (/proc/self/fd/4) with the script as
// /proc/self/fd/3 (interp.go). An interpreter may still read the script by
// its path (node does): the script is re-checked at its path once the
// child started, and once it answered the MCP handshake (verifyMeasured,
// called by Connect); a script changed, renamed over or moved by then gets
// the child stopped and the spawn refused.
//
// The phases run in order (type spawn); the first to fail ends the spawn,
// refused with the reason, and what the earlier ones opened is closed.
func Spawn(ctx context.Context, spec StdioSpec, environ []string, hooks Hooks, share string) (*Child, error) {
	s := newSpawn(ctx, spec, environ, hooks, share)
	defer s.release()
	for _, phase := range []func() error{
		s.measureCommand,   // resolve, open and digest the command; its pin
		s.checkTarget,      // the measure target (script, package tree); its pin
		s.openInterpreter,  // a "#!" script's interpreter, measured
		s.checkInterpreter, // ... and its pin
		s.ready,            // Hooks.Ready: can the spawn be recorded?
		s.prepare,          // the command line and the pipes
		s.confine,          // a cgroup of its own, where one can be made
		s.start,            // exec of the measured descriptor
		s.supervise,        // the Child: stderr, reaping, the reaper's watch
		s.recheckMeasured,  // the files unchanged since they were measured
		s.record,           // Hooks.Spawn; the Child takes the watches
	} {
		if err := phase(); err != nil {
			return nil, err
		}
	}
	return s.child, nil
}

// spawn is one run of Spawn: what each phase found, for the phases after
// it, and what release closes once Spawn returns.
type spawn struct {
	ctx   context.Context
	spec  StdioSpec
	hooks Hooks
	env   []string   // the child's environment (childEnv)
	ev    SpawnEvent // what Hooks.Spawn records, refused or not

	path string // the resolved command
	// keys are the stats of the files measured, from before they were
	// measured (Child.keys).
	keys   map[string]execimage.FileKey
	f      *os.File               // the command's image, executed (or given) as the child's fd 3
	before execimage.Stamp        // f's stamp before its digest (without spec.Sealed)
	in     *execimage.Interpreter // a "#!" script's measured interpreter, or nil
	ierr   error                  // why a "#!" script's interpreter cannot be measured
	// watches are what is re-checked after the start and the handshake;
	// release closes them unless a started child took them (handed).
	watches []execimage.Watch
	handed  bool

	cmd *exec.Cmd
	// The pipes' ends: the child's (inR, outW, errW) are closed once it
	// started or failed to; the gateway's become the Child's.
	inR, inW, outR, outW, errR, errW *os.File
	cg                               *contain.Group // the child's cgroup, or nil
	child                            *Child
}

func newSpawn(ctx context.Context, spec StdioSpec, environ []string, hooks Hooks, share string) *spawn {
	env := childEnv(spec, environ)
	return &spawn{ctx: ctx, spec: spec, hooks: hooks, env: env,
		ev: SpawnEvent{Session: SessionFrom(ctx), Upstream: spec.Name, Pin: spec.Pin, MeasurePath: spec.MeasurePath, MeasurePin: spec.MeasurePin, Args: spec.Args, EnvNames: envNames(env), Env: env, SessionShare: share}}
}

// release closes what the spawn opened and a started child did not take:
// the interpreter's descriptor, the watches, the command's image.
func (s *spawn) release() {
	if s.in != nil {
		s.in.File.Close()
	}
	if !s.handed {
		for _, w := range s.watches {
			w.Close()
		}
	}
	if s.f != nil {
		s.f.Close()
	}
}

// refuse records the refusal (Hooks.Spawn) and returns it as a SpawnError.
func (s *spawn) refuse(reason, hint string, err error) error {
	s.ev.Refused, s.ev.Reason = true, reason
	if s.hooks.Spawn != nil {
		if herr := s.hooks.Spawn(s.ev); herr != nil {
			err = errors.Join(err, herr)
		}
	}
	return &SpawnError{Upstream: s.spec.Name, Reason: reason, Hint: hint, Err: err}
}

// measureCommand resolves the command on the child's PATH, opens its image
// (the file, or with spec.Sealed a sealed copy) and digests it through the
// descriptor that is executed, and checks the digest against the pin.
func (s *spawn) measureCommand() error {
	spec := s.spec
	if err := execimage.Supported(); err != nil {
		return s.refuse(err.Error(), "run the gateway on Linux for stdio upstreams; HTTP upstreams work everywhere", err)
	}
	path, err := digest.ResolveCommand(spec.Command, lookupEnv(s.env, "PATH"))
	if err != nil {
		return s.refuse(err.Error(), "check the upstream's command in the configuration", err)
	}
	s.path, s.ev.Path = path, path
	// What the file at path is before it is measured: a child made ahead
	// of demand is not handed out once it changed (Conn.Changed).
	s.keys = map[string]execimage.FileKey{}
	if k, err := execimage.StatKey(path); err == nil {
		s.keys[path] = k
	}
	var f *os.File
	var d digest.Digest
	if spec.Sealed {
		f, d, err = execimage.Sealed(path)
	} else {
		f, d, s.before, err = execimage.Open(path)
	}
	var se *execimage.SealError
	if errors.As(err, &se) {
		return s.refuse(fmt.Sprintf("cannot make a sealed copy of %s to execute: %v", path, err), se.Hint(), err)
	}
	if err != nil {
		return s.refuse(fmt.Sprintf("measure %s: %v", path, err), "", err)
	}
	s.f = f
	s.ev.Digest = d
	switch {
	case !spec.Pin.IsZero():
		if !d.Equal(spec.Pin) {
			return s.refuse(fmt.Sprintf("executable %s has digest %s but the pin is %s", path, d, spec.Pin),
				"if this change is intended, run 'cmcp spawn-digest' and update the pin", ErrPinMismatch)
		}
		s.ev.Class = ClassSpawnMeasured
	case spec.AllowUnmeasured:
		s.ev.Class = ClassSpawnUnmeasured
	default:
		return s.refuse(fmt.Sprintf("executable %s (digest %s) has no pin", path, d),
			fmt.Sprintf("add 'pin: %s' to the upstream after checking the file, or set allow_unmeasured: true to run it as spawn-unmeasured", d), ErrUnpinned)
	}
	if spec.AllowCodeEnv || codeEnvIn(s.env) {
		s.ev.Class = ClassSpawnUnmeasured // the environment can load code the pin does not cover
	}
	return nil
}

// checkTarget measures spec.MeasurePath, if set, and checks it against its
// pin. The child reads its target by path after the start: it is re-checked
// then (a file target) and after the handshake (both).
func (s *spawn) checkTarget() error {
	spec := s.spec
	if spec.MeasurePath == "" {
		return nil
	}
	md, tw, err := execimage.MeasureTarget(s.ctx, spec.MeasurePath)
	if err != nil {
		return s.refuse(fmt.Sprintf("measure %s: %v", spec.MeasurePath, err), "", err)
	}
	s.watches = append(s.watches, tw)
	s.ev.MeasureDig = md
	switch {
	case !spec.MeasurePin.IsZero():
		if !md.Equal(spec.MeasurePin) {
			return s.refuse(fmt.Sprintf("measure target %s has digest %s but the pin is %s", spec.MeasurePath, md, spec.MeasurePin),
				"if this change is intended, run 'cmcp spawn-digest' and update the pin", ErrPinMismatch)
		}
	case spec.AllowUnmeasured:
		s.ev.Class = ClassSpawnUnmeasured
	default:
		return s.refuse(fmt.Sprintf("measure target %s (digest %s) has no pin", spec.MeasurePath, md),
			fmt.Sprintf("add the measure pin %s after checking the files", md), ErrUnpinned)
	}
	return nil
}

// openInterpreter opens and measures a "#!" script's interpreter: the
// script's pin covers the script's bytes only, so its interpreter is
// measured and pinned too, and executed through its descriptor
// (interp.go). Why it cannot be is kept for checkInterpreter.
func (s *spawn) openInterpreter() error {
	s.in, s.ierr = execimage.OpenInterpreter(s.f, lookupEnv(s.env, "PATH"))
	if s.in == nil || s.spec.Sealed {
		return nil
	}
	// The interpreter is given the script as /proc/self/fd/3, but
	// node reads it by the path that link names.
	dup, err := execimage.DupFile(s.f)
	if err == nil {
		var w *execimage.FileWatch
		if w, err = execimage.NewFileWatch("the script", s.path, dup, s.before); err == nil {
			s.watches = append(s.watches, w)
		}
	}
	if err != nil {
		return s.refuse(fmt.Sprintf("keep %s to check it after the start: %v", s.path, err), "", err)
	}
	return nil
}

// checkInterpreter checks a "#!" script's interpreter against its pin, and
// sets the spawn's class by it: a script whose interpreter no pin covers
// runs, as spawn-unmeasured, only with spec.AllowUnmeasured.
func (s *spawn) checkInterpreter() error {
	spec, path, in, ierr := s.spec, s.path, s.in, s.ierr
	switch {
	case ierr != nil && !spec.AllowUnmeasured:
		s.ev.Class = "" // refused: no class, whatever the script's own pin says
		reason := fmt.Sprintf("%s is a #! script whose interpreter cannot be measured: %v", path, ierr)
		if !spec.InterpreterPin.IsZero() {
			reason += fmt.Sprintf(" (the interpreter's pin is %s)", spec.InterpreterPin)
		}
		return s.refuse(reason,
			"name the interpreter as the command and the script as its argument and --target: cmcp spawn-digest --target SCRIPT -- INTERPRETER SCRIPT", ierr)
	case ierr != nil:
		// Unmeasured code may run: the kernel runs the script as it would.
		s.ev.Class = ClassSpawnUnmeasured
		s.ev.Reason = fmt.Sprintf("%s is a #! script whose interpreter cannot be measured (%v)", path, ierr)
	case in != nil:
		s.ev.Interpreter, s.ev.InterpreterDig, s.ev.InterpreterPin = in.Script.Resolved, in.Digest, spec.InterpreterPin
		if k, _, err := execimage.FdKey(in.File); err == nil {
			s.keys[in.Script.Resolved] = k
		}
		switch {
		case !spec.InterpreterPin.IsZero():
			if !in.Digest.Equal(spec.InterpreterPin) {
				s.ev.Class = ""
				return s.refuse(fmt.Sprintf("interpreter %s of the #! script %s has digest %s but the pin is %s", in.Script.Describe(), path, in.Digest, spec.InterpreterPin),
					"if this change is intended, run 'cmcp spawn-digest' and update the pin's interpreter", ErrPinMismatch)
			}
		case spec.AllowUnmeasured:
			s.ev.Class = ClassSpawnUnmeasured
			s.ev.Reason = fmt.Sprintf("%s is a #! script for %s, which no pin covers", path, in.Script.Describe())
		default:
			s.ev.Class = ""
			return s.refuse(fmt.Sprintf("%s is a #! script for %s (digest %s), which no pin covers", path, in.Script.Describe(), in.Digest),
				fmt.Sprintf("add 'interpreter: %s' to the upstream's pin after checking the file (cmcp spawn-digest prints it)", in.Digest), ErrUnpinned)
		}
	case !spec.InterpreterPin.IsZero():
		s.ev.Class = ""
		return s.refuse(fmt.Sprintf("the pin names an interpreter (%s), but %s is not a #! script", spec.InterpreterPin, path),
			"run 'cmcp spawn-digest' and update the pin", ErrPinMismatch)
	}
	return nil
}

// ready asks Hooks.Ready whether the spawn can be recorded, before anything
// runs.
func (s *spawn) ready() error {
	if s.hooks.Ready != nil {
		if err := s.hooks.Ready(); err != nil {
			return s.refuse(fmt.Sprintf("the spawn could not be recorded: %v", err), "", err)
		}
	}
	if testHookBeforeExec != nil {
		testHookBeforeExec(s.path)
	}
	return nil
}

// prepare makes the command, executing the measured descriptor, and its
// pipes. A pipe that cannot be made fails the spawn without a record.
func (s *spawn) prepare() error {
	spec := s.spec
	s.cmd = &exec.Cmd{
		Path:       "/proc/self/fd/3",
		ExtraFiles: []*os.File{s.f},
		Args:       append([]string{spec.Command}, spec.Args...),
		Env:        s.env,
		Dir:        spec.Dir,
		SysProcAttr: withPdeathsig(&syscall.SysProcAttr{
			Setpgid: true,
		}),
	}
	if s.in != nil {
		// The script stays the child's fd 3; the measured interpreter is
		// fd 4, executed with the script as its argument.
		s.cmd.Path, s.cmd.ExtraFiles, s.cmd.Args = "/proc/self/fd/4", []*os.File{s.f, s.in.File}, s.in.Argv(spec.Args)
	}
	// Pipes are made here, not by os/exec, so that Wait never closes the
	// gateway's ends under a reader: stdout and stderr end with EOF when
	// the last writer (grandchildren included) is gone.
	inR, inW, err := os.Pipe()
	if err != nil {
		return err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		outR.Close()
		outW.Close()
		return err
	}
	s.inR, s.inW, s.outR, s.outW, s.errR, s.errW = inR, inW, outR, outW, errR, errW
	s.cmd.Stdin, s.cmd.Stdout, s.cmd.Stderr = inR, outW, errW
	return nil
}

// confine gives the child a cgroup of its own, where one can be made
// (package contain): it holds what leaves the child's process group too,
// and is ended with it. The reaper kills the child's group if the gateway
// dies: the parent-death signal reaches the child only, not what it starts.
func (s *spawn) confine() error {
	cg, err := contain.NewGroup(s.spec.Name)
	if err != nil || cg == nil {
		return nil // none: the subreaper still brings its orphans back
	}
	cg.Apply(s.cmd.SysProcAttr)
	s.cg = cg
	return nil
}

// start starts the child, in its cgroup if it can be, once the reaper
// runs, and closes the child's ends of the pipes; a child that did not
// start has its cgroup ended and the gateway's ends closed too.
func (s *spawn) start() error {
	cmd, cg := s.cmd, s.cg
	err := reaper.Ready()
	if err == nil {
		release := contain.Starting()
		err = cmd.Start()
		if err != nil && cg != nil {
			// clone3 into a cgroup refused (an older kernel, a
			// security module): started without one.
			_ = cg.Kill(0)
			cg, cmd.SysProcAttr.UseCgroupFD = nil, false
			err = cmd.Start()
		}
		if err == nil {
			contain.OwnLocked(cmd.Process.Pid)
		}
		release()
	} else {
		err = fmt.Errorf("the gateway's reaper process, which kills a child's process group if the gateway dies, is not running: %w", err)
	}
	s.cg = cg
	s.inR.Close()
	s.outW.Close()
	s.errW.Close()
	if err != nil {
		_ = cg.Kill(0)
		s.inW.Close()
		s.outR.Close()
		s.errR.Close()
		return s.refuse(fmt.Sprintf("start %s: %v", s.path, err), startHint(err, s.spec.Sealed), err)
	}
	return nil
}

// startHint says what to check when exec is refused.
func startHint(err error, sealed bool) string {
	switch {
	case (errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM)) && sealed:
		return "with sealed: true the child runs from a sealed in-memory copy (memfd) of the file: check that the kernel and its security module allow executing memfds (vm.memfd_noexec 0 or 1), and that a script's interpreter is executable"
	case errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM):
		return "check that the file and a script's interpreter are executable, that the file system is not mounted noexec, and that no security module (SELinux, AppArmor) denies it"
	}
	return ""
}

// supervise makes the started child's Child, pumps its stderr, reaps it,
// and has the reaper watch its process group and cgroup: a child the
// reaper cannot watch is stopped and the spawn refused.
func (s *spawn) supervise() error {
	spec, cmd := s.spec, s.cmd
	grace := spec.StopGrace
	if grace <= 0 {
		grace = 5 * time.Second
	}
	c := &Child{path: s.path, keys: s.keys, name: spec.Name, class: s.ev.Class, cmd: cmd, pid: cmd.Process.Pid, grace: grace, hooks: s.hooks, cgroup: s.cg,
		stdin: s.inW, stdout: s.outR, wsem: make(chan struct{}, 1), stopping: make(chan struct{}), wtimeout: writeTimeout, done: make(chan struct{}), reported: make(chan struct{}), stderrDone: make(chan struct{})}
	session := s.ev.Session
	c.session.Store(&session)
	s.ev.PID = c.pid // a refusal from here on is of a child that ran
	go c.pumpStderr(s.errR, spec)
	if s.hooks.Stderr != nil {
		go c.reportStderr()
	}
	err := reaper.Watch(c.pid)
	if err == nil && s.cg != nil {
		err = reaper.WatchCgroup(s.cg.Path())
	}
	if err != nil {
		go c.reap()
		c.Stop()
		return s.refuse(fmt.Sprintf("the gateway's reaper process cannot watch the child's process group (%v); the child was stopped", err), "", err)
	}
	go c.reap()
	s.child = c
	return nil
}

// recheckMeasured stops the child and refuses the spawn if a file it was
// measured from was written, or a script replaced at its path, between its
// digest and the start: the child may be running other bytes than
// measured.
func (s *spawn) recheckMeasured() error {
	c := s.child
	if !s.spec.Sealed {
		// The child has the file now: one written between the digest and
		// here may be running other bytes than measured.
		if after, err := execimage.StampOf(s.f); err != nil || after != s.before {
			c.Stop()
			return s.refuse(fmt.Sprintf("%s was written while it was measured and started; the child was stopped", s.path),
				"retry once the file is no longer being changed; set sealed: true on the upstream to run a sealed copy", ErrPinMismatch)
		}
	}
	if in := s.in; in != nil {
		if after, err := execimage.StampOf(in.File); err != nil || after != in.Before {
			c.Stop()
			return s.refuse(fmt.Sprintf("the interpreter %s was written while it was measured and started; the child was stopped", in.Script.Resolved),
				"retry once the file is no longer being changed", ErrPinMismatch)
		}
	}
	for _, w := range s.watches {
		if fw, ok := w.(*execimage.FileWatch); ok {
			if why, _ := fw.Changed(); why != "" {
				c.Stop()
				return s.refuse(why+"; the child was stopped", changedHint, ErrPinMismatch)
			}
		}
	}
	return nil
}

// record has Hooks.Spawn record the started child (a child whose record
// fails is stopped) and hands the watches to it, for verifyMeasured.
func (s *spawn) record() error {
	c := s.child
	if s.hooks.Spawn != nil {
		if err := s.hooks.Spawn(s.ev); err != nil {
			c.Stop()
			return &SpawnError{Upstream: s.spec.Name, Reason: "the spawn could not be recorded in the audit log", Err: err}
		}
	}
	c.ev, c.watches, s.handed = s.ev, s.watches, true
	return nil
}
