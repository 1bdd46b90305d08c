package upstream

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/config"
	"github.com/confidential-mcp/cmcp/internal/contain"
	"github.com/confidential-mcp/cmcp/internal/reaper"
	"github.com/confidential-mcp/cmcp/internal/upstream/execimage"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// DefaultEnvAllow are the variables a child inherits from the gateway's
// environment when the configuration names none. Nothing else passes: the
// gateway's own secrets (tokens, keys) never reach a child.
var DefaultEnvAllow = []string{"PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR"}

// StdioSpec configures a spawned upstream.
type StdioSpec struct {
	Name    string
	Command string   // a path, or a name looked up on PATH
	Args    []string // arguments after the command
	Dir     string   // working directory ("" = the gateway's)

	// Pin is the digest of the resolved executable file. Zero = unpinned.
	Pin digest.Digest
	// Sealed runs a sealed memfd copy of the executable instead of the file
	// (Linux only): nothing can change its bytes while it runs, but the
	// program sees the memfd as its own path, which interpreters (node,
	// npx, python) cannot work with. For static binaries.
	Sealed bool
	// MeasurePath is an extra measure target for interpreted servers: the
	// script, or the package directory (tree digest). MeasurePin is its pin.
	MeasurePath string
	MeasurePin  digest.Digest
	// InterpreterPin is the digest of a "#!" command's interpreter (the
	// program named after "#!", or found on PATH for "#!/usr/bin/env
	// NAME"). Zero = unpinned: such a command is refused, or runs as
	// spawn-unmeasured with AllowUnmeasured.
	InterpreterPin digest.Digest
	// AllowUnmeasured lets an unpinned upstream run, as spawn-unmeasured.
	AllowUnmeasured bool

	// EnvAllow names the variables copied from the gateway's environment
	// (nil = DefaultEnvAllow); Env sets values explicitly (they win).
	EnvAllow []string
	Env      map[string]string
	// AllowCodeEnv says the environment may set variables that load code
	// (config.CodeLoadingEnv): every spawn is then spawn-unmeasured, as is
	// one whose environment holds such a variable without it.
	AllowCodeEnv bool

	// StopGrace is how long a child has between SIGTERM and SIGKILL.
	StopGrace time.Duration
	// StderrLineMax bounds one logged stderr line; StderrLinesPerSec bounds
	// how many lines per second reach the gateway log (the rest are counted).
	StderrLineMax     int
	StderrLinesPerSec int
}

// SpawnEvent describes one spawn attempt, successful or refused, for the
// audit log.
type SpawnEvent struct {
	Upstream     string
	Path         string // resolved executable
	Digest       digest.Digest
	Pin          digest.Digest
	MeasurePath  string
	MeasureDig   digest.Digest
	MeasurePin   digest.Digest
	Class        string
	PID          int
	Refused      bool
	Reason       string
	Args         []string
	EnvNames     []string // names only: values may be secrets
	SessionShare string   // "per-session" or "shared", set by the caller
	Session      string   // the agent session the child serves ("" if shared)
	Env          []string // the child's environment (NAME=VALUE, in order) for the hook to commit to, never to record in clear

	// Interpreter is a "#!" command's resolved interpreter, with its
	// digest and pin ("" and zero for a command that is not a script).
	Interpreter    string
	InterpreterDig digest.Digest
	InterpreterPin digest.Digest
}

// ExitEvent describes the end of a child.
type ExitEvent struct {
	Upstream    string
	Session     string
	Class       string // the evidence class it was spawned with
	Path        string // the executable it was spawned from
	PID         int
	ExitCode    int    // -1 when killed by a signal
	Signal      string // signal name, if any
	Fault       string // why the gateway ended it ("" = normal stop)
	StderrBytes int64
	StderrLines int64
	Dropped     int64 // stderr bytes not written to the gateway log (rate limit, long lines)
}

// Hooks receive the child's life events. Any may be nil.
type Hooks struct {
	// Spawn is called after measuring: before exec when refused then, and
	// after exec otherwise, with the pid (also for a refusal after exec: the
	// file changed while it was measured, or its group cannot be watched;
	// that child was stopped). A non-nil error refuses the spawn; a started
	// child is then stopped at once (Ready refuses before exec when the
	// failure is known beforehand).
	Spawn func(SpawnEvent) error
	// Ready, if set, is called after measuring and before exec: an error
	// (the audit log is known to be broken) refuses the spawn before the
	// child runs, rather than stopping it once its record fails.
	Ready func() error
	Exit  func(ExitEvent)
	// Stderr receives the running byte counts of a long-lived child's
	// stderr every StderrEvery (default 1 minute) while they grow; the
	// final counts come with Exit.
	Stderr      func(ExitEvent)
	StderrEvery time.Duration
	// Log receives the gateway-log lines (stderr of the child).
	Log *slog.Logger
}

