package gwtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"
)

// BuildChild builds the test upstream, the program internal/gwtest/child
// (RunChild), without the race detector and stripped, for the tests to
// spawn (SelfDigest names it and its pin) instead of the test binary
// itself. A -race binary costs about three times the CPU to start (its
// shadow memory, mostly in the kernel), and the gateway digests the
// binary before every spawn: the child is about 8 MB where the test
// package built without -race was 32 MB (and 40 MB with -race), and each
// harness spawns at least two upstreams. The code under test, which runs
// in the test process, keeps the race detector. TestMain calls it before
// m.Run and calls the returned cleanup after. A test binary built without
// -race, or a build that fails (no go command), leaves the test binary
// itself as the upstream, as before.
func BuildChild() (cleanup func()) {
	cleanup = func() {}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return cleanup
	}
	race, tags := false, ""
	for _, s := range bi.Settings {
		switch s.Key {
		case "-race":
			race = s.Value == "true"
		case "-tags":
			tags = s.Value
		}
	}
	if !race {
		return cleanup
	}
	gocmd, err := exec.LookPath("go") // go test puts its GOROOT/bin first on PATH
	if err != nil {
		fmt.Fprintf(os.Stderr, "gwtest: no go command (%v): the test upstream is the -race test binary itself\n", err)
		return cleanup
	}
	dir, err := os.MkdirTemp("", "cmcp-child-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "gwtest: %v: the test upstream is the -race test binary itself\n", err)
		return cleanup
	}
	cleanup = func() { os.RemoveAll(dir) }
	exe := filepath.Join(dir, "child")
	// Packages testing in parallel (go test -p) build one after the
	// other: the second finds the first's dependencies in the build cache.
	unlock := lockFile(filepath.Join(os.TempDir(), "cmcp-gwtest-build.lock"))
	out, err := exec.Command(gocmd, "build", "-tags="+tags, "-ldflags=-s -w", "-o", exe, childPackage).CombinedOutput()
	unlock()
	if err != nil {
		fmt.Fprintf(os.Stderr, "gwtest: building the test upstream without -race failed (%v): the test upstream is the -race test binary itself\n%s", err, Clip(strings.TrimSpace(string(out)), 2000))
		return cleanup
	}
	child.exe = exe
	return cleanup
}

// childPackage is the test upstream's program.
const childPackage = "github.com/confidential-mcp/cmcp/internal/gwtest/child"

// child is the test upstream's binary BuildChild made ("": the test
// binary itself).
var child struct{ exe string }

// lockFile takes an exclusive lock on path (a no-op if it cannot).
func lockFile(path string) (unlock func()) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return func() {}
	}
	if syscall.Flock(int(f.Fd()), syscall.LOCK_EX) != nil {
		f.Close()
		return func() {}
	}
	return func() { f.Close() }
}
