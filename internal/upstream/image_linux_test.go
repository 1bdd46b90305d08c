package upstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/confidential-mcp/cmcp/internal/upstream/execimage"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

const imageChildEnv = "CMCP_UPSTREAM_IMAGE_TEST_CHILD"

// A copy of the test binary run with imageChildEnv=selfdigest reports what
// it was executed from and the digest of those bytes, then exits 5.
func init() {
	if os.Getenv(imageChildEnv) != "selfdigest" {
		return
	}
	link, _ := os.Readlink("/proc/self/exe")
	f, d, err := digest.OpenFile("/proc/self/exe")
	if err == nil {
		f.Close()
	}
	fmt.Fprintf(os.Stderr, "exe=%s digest=%s err=%v\n", link, d, err)
	os.Exit(5)
}

// waitExit returns the child's exit event.
func waitExit(t *testing.T, exits <-chan ExitEvent) ExitEvent {
	t.Helper()
	select {
	case ev := <-exits:
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("child did not exit")
		return ExitEvent{}
	}
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Sys().(*syscall.Stat_t).Ino
}

// TestSpawnScriptRewrittenInPlaceRunsMeasuredBytes: a descriptor open on a
// script does not freeze its contents, and the shell reads a long script
// as it goes. The file is rewritten in place (same inode) while the child
// sleeps, before the shell has read the last lines; the child must still
// run the measured lines, because it runs a sealed copy of them.
func TestSpawnScriptRewrittenInPlaceRunsMeasuredBytes(t *testing.T) {
	head := "#!/bin/sh\nsleep 1\n"
	pad := "#" + strings.Repeat("p", 20000) + "\n" // beyond the shell's first read
	p, pin := writeScript(t, head+pad+"echo ORIGINAL >&2\nexit 4\n")
	logs := &syncBuffer{}
	exits := make(chan ExitEvent, 1)
	var spawned SpawnEvent
	hooks := Hooks{Log: slog.New(slog.NewTextHandler(logs, nil)), Exit: func(ev ExitEvent) { exits <- ev },
		Spawn: func(ev SpawnEvent) error { spawned = ev; return nil }}
	c, err := Spawn(context.Background(), StdioSpec{Name: "s", Command: p, Pin: pin, InterpreterPin: shPin(t), Sealed: true, StopGrace: time.Second}, os.Environ(), hooks, "per-session")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	before := inode(t, p)
	time.Sleep(200 * time.Millisecond)
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("echo TAMPERED >&2\nexit 9\n"), int64(len(head+pad))); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if inode(t, p) != before {
		t.Fatal("the file was replaced, not rewritten in place")
	}
	ev := waitExit(t, exits)
	c.Stop()
	if ev.ExitCode != 4 || !strings.Contains(logs.String(), `line=ORIGINAL`) || strings.Contains(logs.String(), "TAMPERED") {
		t.Fatalf("the child ran bytes that do not match pin %s: exit %d, stderr:\n%s", pin, ev.ExitCode, logs.String())
	}
	if spawned.Class != ClassSpawnMeasured || !spawned.Digest.Equal(pin) {
		t.Fatalf("spawn event %+v", spawned)
	}
}

// TestSpawnELFRewrittenBeforeExecRunsMeasuredBytes: an ELF executable is
// rewritten in place between its measurement and the exec. The child hashes
// the bytes it was executed from (/proc/self/exe): they must be the pinned
// bytes, in a sealed memfd, not the file's new contents.
func TestSpawnELFRewrittenBeforeExecRunsMeasuredBytes(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "server")
	copyFile(t, exe, p)
	pin := fileDigest(t, p)
	testHookBeforeExec = func(path string) {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Error(err)
			return
		}
		f.Write([]byte("TAMPERED"))
		f.Close()
	}
	t.Cleanup(func() { testHookBeforeExec = nil })
	logs := &syncBuffer{}
	exits := make(chan ExitEvent, 1)
	var spawned SpawnEvent
	hooks := Hooks{Log: slog.New(slog.NewTextHandler(logs, nil)), Exit: func(ev ExitEvent) { exits <- ev },
		Spawn: func(ev SpawnEvent) error { spawned = ev; return nil }}
	spec := StdioSpec{Name: "s", Command: p, Pin: pin, Sealed: true, Env: map[string]string{imageChildEnv: "selfdigest"}, StopGrace: time.Second}
	c, err := Spawn(context.Background(), spec, os.Environ(), hooks, "per-session")
	if err != nil {
		t.Fatal(err)
	}
	ev := waitExit(t, exits)
	c.Stop()
	if fileDigest(t, p).Equal(pin) {
		t.Fatal("the hook did not change the file")
	}
	want := fmt.Sprintf(`line="exe=/memfd:cmcp:server (deleted) digest=%s err=<nil>"`, pin)
	if ev.ExitCode != 5 || !strings.Contains(logs.String(), want) {
		t.Fatalf("exit %d; want stderr %s, got:\n%s", ev.ExitCode, want, logs.String())
	}
	if !spawned.Digest.Equal(pin) || spawned.Class != ClassSpawnMeasured {
		t.Fatalf("spawn event %+v", spawned)
	}
}