// Stdio is an Upstream that spawns a measured child for every Connect.
type Stdio struct {
	Spec    StdioSpec
	Environ []string // the gateway's environment (filtered by EnvAllow)
	Hooks   Hooks
	// Share is recorded in spawn events ("per-session" or "shared").
	Share string
}

// Name implements Upstream.
func (s *Stdio) Name() string { return s.Spec.Name }

// Connect implements Upstream: measure, spawn and initialise.
func (s *Stdio) Connect(ctx context.Context, client *mcp.Client, opts ConnectOptions) (*Conn, error) {
	child, err := Spawn(ctx, s.Spec, s.Environ, s.Hooks, s.Share)
	if err != nil {
		return nil, err
	}
	if testHookAfterSpawn != nil {
		testHookAfterSpawn(child)
	}
	t := &childTransport{child: child, intercept: opts.Intercept}
	client.AddReceivingMiddleware(limitServerRequests())
	cs, err := client.Connect(ctx, t, &mcp.ClientSessionOptions{ProtocolVersion: ProtocolVersion})
	if err != nil {
		if child.fault.Load() == nil && (t.conn == nil || !t.conn.stdoutEnded.Load()) && !child.exited() {
			// Running, its stdout open: the handshake failed on what
			// the child wrote (or did not write in time). That is why it
			// is stopped, not the SIGTERM the gateway then sends it.
			f := fmt.Errorf("upstream %q: initialize: %w: the gateway stopped the child", s.Spec.Name, err)
			if ctx.Err() == nil {
				f = fmt.Errorf("upstream %q: initialize: the child's answer to the MCP handshake was refused (%w): the gateway stopped the child; a server must write nothing to stdout before it has read initialize (a line written earlier is taken for its answer)", s.Spec.Name, err)
			}
			child.fault.CompareAndSwap(nil, &f)
		}
		fault := child.Fault()
		child.Stop()
		if fault != nil {
			return nil, fault
		}
		if f := child.exitFault(); f != nil && child.exited() {
			return nil, f
		}
		return nil, fmt.Errorf("upstream %q: initialize: %w", s.Spec.Name, err)
	}
	child.handshook.Store(true)
	// The child has read its main module by now: was it what was measured?
	if err := child.verifyMeasured(); err != nil {
		cs.Close()
		return nil, err
	}
	ref := fmt.Sprintf("pid %d", child.pid)
	conn := NewConn(cs, child.class, ref, child.Stop, child.Fault)
	conn.raw, conn.rawThen = t.conn.rawCall, t.conn.rawCallThen
	conn.assign, conn.changed = child.assign, child.changed
	return conn, nil
}

// SpawnError is a refused or failed spawn. It names the upstream and says
// what to do.
type SpawnError struct {
	Upstream string
	Reason   string
	Hint     string
	Err      error
}

func (e *SpawnError) Error() string {
	s := fmt.Sprintf("upstream %q unavailable: %s", e.Upstream, e.Reason)
	if e.Hint != "" {
		s += "; " + e.Hint
	}
	return s
}

func (e *SpawnError) Unwrap() error { return e.Err }

// ErrPinMismatch is wrapped by a SpawnError whose measured digest differs
// from the pin; ErrUnpinned by one refused for having no pin.
var (
	ErrPinMismatch = errors.New("digest does not match pin")
	ErrUnpinned    = errors.New("no pin")
)

