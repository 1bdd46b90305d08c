package upstream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/confidential-mcp/cmcp/internal/upstream/execimage"
)

// selfDigestSpawner spawns, sealed and pinned, a copy of the test binary
// that reports the digest of the bytes it was executed from (the
// selfdigest child of image_linux_test.go) and exits 5.
type selfDigestSpawner struct {
	t      *testing.T
	path   string
	spec   StdioSpec
	events []SpawnEvent
}

func newSelfDigestSpawner(t *testing.T) *selfDigestSpawner {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "server")
	copyFile(t, exe, p)
	pin := fileDigest(t, p)
	return &selfDigestSpawner{t: t, path: p, spec: StdioSpec{Name: "s", Command: p, Pin: pin, Sealed: true,
		Env: map[string]string{imageChildEnv: "selfdigest"}, StopGrace: time.Second}}
}

// spawn runs one child to its end and returns what it reported on stderr,
// or the refusal.
func (s *selfDigestSpawner) spawn() (string, error) {
	s.t.Helper()
	logs := &syncBuffer{}
	exits := make(chan ExitEvent, 1)
	hooks := Hooks{Log: slog.New(slog.NewTextHandler(logs, nil)), Exit: func(ev ExitEvent) { exits <- ev },
		Spawn: func(ev SpawnEvent) error { s.events = append(s.events, ev); return nil }}
	c, err := Spawn(context.Background(), s.spec, os.Environ(), hooks, "per-session")
	if err != nil {
		return "", err
	}
	ev := waitExit(s.t, exits)
	c.Stop()
	if ev.ExitCode != 5 {
		s.t.Fatalf("child exited %d, want 5; stderr:\n%s", ev.ExitCode, logs.String())
	}
	return logs.String(), nil
}

// ranPinned checks that the child ran the pinned bytes from the sealed copy.
func (s *selfDigestSpawner) ranPinned(stderr string) {
	s.t.Helper()
	want := fmt.Sprintf(`line="exe=/memfd:cmcp:server (deleted) digest=%s err=<nil>"`, s.spec.Pin)
	if !strings.Contains(stderr, want) {
		s.t.Fatalf("want stderr %s, got:\n%s", want, stderr)
	}
}

// TestSealedSpawnMeasuresOnceAndRunsTheCopyAfterTheFileIsReplaced: with
// sealed: true an unchanged file is measured at its first spawn only; later
// spawns stat it and execute the kept sealed copy without reading or
// hashing the file. A file replaced at its path after that check (renamed
// over with other bytes, just before the exec) changes nothing the child
// runs: it runs the measured copy. The next spawn sees the file changed,
// measures it again and refuses it under the pin, naming the new digest.
func TestSealedSpawnMeasuresOnceAndRunsTheCopyAfterTheFileIsReplaced(t *testing.T) {
	execimage.StampMargin = 0 // the test's file was written just now
	t.Cleanup(func() { execimage.StampMargin = 2 * time.Second })
	s := newSelfDigestSpawner(t)

	n0 := execimage.Measures.Load()
	out, err := s.spawn()
	if err != nil {
		t.Fatal(err)
	}
	s.ranPinned(out)
	if got := execimage.Measures.Load() - n0; got != 1 {
		t.Fatalf("first spawn measured the file %d times, want 1", got)
	}
	out, err = s.spawn()
	if err != nil {
		t.Fatal(err)
	}
	s.ranPinned(out)
	if got := execimage.Measures.Load() - n0; got != 1 {
		t.Fatalf("a second spawn of the unchanged file measured it again (%d measurements)", got)
	}

	// Replaced after the spawn's check, before its exec.
	tampered := filepath.Join(filepath.Dir(s.path), "tampered")
	copyFile(t, s.path, tampered)
	f, err := os.OpenFile(tampered, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("TAMPERED"))
	f.Close()
	newDigest := fileDigest(t, tampered)
	testHookBeforeExec = func(path string) {
		if err := os.Rename(tampered, path); err != nil {
			t.Error(err)
		}
	}
	out, err = s.spawn()
	testHookBeforeExec = nil
	if err != nil {
		t.Fatal(err)
	}
	s.ranPinned(out)
	if !fileDigest(t, s.path).Equal(newDigest) {
		t.Fatal("the file was not replaced")
	}
	if ev := s.events[len(s.events)-1]; ev.Refused || !ev.Digest.Equal(s.spec.Pin) || ev.Class != ClassSpawnMeasured {
		t.Fatalf("spawn event %+v", ev)
	}

	_, err = s.spawn()
	if !errors.Is(err, ErrPinMismatch) {
		t.Fatalf("spawn of the replaced file: %v, want refused under the pin", err)
	}
	if ev := s.events[len(s.events)-1]; !ev.Refused || !ev.Digest.Equal(newDigest) {
		t.Fatalf("refusal event %+v, want one naming digest %s", ev, newDigest)
	}
	if got := execimage.Measures.Load() - n0; got != 2 {
		t.Fatalf("%d measurements, want 2 (the first spawn and the one after the change)", got)
	}
}

