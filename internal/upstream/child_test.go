package upstream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/confidential-mcp/cmcp/pkg/digest"
)

func writeScript(t *testing.T, body string) (string, digest.Digest) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "server.sh")
	if err := os.WriteFile(p, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	f, d, err := digest.OpenFile(p)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	return p, d
}

func TestSpawnScriptRunsMeasuredBytes(t *testing.T) {
	p, d := writeScript(t, "#!/bin/sh\necho started >&2\nexit 4\n")
	exits := make(chan ExitEvent, 1)
	var spawned SpawnEvent
	hooks := Hooks{Spawn: func(ev SpawnEvent) error { spawned = ev; return nil }, Exit: func(ev ExitEvent) { exits <- ev }}
	c, err := Spawn(context.Background(), StdioSpec{Name: "s", Command: p, Pin: d, InterpreterPin: shPin(t)}, os.Environ(), hooks, "per-session")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-exits:
		// 4 means the script itself ran (126/127 would mean the exec path broke).
		if ev.ExitCode != 4 || ev.StderrBytes != int64(len("started\n")) {
			t.Fatalf("exit %+v", ev)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("script did not exit")
	}
	c.Stop()
	if spawned.Class != ClassSpawnMeasured || spawned.Interpreter != shReal(t) || !spawned.InterpreterDig.Equal(shPin(t)) || !spawned.InterpreterPin.Equal(shPin(t)) {
		t.Fatalf("spawn event %+v", spawned)
	}
}

// shPin is the digest of /bin/sh's real file.
func shPin(t *testing.T) digest.Digest {
	t.Helper()
	f, d, err := digest.OpenFile(shReal(t))
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	return d
}