// Child is a running, measured upstream process.
type Child struct {
	path    string
	name    string
	session atomic.Pointer[string] // the agent session it serves (Assign)
	// keys are the stats of the files measured to run it (the command, a
	// script's interpreter) before they were measured: changed says so
	// once one differs at its path.
	keys  map[string]execimage.FileKey
	class string
	cmd   *exec.Cmd
	pid   int
	grace time.Duration
	hooks Hooks

	stdin  *os.File
	stdout io.ReadCloser
	// wsem lets one message at a time onto stdin. A write waiting for its
	// turn gives up when its context ends or the child is stopped.
	wsem     chan struct{}
	stopping chan struct{} // closed when Stop begins: nothing more is written
	wtimeout time.Duration // writeTimeout when spawned

	done chan struct{} // closed once the process has been waited for
	// reported is closed once the exit has been reported (Hooks.Exit
	// returned: its audit records are written), which Stop waits for.
	reported chan struct{}
	waitErr  error
	stopOnce sync.Once
	fault    atomic.Pointer[error]
	cgroup   *contain.Group // the child's own cgroup, or nil
	// handshook is set once the MCP handshake with the child is done.
	handshook atomic.Bool

	// sigmu orders signals to the child's process group before its reaping:
	// once reaped is set, the group id may name another process's group.
	sigmu  sync.Mutex
	reaped bool

	stderrBytes, stderrLines, dropped atomic.Int64
	stderrDone                        chan struct{}

	// ev is the spawn event recorded, for a refusal after the handshake;
	// watches are what verifyMeasured re-checks then (recheck.go).
	ev        SpawnEvent
	watches   []execimage.Watch
	watchOnce sync.Once
}

// changedHint is the hint of a refusal for a measured file changed after
// its measurement.
const changedHint = "retry once the files are no longer being changed; if the change is intended, run 'cmcp spawn-digest' and update the pin"

// verifyMeasured re-checks, once the child answered the MCP handshake (an
// interpreter has read its main module by then), that every file it may
// have read by path is still what was measured (watches). If not, the
// child is stopped, the refusal is recorded (a spawn record of the child's
// pid, refused, after the one that said it started) and returned. The
// watches are released either way.
func (c *Child) verifyMeasured() error {
	defer c.closeWatches()
	for _, w := range c.watches {
		why, hint := w.Changed()
		if why == "" {
			continue
		}
		if hint == "" {
			hint = changedHint
		}
		reason := why + " (checked once the child answered the MCP handshake); the child was stopped"
		fault := fmt.Errorf("upstream %q: %s", c.name, reason)
		c.fault.CompareAndSwap(nil, &fault)
		c.Stop()
		ev := c.ev
		ev.Refused, ev.Reason = true, reason
		err := ErrPinMismatch
		if c.hooks.Spawn != nil {
			if herr := c.hooks.Spawn(ev); herr != nil {
				err = errors.Join(err, herr)
			}
		}
		return &SpawnError{Upstream: c.name, Reason: reason, Hint: hint, Err: err}
	}
	return nil
}

func (c *Child) closeWatches() {
	c.watchOnce.Do(func() {
		for _, w := range c.watches {
			w.Close()
		}
	})
}

// testHookBeforeExec, if set, runs after measuring and before exec.
var testHookBeforeExec func(path string)

// testHookAfterSpawn, if set, runs in Connect once the child started and
// before the MCP handshake.
var testHookAfterSpawn func(c *Child)

// assign names the agent session the child serves (a warm spare's).
func (c *Child) assign(session string) { c.session.Store(&session) }

// changed says which measured file differs at its path from what it was
// before it was measured, or is "".
func (c *Child) changed() string {
	for _, p := range slices.Sorted(maps.Keys(c.keys)) {
		if k, err := execimage.StatKey(p); err != nil || k != c.keys[p] {
			return fmt.Sprintf("%s changed on disk after the child was measured and started", p)
		}
	}
	return ""
}

// PID is the child's process id (and process group id).
func (c *Child) PID() int { return c.pid }

// writeTimeout bounds a write whose context has no deadline (go-sdk
// answers the child's own requests, ping or roots/list, with a context that
// never ends): a child that takes nothing from its stdin for that long is
// stopped, with the reason. A variable so that tests can shorten it (a
// child keeps the value it was spawned with).
var writeTimeout = 30 * time.Second

