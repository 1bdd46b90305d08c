package upstream

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/confidential-mcp/cmcp/internal/gwtest"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// syncBuffer collects a child's stderr safely (gwtest.LockedWriter).
type syncBuffer = gwtest.LockedWriter

// TestSpawnExecutesTheMeasuredDescriptor: the child runs the bytes that were
// measured, not whatever the path holds later. A real /bin/sh script is
// pinned and spawned; once it runs, the test replaces the file at its path
// with another script. The child then reads its own program through $0: it
// must be the measured descriptor (/proc/self/fd/3), whose bytes are the
// pinned ones; had the gateway executed the path, $0 would be the path and
// the replacement would be read.
func TestSpawnExecutesTheMeasuredDescriptor(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "server.sh")
	go1 := filepath.Join(dir, "go")
	const original = "#!/bin/sh\n# MEASURED-ORIGINAL\nwhile [ ! -e \"$GO_FILE\" ]; do sleep 0.02; done\necho \"argv0=$0\" >&2\necho \"original=$(grep -c MEASURED-ORIGINA[L] \"$0\")\" >&2\necho \"evil=$(grep -c EVIL-REPLACEMEN[T] \"$0\")\" >&2\nexit 4\n"
	if err := os.WriteFile(p, []byte(original), 0o755); err != nil {
		t.Fatal(err)
	}
	f, pin, err := digest.OpenFile(p)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()

	logs := &syncBuffer{}
	exits := make(chan ExitEvent, 1)
	hooks := Hooks{Exit: func(ev ExitEvent) { exits <- ev }, Log: slog.New(slog.NewTextHandler(logs, nil))}
	env := append(os.Environ(), "GO_FILE="+go1)
	c, err := Spawn(context.Background(), StdioSpec{Name: "s", Command: p, Pin: pin, InterpreterPin: shPin(t), EnvAllow: []string{"PATH", "GO_FILE"}}, env, hooks, "per-session")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()

	// The child is running: replace the file at the path (a new inode, as an
	// attacker with write access to the directory would).
	evil := filepath.Join(dir, "evil.sh")
	if err := os.WriteFile(evil, []byte("#!/bin/sh\n# EVIL-REPLACEMENT\nexit 9\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(evil, p); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(go1, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-exits:
		if ev.ExitCode != 4 {
			t.Fatalf("child exit %+v (want 4, the measured script's)", ev)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("child did not exit")
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), "evil=") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	out := logs.String()
	if !strings.Contains(out, `line="argv0=/proc/self/fd/3"`) {
		t.Fatalf("the child was not executed through the measured descriptor:\n%s", out)
	}
	if !strings.Contains(out, `line="original=1"`) || !strings.Contains(out, `line="evil=0"`) {
		t.Fatalf("the child read other bytes than the measured ones:\n%s", out)
	}
}
