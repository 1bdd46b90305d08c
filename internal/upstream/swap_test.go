package upstream

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// nodeForTest is Node 22 from scripts/peers.sh, or node on PATH.
func nodeForTest(t *testing.T) string {
	t.Helper()
	node := os.Getenv("CMCP_NODE22")
	if node == "" {
		var err error
		if node, err = exec.LookPath("node"); err != nil {
			t.Skipf("no node on PATH and CMCP_NODE22 unset (scripts/peers.sh provides it): %v", err)
		}
	}
	real, err := filepath.EvalSymlinks(node)
	if err != nil {
		t.Fatal(err)
	}
	return real
}

// nodeServer is a "#!/usr/bin/env node" MCP server answering the
// handshake; extra runs first.
func nodeServer(extra string) string {
	return "#!/usr/bin/env node\n" + extra + `
require('readline').createInterface({input: process.stdin}).on('line', l => {
  const m = JSON.parse(l);
  if (m.method === 'initialize') process.stdout.write(JSON.stringify({jsonrpc: '2.0', id: m.id,
    result: {protocolVersion: '` + ProtocolVersion + `', capabilities: {tools: {}}, serverInfo: {name: 's', version: '1'}}}) + '\n');
});
`
}

// spawnEvents collects spawn events.
type spawnEvents struct {
	mu  sync.Mutex
	evs []SpawnEvent
}

func (s *spawnEvents) add(ev SpawnEvent) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.evs = append(s.evs, ev)
	return nil
}

func (s *spawnEvents) all() []SpawnEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]SpawnEvent(nil), s.evs...)
}

// TestScriptChangedAfterStartIsRefused: a "#!" script is handed to its
// interpreter as /proc/self/fd/3, but node resolves that link to a path
// and reads the path: a script renamed over once the child started (the
// link then reads "<path> (deleted)", which the attacker creates) would
// run unmeasured bytes in a child recorded spawn-measured. The gateway
// re-checks every script once the child answered the MCP handshake: one
// renamed over, moved or written since it was measured gets the child
// stopped, the refusal recorded with the child's pid and the connection
// refused (the agent's -32062); an untouched one connects.
func TestScriptChangedAfterStartIsRefused(t *testing.T) {
	node := nodeForTest(t)
	nf, nodePin, err := digest.OpenFile(node)
	if err != nil {
		t.Fatal(err)
	}
	nf.Close()
	shServer := "#!/bin/sh\n" + answerInitialize + "cat >/dev/null\n"
	for _, c := range []struct {
		name   string
		body   string
		interp digest.Digest
		change func(t *testing.T, p, mark string) // nil: left alone
		want   string
	}{
		{name: "node untouched", body: nodeServer(""), interp: nodePin},
		{name: "node renamed over", body: nodeServer(""), interp: nodePin, want: "was removed or replaced (renamed over)",
			change: func(t *testing.T, p, mark string) {
				evil := []byte(nodeServer("require('fs').writeFileSync('" + mark + "', 'x');"))
				os.WriteFile(p+".new", evil, 0o755)
				os.Rename(p+".new", p)
				os.WriteFile(p+" (deleted)", evil, 0o644) // what readlink(/proc/self/fd/3) now says
			}},
		{name: "sh untouched", body: shServer, interp: shPin(t)},
		{name: "sh renamed over", body: shServer, interp: shPin(t), want: "was removed or replaced (renamed over)",
			change: func(t *testing.T, p, mark string) {
				os.WriteFile(p+".new", []byte(shServer), 0o755)
				os.Rename(p+".new", p)
			}},
		{name: "sh moved away and back", body: shServer, interp: shPin(t), want: "was changed (written, renamed or linked) after it was measured",
			change: func(t *testing.T, p, mark string) {
				os.Rename(p, p+".away")
				os.Rename(p+".away", p)
			}},
		// The path, not only the file: the script's directory renamed and
		// the path made again with other bytes leaves the measured file
		// as it was, linked and unwritten, but no longer at its path.
		{name: "sh's directory renamed and the path made again", body: shServer, interp: shPin(t), want: "is no longer the file measured at that path",
			change: func(t *testing.T, p, mark string) {
				dir := filepath.Dir(p)
				if err := os.Rename(dir, dir+".old"); err != nil {
					t.Error(err)
				}
				os.Mkdir(dir, 0o755)
				os.WriteFile(p, []byte(shServer+"# other bytes\n"), 0o755)
			}},
		{name: "sh written in place", body: shServer, interp: shPin(t), want: "was changed (written, renamed or linked) after it was measured",
			change: func(t *testing.T, p, mark string) {
				time.Sleep(20 * time.Millisecond) // a visible change of the times
				f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
				if err != nil {
					t.Error(err)
					return
				}
				f.WriteString("# more\n")
				f.Close()
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			mark := filepath.Join(dir, "PWNED")
			p := filepath.Join(dir, "srv.js")
			if err := os.WriteFile(p, []byte(c.body), 0o755); err != nil {
				t.Fatal(err)
			}
			f, pin, err := digest.OpenFile(p)
			if err != nil {
				t.Fatal(err)
			}
			f.Close()
			testHookAfterSpawn = func(*Child) {
				if c.change != nil {
					c.change(t, p, mark)
				}
			}
			t.Cleanup(func() { testHookAfterSpawn = nil })
			var evs spawnEvents
			exits := make(chan ExitEvent, 1)
			up := &Stdio{Spec: StdioSpec{Name: "s", Command: p, Pin: pin, InterpreterPin: c.interp, EnvAllow: []string{"PATH"}, StopGrace: time.Second},
				Environ: []string{"PATH=" + filepath.Dir(node) + ":/usr/bin:/bin"},
				Hooks:   Hooks{Spawn: evs.add, Exit: func(ev ExitEvent) { exits <- ev }}, Share: "per-session"}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			conn, err := up.Connect(ctx, mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil), ConnectOptions{})
			if c.want == "" {
				if err != nil {
					t.Fatalf("an untouched script was refused: %v", err)
				}
				conn.Close()
				if got := evs.all(); len(got) != 1 || got[0].Refused || got[0].Class != ClassSpawnMeasured {
					t.Fatalf("spawn events %+v", got)
				}
				return
			}
			if err == nil {
				conn.Close()
				_, ran := os.Stat(mark)
				t.Fatalf("a script changed after the start connected (%d spawn events); unmeasured code ran: %v", len(evs.all()), ran == nil)
			}
			var se *SpawnError
			if !errors.As(err, &se) || !errors.Is(err, ErrPinMismatch) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "checked once the child answered the MCP handshake") {
				t.Fatalf("err = %v, want a SpawnError saying %q", err, c.want)
			}
			got := evs.all()
			if len(got) != 2 || got[0].Refused || !got[1].Refused || got[1].PID == 0 || got[1].PID != got[0].PID || !strings.Contains(got[1].Reason, c.want) {
				t.Fatalf("spawn events %+v, want started then refused, with one pid", got)
			}
			if ev := exitEvent(t, exits); !strings.Contains(ev.Fault, c.want) {
				t.Fatalf("exit event %+v, want its fault to say why", ev)
			}
		})
	}
}