// write sends one message line to the child's stdin, one message at a
// time. A child that does not read its stdin fills the pipe and the write
// waits, as does a write waiting for its turn: until ctx ends, then it
// gives up, or until the child is stopped. A write whose ctx has no
// deadline waits writeTimeout at most, then the child is stopped. A line
// cut part way through leaves the child's input unframed: the child is
// stopped, with the reason, and pending calls fail.
func (c *Child) write(ctx context.Context, b []byte) error {
	if err := c.writeRefused(); err != nil {
		return err
	}
	if bytes.ContainsAny(b, "\r\n") {
		// Never more than one line: the child would read the rest as
		// messages of their own.
		return fmt.Errorf("upstream %q: a message holding a line break was not sent (it would be more than one line on the child's stdin)", c.name)
	}
	call := ctx // its end is the caller giving up
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.wtimeout)
		defer cancel()
	}
	select {
	case c.wsem <- struct{}{}:
	case <-c.stopping:
		return c.writeRefused()
	case <-ctx.Done():
		return c.gaveUp(call)
	}
	defer func() { <-c.wsem }()
	if err := c.writeRefused(); err != nil {
		return err
	}
	b = append(b, '\n')
	n, whole, err := c.writeNow(b)
	if whole && err == nil {
		return nil
	}
	if !whole {
		// The pipe is full: the rest waits for the child to read, until
		// ctx ends.
		interrupted := make(chan struct{})
		stop := context.AfterFunc(ctx, func() {
			c.stdin.SetWriteDeadline(time.Now()) // wakes the blocked write
			close(interrupted)
		})
		var m int
		m, err = c.stdin.Write(b[n:])
		n += m
		if !stop() {
			<-interrupted
			c.stdin.SetWriteDeadline(time.Time{})
		}
		if err == nil {
			return nil
		}
	}
	select {
	case <-c.stopping:
		return c.writeRefused() // Stop closed stdin under the write
	default:
	}
	if n > 0 {
		c.fail(fmt.Errorf("upstream %q: the child stopped reading its stdin: a message was cut after %d of %d bytes (%v); the child is stopped", c.name, n, len(b), err))
	}
	if errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() != nil {
		return c.gaveUp(call)
	}
	return err
}

// writeNow writes b to the child's stdin as far as the pipe takes it
// without waiting (one write(2), with no context watching it: the common
// case, a pipe with room, costs no timer or AfterFunc). whole is false when
// b[n:] is left to write, waiting for the child to read (write does it);
// err is the write's failure (the child gone); when stdin cannot be
// written this way (closed by Stop), whole is false and the ordinary write
// reports it.
func (c *Child) writeNow(b []byte) (n int, whole bool, err error) {
	rc, err := c.stdin.SyscallConn()
	if err != nil {
		return 0, false, nil
	}
	werr := rc.Write(func(fd uintptr) bool {
		for n < len(b) {
			m, e := syscall.Write(int(fd), b[n:])
			switch {
			case e == syscall.EINTR:
				continue
			case e == syscall.EAGAIN:
				return true
			case e != nil:
				err = &os.PathError{Op: "write", Path: c.stdin.Name(), Err: e}
				return true
			case m <= 0:
				return true
			}
			n += m
		}
		return true
	})
	if werr != nil {
		return n, false, nil // stdin closed: the ordinary write says so
	}
	if err != nil {
		return n, true, err
	}
	return n, n == len(b), nil
}

// writeRefused says why nothing more is written to the child, or is nil.
func (c *Child) writeRefused() error {
	if p := c.fault.Load(); p != nil {
		return *p // stopped by the gateway: nothing more reaches it
	}
	select {
	case <-c.stopping:
		return fmt.Errorf("upstream %q: the child was stopped", c.name)
	default:
		return nil
	}
}

// gaveUp is the error of a write that waited for the child's stdin until
// its context ended. If that was writeTimeout, not the caller, the child
// is stopped.
func (c *Child) gaveUp(call context.Context) error {
	if err := call.Err(); err != nil {
		return fmt.Errorf("the child did not read its stdin before the call ended: %w", err)
	}
	c.fail(fmt.Errorf("upstream %q: the child took nothing from its stdin for %v; the child is stopped", c.name, c.wtimeout))
	return *c.fault.Load()
}

// fail records the fault that killed the child and stops it.
func (c *Child) fail(err error) {
	c.fault.CompareAndSwap(nil, &err)
	go c.Stop()
}

// Fault returns why the gateway ended the child, or why it died.
func (c *Child) Fault() error {
	if p := c.fault.Load(); p != nil {
		return *p
	}
	if c.exited() {
		return c.exitFault()
	}
	return nil
}