// TestSpawnReusesTheSealedCopy: two spawns of an unchanged file execute one
// sealed memfd (the same inode), which even the child cannot write; a file
// changed in place is measured again: refused under the old pin, and run
// from a new sealed copy under its new pin.
func TestSpawnReusesTheSealedCopy(t *testing.T) {
	p, pin := writeScript(t, "#!/bin/sh\n# first\nread x\n")
	var events []SpawnEvent
	hooks := Hooks{Spawn: func(ev SpawnEvent) error { events = append(events, ev); return nil }}
	spawn := func(pin digest.Digest) (*Child, error) {
		c, err := Spawn(context.Background(), StdioSpec{Name: "s", Command: p, Pin: pin, InterpreterPin: shPin(t), Sealed: true, StopGrace: time.Second}, os.Environ(), hooks, "per-session")
		if err == nil {
			t.Cleanup(func() { c.Stop() })
		}
		return c, err
	}
	fd3 := func(c *Child) string { return fmt.Sprintf("/proc/%d/fd/3", c.PID()) }

	c1, err := spawn(pin)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := spawn(pin)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := inode(t, fd3(c1)), inode(t, fd3(c2)); a != b {
		t.Fatalf("two spawns of one unchanged file use two copies (inodes %d, %d)", a, b)
	}
	if link, _ := os.Readlink(fd3(c1)); link != "/memfd:cmcp:server.sh (deleted)" {
		t.Fatalf("child's fd 3 is %q, want the sealed memfd", link)
	}
	w, err := os.OpenFile(fd3(c1), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = w.WriteAt([]byte("#!/bin/sh\nexit 9\n"), 0)
	w.Close()
	if !errors.Is(err, syscall.EPERM) {
		t.Fatalf("write to the executed copy: %v, want EPERM (sealed)", err)
	}

	// Rewritten in place: same inode on disk, new bytes.
	if err := os.WriteFile(p, []byte("#!/bin/sh\n# second\nread x\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	newPin := fileDigest(t, p)
	if _, err := spawn(pin); !errors.Is(err, ErrPinMismatch) {
		t.Fatalf("spawn of the changed file under the old pin: %v, want refused", err)
	}
	if ev := events[len(events)-1]; !ev.Refused || !ev.Digest.Equal(newPin) {
		t.Fatalf("refusal event %+v", ev)
	}
	c3, err := spawn(newPin)
	if err != nil {
		t.Fatal(err)
	}
	if inode(t, fd3(c3)) == inode(t, fd3(c1)) {
		t.Fatal("the changed file ran from the old copy")
	}
	b, err := os.ReadFile(fd3(c3))
	if err != nil || !digest.Bytes(b).Equal(newPin) {
		t.Fatalf("the new copy holds %q (%v)", b, err)
	}
	if kept, ok := execimage.Kept(p); !ok || !kept.Equal(newPin) {
		t.Fatalf("kept copy of %s: %v (kept %v), want one with digest %s", p, kept, ok, newPin)
	}
}

// TestSpawnRefusedWithoutSealedCopy: when the kernel will not make the
// sealed copy, the spawn is refused with the reason and what to do, and
// the file is never executed instead.
func TestSpawnRefusedWithoutSealedCopy(t *testing.T) {
	for _, tc := range []struct {
		name   string
		create func(string, int) (int, error)
		ok     bool
		msg    string
	}{
		{"noexec enforced", func(string, int) (int, error) { return -1, unix.EACCES }, false, "vm.memfd_noexec"},
		{"no memfd_create", func(string, int) (int, error) { return -1, unix.ENOSYS }, false, "seccomp"},
		{"kernel before MFD_EXEC", func(name string, flags int) (int, error) {
			if flags&unix.MFD_EXEC != 0 {
				return -1, unix.EINVAL
			}
			return unix.MemfdCreate(name, flags)
		}, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			marker := filepath.Join(t.TempDir(), "ran")
			p, pin := writeScript(t, "#!/bin/sh\ntouch "+marker+"\n")
			execimage.MemfdCreate = tc.create
			t.Cleanup(func() { execimage.MemfdCreate = unix.MemfdCreate })
			var ev SpawnEvent
			exits := make(chan ExitEvent, 1)
			hooks := Hooks{Spawn: func(e SpawnEvent) error { ev = e; return nil }, Exit: func(e ExitEvent) { exits <- e }}
			c, err := Spawn(context.Background(), StdioSpec{Name: "s", Command: p, Pin: pin, InterpreterPin: shPin(t), Sealed: true}, os.Environ(), hooks, "per-session")
			if tc.ok {
				if err != nil {
					t.Fatal(err)
				}
				waitExit(t, exits)
				c.Stop()
				if _, err := os.Stat(marker); err != nil {
					t.Fatalf("the script did not run: %v", err)
				}
				return
			}
			if err == nil {
				c.Stop()
				t.Fatal("spawned without a sealed copy")
			}
			if !ev.Refused || !strings.Contains(err.Error(), "cannot make a sealed copy of "+p) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("err = %v; event %+v", err, ev)
			}
			if _, err := os.Stat(marker); err == nil {
				t.Fatal("the file ran although the spawn was refused")
			}
		})
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}

func fileDigest(t *testing.T, path string) digest.Digest {
	t.Helper()
	f, d, err := digest.OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	return d
}