// TestSealedSpawnNoticesAWriteThatRestoresSizeAndTimes: the stat that stands
// for an unchanged file covers its status change time, which no one can set
// back. The file is rewritten in place with bytes of the same size and its
// modification time restored: the next spawn measures it again and refuses
// it under the pin.
func TestSealedSpawnNoticesAWriteThatRestoresSizeAndTimes(t *testing.T) {
	execimage.StampMargin = 0
	t.Cleanup(func() { execimage.StampMargin = 2 * time.Second })
	s := newSelfDigestSpawner(t)
	out, err := s.spawn()
	if err != nil {
		t.Fatal(err)
	}
	s.ranPinned(out)

	st, err := os.Stat(s.path)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // past the coarse clock tick of the first measurement
	f, err := os.OpenFile(s.path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("XXXXXXXX"), st.Size()-8); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Chtimes(s.path, time.Time{}, st.ModTime()); err != nil {
		t.Fatal(err)
	}
	if st2, err := os.Stat(s.path); err != nil || st2.Size() != st.Size() || !st2.ModTime().Equal(st.ModTime()) {
		t.Fatalf("size and modification time not restored: %v", err)
	}
	n0 := execimage.Measures.Load()
	_, err = s.spawn()
	if !errors.Is(err, ErrPinMismatch) {
		t.Fatalf("spawn of the rewritten file: %v, want refused under the pin", err)
	}
	if execimage.Measures.Load() == n0 {
		t.Fatal("the rewritten file was not measured again")
	}
}

// TestSealedSpawnMeasuresARecentlyChangedFileAgain: a file that changed
// less than execimage.StampMargin before it was measured may change again within the
// same tick of its file system's clock without its stat moving, so its
// stat does not stand for its bytes: every spawn measures it again.
func TestSealedSpawnMeasuresARecentlyChangedFileAgain(t *testing.T) {
	execimage.StampMargin = time.Hour
	t.Cleanup(func() { execimage.StampMargin = 2 * time.Second })
	s := newSelfDigestSpawner(t)
	n0 := execimage.Measures.Load()
	for range 2 {
		out, err := s.spawn()
		if err != nil {
			t.Fatal(err)
		}
		s.ranPinned(out)
	}
	if got := execimage.Measures.Load() - n0; got != 2 {
		t.Fatalf("%d measurements of a file changed within the margin, want 2", got)
	}
}

// TestChildSaysWhenItsFileChangedAndWhoItServes: a child made ahead of
// demand (a warm spare) reports the file it was measured from as changed
// once the file at its path is replaced, and, once assigned to a session,
// names that session in its exit record.
func TestChildSaysWhenItsFileChangedAndWhoItServes(t *testing.T) {
	for _, sealed := range []bool{false, true} {
		t.Run(fmt.Sprintf("sealed=%v", sealed), func(t *testing.T) {
			p, pin := writeScript(t, "#!/bin/sh\nread x\n")
			exits := make(chan ExitEvent, 1)
			c, err := Spawn(context.Background(), StdioSpec{Name: "s", Command: p, Pin: pin, InterpreterPin: shPin(t), Sealed: sealed, StopGrace: time.Second},
				os.Environ(), Hooks{Exit: func(ev ExitEvent) { exits <- ev }}, "per-session")
			if err != nil {
				t.Fatal(err)
			}
			defer c.Stop()
			if why := c.changed(); why != "" {
				t.Fatalf("unchanged file reported changed: %s", why)
			}
			repl := p + ".new"
			if err := os.WriteFile(repl, []byte("#!/bin/sh\nread x\n"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(repl, p); err != nil {
				t.Fatal(err)
			}
			if why := c.changed(); !strings.Contains(why, p+" changed on disk") {
				t.Fatalf("replaced file: changed() = %q", why)
			}
			c.assign("sess-42")
			c.Stop()
			if ev := waitExit(t, exits); ev.Session != "sess-42" {
				t.Fatalf("exit event names session %q, want sess-42", ev.Session)
			}
		})
	}
}