func (c *Child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// exitFault describes the child's end for an agent, once its stdout has
// ended. A child still running 2 s later, unless the gateway is stopping
// it, closed its stdout and kept running: nothing more can be read from
// it, so it is stopped, and that is its fault (the agent's error, the
// exit record's reason), not the SIGTERM the gateway then sends it.
func (c *Child) exitFault() error {
	if p := c.fault.Load(); p != nil {
		return *p
	}
	select {
	case <-c.done:
	case <-time.After(2 * time.Second):
		select {
		case <-c.stopping:
			return fmt.Errorf("upstream %q: the child was stopped", c.name)
		default:
		}
		when := "while it was serving"
		if !c.handshook.Load() {
			when = "during the MCP handshake"
		}
		c.fail(fmt.Errorf("upstream %q closed its stdout %s but kept running: the gateway stopped it; the next call respawns it", c.name, when))
		return *c.fault.Load()
	}
	return fmt.Errorf("upstream %q exited (%s): the next call respawns it; its stderr is logged", c.name, describeExit(c.cmd.ProcessState))
}

func describeExit(ps *os.ProcessState) string {
	if ps == nil {
		return "unknown status"
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return fmt.Sprintf("killed by signal %d, %s", int(ws.Signal()), ws.Signal())
	}
	return fmt.Sprintf("exit status %d", ps.ExitCode())
}

// Stop ends the child: stdin is closed, SIGTERM goes to its process group,
// and SIGKILL follows after the grace period. The whole group is killed in
// the end, so grandchildren never outlive it (see reap). Stop waits for the
// child, and for its exit to be reported (Hooks.Exit: the gateway's exit
// records are written before a stop returns, and so before a shutdown
// seals the log). It never waits for a write: closing stdin wakes one in
// progress.
func (c *Child) Stop() error {
	c.stopOnce.Do(func() {
		close(c.stopping)
		c.stdin.Close()
		c.signal(syscall.SIGTERM)
		select {
		case <-c.done:
		case <-time.After(c.grace):
			c.signal(syscall.SIGKILL)
		}
		<-c.done
		c.stdout.Close()
		c.closeWatches()
	})
	<-c.reported
	return nil
}

// signal sends sig to the child's process group, unless the child has
// been reaped: its group id may then be another process's.
func (c *Child) signal(sig syscall.Signal) {
	c.sigmu.Lock()
	defer c.sigmu.Unlock()
	if !c.reaped {
		_ = syscall.Kill(-c.pid, sig)
	}
}

// reap waits for the child to exit. While the exited child is an unreaped
// zombie its pid, the group id, cannot be reused: what it left running in
// its group is killed then, on whatever terms it exited, so grandchildren
// never outlive it. Once it is reaped the group is never signalled again.
func (c *Child) reap() {
	if waitExited(c.pid) {
		_ = syscall.Kill(-c.pid, syscall.SIGKILL)
	}
	c.sigmu.Lock()
	c.reaped = true
	c.sigmu.Unlock()
	reaper.Forget(c.pid)
	c.waitErr = c.cmd.Wait()
	contain.Disown(c.pid)
	// What the child started and left behind ends with it, whatever
	// group or session it moved to: its cgroup, or without one, every
	// orphan the gateway adopted as subreaper (their parent is gone: an
	// orphan cannot be traced to the child it came from).
	if c.cgroup != nil {
		_ = c.cgroup.Kill(c.grace)
		reaper.ForgetCgroup(c.cgroup.Path())
	} else {
		contain.KillOrphans(nil)
	}
	select {
	case <-c.stderrDone:
	case <-time.After(c.grace):
	}
	close(c.done)
	c.reportExit()
	close(c.reported)
}

// Done is closed when the child has exited and been reaped.
func (c *Child) Done() <-chan struct{} { return c.done }

// stderrReaders are the children's stderr read buffers: a child per
// session would otherwise allocate (and clear) 64 KiB at every new session.
var stderrReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 64<<10) }}

func (c *Child) pumpStderr(r io.ReadCloser, spec StdioSpec) {
	defer close(c.stderrDone)
	defer r.Close()
	lineMax := spec.StderrLineMax
	if lineMax <= 0 {
		lineMax = 4096
	}
	perSec := spec.StderrLinesPerSec
	if perSec <= 0 {
		perSec = 100
	}
	br := stderrReaders.Get().(*bufio.Reader)
	br.Reset(r)
	defer func() {
		br.Reset(nil)
		stderrReaders.Put(br) // lines are copied out: the buffer serves the next child
	}()
	window := time.Now()
	inWindow := 0
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		c.stderrBytes.Add(int64(len(chunk)))
		room := lineMax - len(line)
		if room < 0 {
			room = 0
		}
		if len(chunk) < room {
			room = len(chunk)
		}
		line = append(line, chunk[:room]...)
		c.dropped.Add(int64(len(chunk) - room))
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if len(line) > 0 {
			c.stderrLines.Add(1)
			now := time.Now()
			if now.Sub(window) >= time.Second {
				window, inWindow = now, 0
			}
			if inWindow < perSec && c.hooks.Log != nil {
				inWindow++
				c.hooks.Log.Info("upstream stderr", "upstream", c.name, "pid", c.pid, "line", strings.TrimRight(string(line), "\r\n"))
			} else {
				c.dropped.Add(int64(len(line)))
			}
			line = line[:0]
		}
		if err != nil {
			return
		}
	}
}