// shReal is the real path of /bin/sh, the interpreter of the test scripts.
func shReal(t *testing.T) string {
	t.Helper()
	r, err := filepath.EvalSymlinks("/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// copySh copies /bin/sh's real file to path, executable: an interpreter
// a test may replace.
func copySh(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(shReal(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestSpawnScriptInterpreterIsPinned: a "#!" script's pin covers its own
// bytes, not the interpreter, so the interpreter is pinned too and checked
// at every spawn, resolved as the kernel would (the path after "#!", one
// optional argument; "#!/usr/bin/env NAME" on the child's PATH). Found in
// review (rev75): the interpreter replaced after pinning ran, as
// spawn-measured. Refused: an interpreter without a pin, a replaced one
// (both digests named), one that is itself a script, an interpreter pin
// for a command that is not a script. Nothing refused runs.
func TestSpawnScriptInterpreterIsPinned(t *testing.T) {
	dir := t.TempDir()
	mark := filepath.Join(dir, "ran")
	interp := filepath.Join(dir, "interp", "py") // as in the reviewer's repro
	copySh(t, interp)
	interpPin := digest.Bytes(mustRead(t, interp))
	script, scriptPin := writeScript(t, "#!"+interp+"\n: > "+mark+"\nexit 4\n")
	envScript, envPin := writeScript(t, "#!/usr/bin/env mysh\n: > "+mark+"\nexit 4\n")
	pathA, pathB := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	copySh(t, filepath.Join(pathB, "mysh"))
	nested := filepath.Join(dir, "nested")
	if err := os.WriteFile(nested, []byte("#!/bin/sh\nexec /bin/sh \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	nestedScript, nestedPin := writeScript(t, "#!"+nested+"\ntouch "+mark+"\n")
	elf, elfPin := writeScript(t, "\x7fELF not really\n")
	for _, tc := range []struct {
		name  string
		spec  StdioSpec
		swap  func()
		want  error
		msg   []string
		class string // "" = refused
	}{
		{"pinned", StdioSpec{Command: script, Pin: scriptPin, InterpreterPin: interpPin}, nil, nil, nil, ClassSpawnMeasured},
		{"unpinned", StdioSpec{Command: script, Pin: scriptPin}, nil, ErrUnpinned,
			[]string{"#! script for " + interp, "add 'interpreter: " + interpPin.String() + "'"}, ""},
		{"unpinned, allow_unmeasured", StdioSpec{Command: script, AllowUnmeasured: true}, nil, nil, nil, ClassSpawnUnmeasured},
		{"interpreter replaced", StdioSpec{Command: script, Pin: scriptPin, InterpreterPin: interpPin}, func() {
			if err := os.WriteFile(interp, mustRead(t, exe(t)), 0o755); err != nil {
				t.Fatal(err)
			}
		}, ErrPinMismatch, []string{"interpreter " + interp, "has digest " + digest.Bytes(mustRead(t, exe(t))).String(), "but the pin is " + interpPin.String()}, ""},
		{"interpreter replaced by a script (rev75's repro)", StdioSpec{Command: script, Pin: scriptPin, InterpreterPin: interpPin}, func() {
			if err := os.WriteFile(interp, []byte("#!/bin/sh\ntouch "+mark+"\nexec /bin/sh \"$@\"\n"), 0o755); err != nil {
				t.Fatal(err)
			}
		}, digest.ErrNestedInterpreter, []string{interp}, ""},
		{"env on the child's PATH", StdioSpec{Command: envScript, Pin: envPin, InterpreterPin: interpPin, Env: map[string]string{"PATH": pathA + ":" + pathB}}, nil, nil, nil, ClassSpawnMeasured},
		{"env, another one earlier on PATH", StdioSpec{Command: envScript, Pin: envPin, InterpreterPin: interpPin, Env: map[string]string{"PATH": pathA + ":" + pathB}}, func() {
			if err := os.WriteFile(filepath.Join(pathA, "mysh"), mustRead(t, exe(t)), 0o755); err != nil {
				t.Fatal(err)
			}
		}, ErrPinMismatch, []string{filepath.Join(pathA, "mysh") + " (#!/usr/bin/env mysh)"}, ""},
		{"nested", StdioSpec{Command: nestedScript, Pin: nestedPin, InterpreterPin: digest.Bytes(mustRead(t, nested))}, nil, digest.ErrNestedInterpreter, []string{"is itself a #! script"}, ""},
		{"not a script", StdioSpec{Command: elf, Pin: elfPin, InterpreterPin: interpPin}, nil, ErrPinMismatch, []string{"the pin names an interpreter"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			os.Remove(mark)
			copySh(t, interp)
			os.MkdirAll(pathA, 0o755)
			os.Remove(filepath.Join(pathA, "mysh"))
			if tc.swap != nil {
				tc.swap()
			}
			tc.spec.Name = "s"
			var ev SpawnEvent
			exits := make(chan ExitEvent, 1)
			c, err := Spawn(context.Background(), tc.spec, os.Environ(),
				Hooks{Spawn: func(e SpawnEvent) error { ev = e; return nil }, Exit: func(e ExitEvent) { exits <- e }}, "per-session")
			if tc.class == "" {
				if err == nil || !errors.Is(err, tc.want) {
					if c != nil {
						c.Stop()
					}
					t.Fatalf("err = %v, want %v", err, tc.want)
				}
				for _, m := range tc.msg {
					if !strings.Contains(err.Error(), m) {
						t.Errorf("error does not say %q: %v", m, err)
					}
				}
				if !ev.Refused || ev.PID != 0 || ev.Class != "" {
					t.Fatalf("refusal event %+v", ev)
				}
				if _, err := os.Stat(mark); err == nil {
					t.Fatal("a refused spawn ran")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			e := waitExit(t, exits)
			c.Stop()
			if e.ExitCode != 4 || ev.Class != tc.class || ev.InterpreterDig.IsZero() {
				t.Fatalf("exit %+v, spawn event %+v", e, ev)
			}
			if _, err := os.Stat(mark); err != nil {
				t.Fatal("the script did not run")
			}
		})
	}
}

// TestSpawnScriptInterpreterArgument: the one optional argument of the "#!"
// line reaches the interpreter, as the kernel passes it (sh -e stops at the
// first failing command).
func TestSpawnScriptInterpreterArgument(t *testing.T) {
	p, d := writeScript(t, "#!/bin/sh -e\nfalse\nexit 4\n")
	exits := make(chan ExitEvent, 1)
	c, err := Spawn(context.Background(), StdioSpec{Name: "s", Command: p, Pin: d, InterpreterPin: shPin(t)}, os.Environ(),
		Hooks{Exit: func(e ExitEvent) { exits <- e }}, "per-session")
	if err != nil {
		t.Fatal(err)
	}
	e := waitExit(t, exits)
	c.Stop()
	if e.ExitCode != 1 {
		t.Fatalf("exit %d, want 1 (sh -e)", e.ExitCode)
	}
}

func exe(t *testing.T) string {
	t.Helper()
	p, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSpawnRefusals(t *testing.T) {
	p, d := writeScript(t, "#!/bin/sh\nexit 0\n")
	for _, tc := range []struct {
		name string
		spec StdioSpec
		want error
		msg  string
	}{
		{"mismatch", StdioSpec{Name: "s", Command: p, Pin: digest.Bytes([]byte("other"))}, ErrPinMismatch, "but the pin is"},
		{"unpinned", StdioSpec{Name: "s", Command: p}, ErrUnpinned, "has no pin"},
		{"missing", StdioSpec{Name: "s", Command: filepath.Join(t.TempDir(), "nope"), Pin: d}, nil, "nope"},
		{"target mismatch", StdioSpec{Name: "s", Command: p, Pin: d, MeasurePath: p, MeasurePin: digest.Bytes([]byte("x"))}, ErrPinMismatch, "measure target"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var refused bool
			_, err := Spawn(context.Background(), tc.spec, os.Environ(), Hooks{Spawn: func(ev SpawnEvent) error { refused = ev.Refused; return nil }}, "per-session")
			if err == nil || !strings.Contains(err.Error(), tc.msg) || !strings.Contains(err.Error(), `upstream "s"`) {
				t.Fatalf("err = %v", err)
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if !refused {
				t.Fatal("the refusal was not reported to the hook")
			}
		})
	}
}

// TestSpawnRefusedWhenItCannotBeRecorded: when Hooks.Ready reports that
// the spawn cannot be recorded (the audit log is broken), the child is
// never started: it does not run first and get stopped after.
func TestSpawnRefusedWhenItCannotBeRecorded(t *testing.T) {
	mark := filepath.Join(t.TempDir(), "ran")
	p, d := writeScript(t, "#!/bin/sh\ntouch "+mark+"\nsleep 5\n")
	var refused bool
	_, err := Spawn(context.Background(), StdioSpec{Name: "s", Command: p, Pin: d, InterpreterPin: shPin(t)}, os.Environ(), Hooks{
		Ready: func() error { return errors.New("audit log broken") },
		Spawn: func(ev SpawnEvent) error { refused = ev.Refused; return nil },
	}, "per-session")
	if err == nil || !strings.Contains(err.Error(), "audit log broken") || !refused {
		t.Fatalf("err = %v, refusal reported %v", err, refused)
	}
	time.Sleep(300 * time.Millisecond)
	if _, err := os.Stat(mark); err == nil {
		t.Fatal("the child ran although its spawn could not be recorded")
	}
}

func TestChildEnv(t *testing.T) {
	env := childEnv(StdioSpec{EnvAllow: []string{"PATH", "KEEP"}, Env: map[string]string{"SET": "1", "PATH": "/override"}},
		[]string{"PATH=/bin", "KEEP=yes", "SECRET=no"})
	got := strings.Join(env, " ")
	if got != "PATH=/override KEEP=yes SET=1" {
		t.Fatalf("env = %q", got)
	}
}

// TestChildEnvOrder: configured values follow the allowlisted ones in the
// order of their names, so that every spawn of an upstream gets (and its
// spawn record names) its environment in one order.
func TestChildEnvOrder(t *testing.T) {
	spec := StdioSpec{EnvAllow: []string{"PATH"}, Env: map[string]string{"D": "4", "B": "2", "A": "1", "C": "3", "E": "5"}}
	for range 20 {
		if got := strings.Join(childEnv(spec, []string{"PATH=/bin"}), " "); got != "PATH=/bin A=1 B=2 C=3 D=4 E=5" {
			t.Fatalf("env = %q", got)
		}
	}
}

// TestSpawnCodeEnvIsUnmeasured: a pinned child whose environment can load
// code the pin does not cover (PYTHONPATH, LD_PRELOAD, NODE_OPTIONS) is
// spawn-unmeasured, and so is every spawn of an upstream with
// AllowCodeEnv (allow_code_env), whether the variable is set or not; the
// spawn event carries the environment the child got.
func TestSpawnCodeEnvIsUnmeasured(t *testing.T) {
	p, d := writeScript(t, "#!/bin/sh\nexec sleep 300\n")
	environ := []string{"PATH=/usr/bin:/bin", "PYTHONPATH=/tmp/evil"}
	for _, tc := range []struct {
		name string
		spec StdioSpec
		want string
		env  string
	}{
		{"plain", StdioSpec{EnvAllow: []string{"PATH"}}, ClassSpawnMeasured, "PATH=/usr/bin:/bin"},
		{"PYTHONPATH from the gateway", StdioSpec{EnvAllow: []string{"PATH", "PYTHONPATH"}}, ClassSpawnUnmeasured, "PATH=/usr/bin:/bin PYTHONPATH=/tmp/evil"},
		{"LD_PRELOAD set", StdioSpec{EnvAllow: []string{"PATH"}, Env: map[string]string{"LD_PRELOAD": ""}}, ClassSpawnUnmeasured, "PATH=/usr/bin:/bin LD_PRELOAD="},
		{"NODE_OPTIONS set", StdioSpec{EnvAllow: []string{}, Env: map[string]string{"NODE_OPTIONS": "--require /tmp/x.js"}}, ClassSpawnUnmeasured, "NODE_OPTIONS=--require /tmp/x.js"},
		{"allow_code_env, nothing set", StdioSpec{EnvAllow: []string{"PATH", "NODE_PATH"}, AllowCodeEnv: true}, ClassSpawnUnmeasured, "PATH=/usr/bin:/bin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := tc.spec
			spec.Name, spec.Command, spec.Pin, spec.InterpreterPin, spec.StopGrace = "s", p, d, shPin(t), time.Second
			var spawned SpawnEvent
			c, err := Spawn(context.Background(), spec, environ, Hooks{Spawn: func(ev SpawnEvent) error { spawned = ev; return nil }}, "shared")
			if err != nil {
				t.Fatal(err)
			}
			defer c.Stop()
			if c.class != tc.want || spawned.Class != tc.want {
				t.Errorf("class %q, recorded %q; want %q", c.class, spawned.Class, tc.want)
			}
			if got := strings.Join(spawned.Env, " "); got != tc.env {
				t.Errorf("event's environment %q, want %q", got, tc.env)
			}
		})
	}
}

func TestStderrCountsWhileRunning(t *testing.T) {
	p, d := writeScript(t, "#!/bin/sh\necho one >&2\nsleep 0.3\necho two >&2\nsleep 5\n")
	reports := make(chan ExitEvent, 10)
	hooks := Hooks{Stderr: func(ev ExitEvent) { reports <- ev }, StderrEvery: 100 * time.Millisecond}
	c, err := Spawn(context.Background(), StdioSpec{Name: "s", Command: p, Pin: d, InterpreterPin: shPin(t), StopGrace: time.Second}, os.Environ(), hooks, "shared")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	want := int64(len("one\ntwo\n"))
	deadline := time.After(5 * time.Second)
	for {
		select {
		case ev := <-reports:
			if ev.StderrBytes == want {
				return
			}
		case <-deadline:
			t.Fatal("no running stderr count reached the hook")
		}
	}
}

// TestStopReturnsAfterTheExitIsReported: Stop returns only once Hooks.Exit
// has returned (the gateway's exit records are written then), so that a
// shutdown that stops its children and then seals the log loses none; a
// child that exits on its own is reported as before.
func TestStopReturnsAfterTheExitIsReported(t *testing.T) {
	p, d := writeScript(t, "#!/bin/sh\nexec sleep 300\n")
	var reported atomic.Bool
	hooks := Hooks{Exit: func(ExitEvent) {
		time.Sleep(300 * time.Millisecond) // a slow audit append
		reported.Store(true)
	}}
	c, err := Spawn(context.Background(), StdioSpec{Name: "s", Command: p, Pin: d, InterpreterPin: shPin(t), StopGrace: time.Second}, os.Environ(), hooks, "per-session")
	if err != nil {
		t.Fatal(err)
	}
	c.Stop()
	if !reported.Load() {
		t.Fatal("Stop returned before the child's exit was reported")
	}
	c.Stop() // a second Stop returns too
}

// TestGrandchildEndsWithTheChild: a child that exits on its own takes
// what it left running in its process group with it, at once, without
// Stop (which may come much later, when the group id could be another's).
func TestGrandchildEndsWithTheChild(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "grandchild")
	p, d := writeScript(t, "#!/bin/sh\nsleep 300 &\necho $! > "+pidFile+".tmp\nmv "+pidFile+".tmp "+pidFile+"\nexit 0\n")
	c, err := Spawn(context.Background(), StdioSpec{Name: "s", Command: p, Pin: d, InterpreterPin: shPin(t), StopGrace: 30 * time.Second}, os.Environ(), Hooks{}, "per-session")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop() })
	start := time.Now()
	var b []byte
	for b, err = os.ReadFile(pidFile); err != nil; b, err = os.ReadFile(pidFile) {
		if time.Since(start) > 10*time.Second {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	for !gone(pid) {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("grandchild %d still runs after the child exited", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// gone reports whether process pid has ended (a zombie has).
func gone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	return strings.HasPrefix(rest, "Z")
}

// TestSpawnFileWrittenWhileMeasuredIsRefused: a file written in place
// between its digest and the child's start (here right before exec) gets
// the child stopped and the spawn refused, naming the file: the child may
// be running other bytes than measured.
func TestSpawnFileWrittenWhileMeasuredIsRefused(t *testing.T) {
	mark := filepath.Join(t.TempDir(), "ran")
	p, d := writeScript(t, "#!/bin/sh\nsleep 5\n")
	testHookBeforeExec = func(path string) {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Error(err)
			return
		}
		time.Sleep(20 * time.Millisecond) // a visible change of the status change time
		f.WriteString("touch " + mark + "\n")
		f.Close()
	}
	t.Cleanup(func() { testHookBeforeExec = nil })
	var refused SpawnEvent
	_, err := Spawn(context.Background(), StdioSpec{Name: "s", Command: p, Pin: d, InterpreterPin: shPin(t), StopGrace: time.Second}, os.Environ(),
		Hooks{Spawn: func(ev SpawnEvent) error { refused = ev; return nil }}, "per-session")
	if err == nil || !errors.Is(err, ErrPinMismatch) || !strings.Contains(err.Error(), "written while it was measured") || !refused.Refused || refused.PID == 0 {
		t.Fatalf("err = %v, refusal %+v (a child that ran is refused with its pid)", err, refused)
	}
}

// TestChildNeverGetsALineBreakInAMessage: the last guard before a child's
// stdin refuses a message holding a line break (a child reading line by
// line would take its second line for a message of its own); the message
// is not written, and the child reads only the messages that follow it.
func TestChildNeverGetsALineBreakInAMessage(t *testing.T) {
	out := filepath.Join(t.TempDir(), "stdin")
	p, d := writeScript(t, "#!/bin/sh\nread -r l\nprintf '%s\\n' \"$l\" > "+out+"\n")
	exits := make(chan ExitEvent, 1)
	c, err := Spawn(context.Background(), StdioSpec{Name: "s", Command: p, Pin: d, InterpreterPin: shPin(t), StopGrace: time.Second},
		os.Environ(), Hooks{Exit: func(ev ExitEvent) { exits <- ev }}, "per-session")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, m := range []string{"{\"a\":[\n{\"id\":1,\"method\":\"x\"}]}", "{\"a\":\r1}"} {
		if err := c.write(ctx, []byte(m)); err == nil || !strings.Contains(err.Error(), "line break") {
			t.Fatalf("write %q: %v, want it refused for its line break", m, err)
		}
	}
	if err := c.write(ctx, []byte(`{"a":2}`)); err != nil {
		t.Fatal(err)
	}
	select { // it reads one line, writes it out and exits
	case <-exits:
	case <-time.After(10 * time.Second):
		t.Fatal("the child did not exit")
	}
	if b, err := os.ReadFile(out); err != nil || string(b) != "{\"a\":2}\n" {
		t.Fatalf("the child's first line was %q (%v), want the message without a line break", b, err)
	}
}

// TestSpawnRunsTheMeasuredInterpreter: the child runs the interpreter the
// gateway measured, through its descriptor, not one the kernel or env
// would find again at exec: an "sh" put earlier on the child's PATH
// between the measurement and the exec never runs.
func TestSpawnRunsTheMeasuredInterpreter(t *testing.T) {
	early := t.TempDir()
	p, d := writeScript(t, "#!/usr/bin/env sh\nexit 4\n")
	testHookBeforeExec = func(string) {
		if err := os.WriteFile(filepath.Join(early, "sh"), []byte("#!/bin/sh\nexit 7\n"), 0o755); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(func() { testHookBeforeExec = nil })
	exits := make(chan ExitEvent, 1)
	c, err := Spawn(context.Background(), StdioSpec{Name: "s", Command: p, Pin: d, InterpreterPin: shPin(t), EnvAllow: []string{"PATH"}, StopGrace: time.Second},
		[]string{"PATH=" + early + ":/usr/bin:/bin"}, Hooks{Exit: func(ev ExitEvent) { exits <- ev }}, "per-session")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	select {
	case ev := <-exits:
		if ev.ExitCode != 4 {
			t.Fatalf("exit %d, want 4: an interpreter other than the measured one ran", ev.ExitCode)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the script did not exit")
	}
}

// TestSpawnRunsInterpretersFromTheirPath: a program run through its
// descriptor still sees its real path, which interpreters need: a
// "#!/usr/bin/env node" script (node resolves its main module's real
// path), node starting itself again (process.execPath) and npx.
func TestSpawnRunsInterpretersFromTheirPath(t *testing.T) {
	node := os.Getenv("CMCP_NODE22")
	if node == "" {
		var err error
		if node, err = exec.LookPath("node"); err != nil {
			t.Skipf("no node on PATH and CMCP_NODE22 unset (scripts/peers.sh provides it): %v", err)
		}
	}
	dir := t.TempDir()
	script := filepath.Join(dir, "srv.js")
	if err := os.WriteFile(script, []byte("#!/usr/bin/env node\nrequire('./lib.js'); process.exit(4)\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "lib.js"), []byte("module.exports = 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "PATH="+filepath.Dir(node)+":"+os.Getenv("PATH"))
	for name, c := range map[string][]string{
		"node script":         {script},
		"node execPath again": {node, "-e", "process.exit(require('child_process').spawnSync(process.execPath, ['-e', '0']).status === 0 ? 4 : 1)"},
	} {
		t.Run(name, func(t *testing.T) {
			real, err := filepath.EvalSymlinks(c[0])
			if err != nil {
				t.Fatal(err)
			}
			f, pin, err := digest.OpenFile(real)
			if err != nil {
				t.Fatal(err)
			}
			f.Close()
			var interpPin digest.Digest
			if c[0] == script {
				// #!/usr/bin/env node: node on the child's PATH, pinned.
				nf, nd, err := digest.OpenFile(node)
				if err != nil {
					t.Fatal(err)
				}
				nf.Close()
				interpPin = nd
			}
			exits := make(chan ExitEvent, 1)
			logs := &syncBuffer{}
			var spawned SpawnEvent
			ch, err := Spawn(context.Background(), StdioSpec{Name: "n", Command: c[0], Args: c[1:], Pin: pin, InterpreterPin: interpPin, EnvAllow: []string{"PATH", "HOME"}, StopGrace: time.Second},
				env, Hooks{Log: slog.New(slog.NewTextHandler(logs, nil)), Exit: func(ev ExitEvent) { exits <- ev }, Spawn: func(ev SpawnEvent) error { spawned = ev; return nil }}, "per-session")
			if err != nil {
				t.Fatal(err)
			}
			if spawned.Class != ClassSpawnMeasured {
				t.Fatalf("spawn event %+v", spawned)
			}
			defer ch.Stop()
			select {
			case ev := <-exits:
				if ev.ExitCode != 4 {
					t.Fatalf("exit %d, want 4; stderr:\n%s", ev.ExitCode, logs.String())
				}
			case <-time.After(20 * time.Second):
				t.Fatal("the child did not exit")
			}
		})
	}
}

// TestEnvInterpreterGetsItsNameAsArgv0: a "#!/usr/bin/env NAME" script's
// interpreter, executed by the gateway through its measured descriptor,
// gets NAME as argv[0], as env would give it: Python finds a virtual
// environment on PATH through argv[0], and busybox picks its applet by it
// (the resolved path broke venv-based servers).
func TestEnvInterpreterGetsItsNameAsArgv0(t *testing.T) {
	out := filepath.Join(t.TempDir(), "argv0")
	p, d := writeScript(t, "#!/usr/bin/env sh\ntr '\\000' '\\n' < /proc/$$/cmdline | head -n 1 > "+out+"\nexec sleep 300\n")
	c, err := Spawn(context.Background(), StdioSpec{Name: "s", Command: p, Pin: d, InterpreterPin: shPin(t), EnvAllow: []string{"PATH"}, StopGrace: time.Second},
		[]string{"PATH=/usr/bin:/bin"}, Hooks{}, "shared")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile(out)
		if got := strings.TrimSpace(string(b)); got != "" {
			if got != "sh" {
				t.Fatalf("the interpreter's argv[0] is %q, want %q (what env passes)", got, "sh")
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the script did not write its interpreter's argv[0]")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
