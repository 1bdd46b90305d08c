package cli

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// openPTY opens a pseudo-terminal pair (Linux /dev/ptmx): what a person's
// terminal is to cmcp.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open /dev/ptmx: %v", err)
	}
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlock pty: %v", err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("pty number: %v", err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open pty slave: %v", err)
	}
	t.Cleanup(func() { s.Close(); m.Close() })
	return m, s
}

// TestSpawnDigestProgressOnTerminal: measuring a tree shows its progress
// (files and bytes so far) on stderr when stderr is a terminal, and clears
// the line at the end; on a pipe, and with --output json, nothing but the
// result is written.
func TestSpawnDigestProgressOnTerminal(t *testing.T) {
	dir := t.TempDir()
	pkg := filepath.Join(dir, "pkg")
	for i := range 200 {
		sub := filepath.Join(pkg, fmt.Sprintf("d%02d", i%20))
		os.MkdirAll(sub, 0o755)
		if err := os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%03d.js", i)), bytes.Repeat([]byte("x"), 4096), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"spawn-digest", "--target", pkg, "--", exe}

	master, slave := openPTY(t)
	got := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(master) // ends with EIO once the slave is closed
		got <- string(b)
	}()
	var out bytes.Buffer
	code := mainWithEnv(args, strings.NewReader(""), &out, slave, []string{"TERM=xterm-256color", "PATH=" + os.Getenv("PATH")})
	slave.Close()
	tty := <-got
	if code != 0 {
		t.Fatalf("exit %d; terminal:\n%q", code, tty)
	}
	if !strings.Contains(tty, "measuring "+pkg+": ") || !strings.Contains(tty, " files, ") {
		t.Fatalf("no tree progress on the terminal:\n%q", tty)
	}
	if !strings.HasSuffix(tty, "\r\x1b[K") {
		t.Fatalf("the progress line is not cleared at the end:\n%q", tty)
	}
	if !strings.Contains(out.String(), "tree: 200 files") {
		t.Fatalf("stdout:\n%s", out.String())
	}

	// --output json on a terminal: no progress, the terminal stays clean.
	master, slave = openPTY(t)
	go func() {
		b, _ := io.ReadAll(master)
		got <- string(b)
	}()
	out.Reset()
	code = mainWithEnv(append([]string{"--output", "json"}, args...), strings.NewReader(""), &out, slave, []string{"TERM=xterm-256color"})
	slave.Close()
	if tty := <-got; code != 0 || tty != "" {
		t.Fatalf("--output json on a terminal: exit %d, terminal %q", code, tty)
	}

	// A pipe (a buffer here) gets no progress; neither does --output json.
	for _, extra := range [][]string{nil, {"--output", "json"}} {
		var o, e bytes.Buffer
		if code := mainWithEnv(append(append([]string{}, extra...), args...), strings.NewReader(""), &o, &e, []string{"TERM=xterm-256color"}); code != 0 || e.Len() != 0 {
			t.Fatalf("%v: exit %d, stderr %q", extra, code, e.String())
		}
	}
}

// TestVerifyChainProgressOnTerminal: verify-chain shows a progress bar (bytes
// verified of the log's total) on a terminal and clears it before the
// summary; a pipe gets none.
func TestVerifyChainProgressOnTerminal(t *testing.T) {
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	l := writeTestLog(t, filepath.Join(t.TempDir(), "log"), key, 300)

	master, slave := openPTY(t)
	got := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(master)
		got <- string(b)
	}()
	var out bytes.Buffer
	code := mainWithEnv([]string{"verify-chain", l.dir, "--key", l.vkey}, strings.NewReader(""), &out, slave, []string{"TERM=xterm-256color"})
	slave.Close()
	tty := <-got
	if code != 0 {
		t.Fatalf("exit %d; terminal %q; stdout:\n%s", code, tty, out.String())
	}
	if !strings.Contains(tty, "\rverifying ") || !strings.Contains(tty, "%)") || !strings.Contains(tty, "\r\x1b[K") {
		t.Fatalf("no progress bar on the terminal:\n%q", tty)
	}
	if !strings.Contains(out.String(), "VERIFIED") {
		t.Fatalf("stdout:\n%s", out.String())
	}
	var o, e bytes.Buffer
	if code := mainWithEnv([]string{"verify-chain", l.dir, "--key", l.vkey}, strings.NewReader(""), &o, &e, []string{"TERM=xterm-256color"}); code != 0 || strings.Contains(e.String(), "verifying") {
		t.Fatalf("pipe: exit %d, stderr %q", code, e.String())
	}
}