// reportStderr reports growing stderr counts until the child is gone.
func (c *Child) reportStderr() {
	every := c.hooks.StderrEvery
	if every <= 0 {
		every = time.Minute
	}
	t := time.NewTicker(every)
	defer t.Stop()
	var last int64
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
			if n := c.stderrBytes.Load(); n != last {
				last = n
				c.hooks.Stderr(ExitEvent{Path: c.path, Class: c.class, Session: *c.session.Load(), Upstream: c.name, PID: c.pid, ExitCode: -1,
					StderrBytes: n, StderrLines: c.stderrLines.Load(), Dropped: c.dropped.Load()})
			}
		}
	}
}

func (c *Child) reportExit() {
	ev := ExitEvent{Path: c.path, Class: c.class, Session: *c.session.Load(), Upstream: c.name, PID: c.pid, ExitCode: -1, StderrBytes: c.stderrBytes.Load(), StderrLines: c.stderrLines.Load(), Dropped: c.dropped.Load()}
	if ps := c.cmd.ProcessState; ps != nil {
		ev.ExitCode = ps.ExitCode()
		if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			ev.Signal = ws.Signal().String()
		}
	}
	if p := c.fault.Load(); p != nil {
		ev.Fault = (*p).Error()
	}
	if c.hooks.Exit != nil {
		c.hooks.Exit(ev)
	}
}

// childEnv builds the child's environment: allowlisted variables from the
// gateway's environment in their order, then configured values in the
// order of their names.
func childEnv(spec StdioSpec, environ []string) []string {
	allow := spec.EnvAllow
	if allow == nil {
		allow = DefaultEnvAllow
	}
	set := map[string]string{}
	var order []string
	for _, name := range allow {
		if v, ok := lookupEnvOK(environ, name); ok {
			if _, dup := set[name]; !dup {
				order = append(order, name)
			}
			set[name] = v
		}
	}
	for _, k := range slices.Sorted(maps.Keys(spec.Env)) { // in one order, which spawn records name
		if _, dup := set[k]; !dup {
			order = append(order, k)
		}
		set[k] = spec.Env[k]
	}
	out := make([]string, 0, len(order))
	for _, k := range order {
		out = append(out, k+"="+set[k])
	}
	return out
}

// CodeEnvNames are the names among names of variables that load code
// (config.CodeLoadingEnv), in order.
func CodeEnvNames(names []string) []string {
	var out []string
	for _, n := range names {
		if config.CodeLoadingEnv(n) != "" {
			out = append(out, n)
		}
	}
	return out
}

// codeEnvIn reports whether env sets a variable that loads code.
func codeEnvIn(env []string) bool {
	return slices.ContainsFunc(envNames(env), func(name string) bool { return config.CodeLoadingEnv(name) != "" })
}

func envNames(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		out = append(out, k)
	}
	return out
}

func lookupEnv(env []string, name string) string {
	v, _ := lookupEnvOK(env, name)
	return v
}

func lookupEnvOK(env []string, name string) (string, bool) {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == name {
			return v, true
		}
	}
	return "", false
}

type sessionKey struct{}

// WithSession returns ctx carrying the agent session id that spawn and exit
// events report.
func WithSession(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, sessionKey{}, id)
}

// SessionFrom returns the session id set by WithSession, or "".
func SessionFrom(ctx context.Context) string {
	s, _ := ctx.Value(sessionKey{}).(string)
	return s
}

// ResolveCommand finds the command s runs as Spawn will (a path, or a name
// on the PATH of the child's environment), without running it.
func (s *Stdio) ResolveCommand() (string, error) {
	return digest.ResolveCommand(s.Spec.Command, lookupEnv(childEnv(s.Spec, s.Environ), "PATH"))
}