// TestTargetChangedAfterMeasureIsRefused: a --target (the script an
// interpreter reads, or the package tree holding it) is read by the child
// by path, after the gateway measured it. A file target changed between
// its digest and the start gets the spawn refused at once; a file or tree
// target changed before the child answered the MCP handshake (a file
// written in place, renamed over or added, a file target moved) gets the
// child stopped, the refusal recorded with its pid and the connection
// refused; an untouched target connects.
func TestTargetChangedAfterMeasureIsRefused(t *testing.T) {
	sh, err := digest.ResolveCommand("sh", os.Getenv("PATH"))
	if err != nil {
		t.Fatal(err)
	}
	f, shFilePin, err := digest.OpenFile(sh)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	server := answerInitialize + "cat >/dev/null\n"
	for _, c := range []struct {
		name    string
		tree    bool
		before  bool // change before exec, else after the start
		atOnce  bool // refused by Spawn, before a child is recorded started
		viaLink bool // the script is dir/cur/server.sh, cur a symlink to a
		change  func(t *testing.T, dir, script string)
		want    string
	}{
		{name: "file untouched"},
		{name: "tree untouched", tree: true},
		{name: "file written before exec", before: true, atOnce: true, want: "measure target",
			change: func(t *testing.T, dir, script string) { appendTo(t, script, "# more\n") }},
		// A path component, a symlink, re-pointed at a directory holding
		// another server.sh: the measured file is untouched, but the path
		// the child reads names another.
		{name: "file behind a re-pointed symlink", viaLink: true, want: "is no longer the file measured at that path",
			change: func(t *testing.T, dir, script string) {
				os.Mkdir(filepath.Join(dir, "b"), 0o755)
				os.WriteFile(filepath.Join(dir, "b", "server.sh"), []byte(server+"# other bytes\n"), 0o644)
				if err := os.Symlink("b", filepath.Join(dir, "cur.new")); err != nil {
					t.Error(err)
				}
				if err := os.Rename(filepath.Join(dir, "cur.new"), filepath.Join(dir, "cur")); err != nil {
					t.Error(err)
				}
			}},
		{name: "file renamed over after start", want: "was removed or replaced (renamed over)",
			change: func(t *testing.T, dir, script string) { renameOver(t, script, server) }},
		{name: "tree file written before exec", tree: true, before: true, want: "server.sh",
			change: func(t *testing.T, dir, script string) { appendTo(t, script, "# more\n") }},
		{name: "tree file written after start", tree: true, want: "server.sh",
			change: func(t *testing.T, dir, script string) { appendTo(t, script, "# more\n") }},
		{name: "tree file renamed over after start", tree: true, want: "server.sh",
			change: func(t *testing.T, dir, script string) { renameOver(t, script, server) }},
		// Same length, its mtime set back: only the change time shows it.
		{name: "tree file rewritten keeping its size and mtime", tree: true, want: "a.js",
			change: func(t *testing.T, dir, script string) {
				p := filepath.Join(dir, "lib", "a.js")
				st, err := os.Stat(p)
				if err != nil {
					t.Error(err)
					return
				}
				os.WriteFile(p, []byte("b"), 0o644)
				if err := os.Chtimes(p, st.ModTime(), st.ModTime()); err != nil {
					t.Error(err)
				}
			}},
		{name: "tree file added after start", tree: true, want: "lib",
			change: func(t *testing.T, dir, script string) {
				os.WriteFile(filepath.Join(dir, "lib", "extra.js"), []byte("x"), 0o644)
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			script := filepath.Join(dir, "server.sh")
			if c.viaLink {
				if err := os.Mkdir(filepath.Join(dir, "a"), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink("a", filepath.Join(dir, "cur")); err != nil {
					t.Fatal(err)
				}
				script = filepath.Join(dir, "cur", "server.sh")
			}
			if err := os.WriteFile(script, []byte(server), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(filepath.Join(dir, "lib"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "lib", "a.js"), []byte("a"), 0o644); err != nil {
				t.Fatal(err)
			}
			target := script
			if c.tree {
				target = dir
			}
			var pin digest.Digest
			if c.tree {
				pin, err = digest.Tree(context.Background(), dir, digest.TreeOptions{})
			} else {
				var f *os.File
				f, pin, err = digest.OpenFile(script)
				f.Close()
			}
			if err != nil {
				t.Fatal(err)
			}
			hook := func() {
				if c.change != nil {
					time.Sleep(20 * time.Millisecond) // a visible change of the times
					c.change(t, dir, script)
				}
			}
			if c.before {
				testHookBeforeExec = func(string) { hook() }
			} else {
				testHookAfterSpawn = func(*Child) { hook() }
			}
			t.Cleanup(func() { testHookBeforeExec, testHookAfterSpawn = nil, nil })
			var evs spawnEvents
			up := &Stdio{Spec: StdioSpec{Name: "s", Command: sh, Args: []string{script}, Pin: shFilePin, MeasurePath: target, MeasurePin: pin, StopGrace: time.Second},
				Environ: os.Environ(), Hooks: Hooks{Spawn: evs.add}, Share: "per-session"}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			conn, err := up.Connect(ctx, mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil), ConnectOptions{})
			if c.want == "" {
				if err != nil {
					t.Fatalf("an untouched target was refused: %v", err)
				}
				conn.Close()
				return
			}
			if err == nil {
				conn.Close()
				t.Fatalf("a target changed after its measurement connected (%d spawn events)", len(evs.all()))
			}
			if !errors.Is(err, ErrPinMismatch) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "the child was stopped") {
				t.Fatalf("err = %v, want a refusal naming %q", err, c.want)
			}
			got := evs.all()
			if last := got[len(got)-1]; !last.Refused || last.PID == 0 || !strings.Contains(last.Reason, c.want) {
				t.Fatalf("spawn events %+v, want the last a refusal of the child that ran", got)
			}
			if c.atOnce {
				// Refused when the child started, not once it answered: no
				// spawn record says it started.
				if len(got) != 1 || strings.Contains(err.Error(), "checked once the child answered") {
					t.Fatalf("err = %v, spawn events %+v: want the spawn refused at once, its only record the refusal", err, got)
				}
			}
		})
	}
}

func appendTo(t *testing.T, p, s string) {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Error(err)
		return
	}
	f.WriteString(s)
	f.Close()
}

func renameOver(t *testing.T, p, body string) {
	if err := os.WriteFile(p+".new", []byte(body), 0o644); err != nil {
		t.Error(err)
	}
	if err := os.Rename(p+".new", p); err != nil {
		t.Error(err)
	}
}
