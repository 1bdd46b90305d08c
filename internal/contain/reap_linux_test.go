package contain

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestOrphansAreReapedAndOwnChildrenAreNot: the gateway, a child
// subreaper, reaps the orphan an own child leaves behind once it exits,
// and leaves the own child's exit to its own waiter (exit status 7 seen by
// cmd.Wait, not stolen by the reaper), and neither needs a scan of /proc:
// each SIGCHLD is answered by looking at the exited children
// (waitid WNOWAIT), not by reading every process's stat file (the 5 s
// tick's scan, which would reap them too, finds none).
func TestOrphansAreReapedAndOwnChildrenAreNot(t *testing.T) {
	subreaper(t)
	scans0 := scanReaped.Load()
	for i := range 5 {
		// The own child starts a grandchild in its process group and
		// exits at once: the grandchild, an orphan, comes back to this
		// process and exits 100 ms later.
		cmd := exec.Command("/bin/sh", "-c", "sleep 0.1 & echo $!; exit 7")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		release := Starting()
		err = cmd.Start()
		if err == nil {
			OwnLocked(cmd.Process.Pid)
		}
		release()
		if err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(out).ReadString('\n')
		if err != nil {
			t.Fatalf("round %d: read the grandchild's pid: %v", i, err)
		}
		orphan, err := strconv.Atoi(strings.TrimSpace(line))
		if err != nil {
			t.Fatalf("round %d: grandchild pid %q: %v", i, line, err)
		}
		err = cmd.Wait()
		Disown(cmd.Process.Pid)
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 7 {
			t.Fatalf("round %d: the own child's waiter got %v, want exit status 7 (reaped by someone else?)", i, err)
		}
		deadline := time.Now().Add(60 * time.Second)
		for {
			_, err := os.Stat("/proc/" + strconv.Itoa(orphan))
			if errors.Is(err, os.ErrNotExist) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: orphan %d not reaped after 60 s", i, orphan)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if n := scanReaped.Load() - scans0; n != 0 {
		t.Errorf("%d orphans were found by a scan of /proc, want 0: each should have been reaped as its SIGCHLD came", n)
	}
}

// BenchmarkOrphans is one scan of /proc for the gateway's orphans (what
// KillOrphans does per round, and reapOrphans when a helper's zombie is
// first in line): its cost grows with the processes on the machine.
func BenchmarkOrphans(b *testing.B) {
	mu.Lock()
	defer mu.Unlock()
	for b.Loop() {
		orphans()
	}
}

// subreaper makes this process a child subreaper reaping its orphans, as
// Setup does without the cgroups.
func subreaper(t *testing.T) {
	mu.Lock()
	defer mu.Unlock()
	if !setup {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			t.Skipf("PR_SET_CHILD_SUBREAPER: %v", err)
		}
		setup = true
		info = Info{Mode: ModeSubreaper}
		go reapOrphans()
	}
}

// TestKillOrphansEndsWhatAChildLeftRunning: without a cgroup, the orphan
// an own child left running (a sleeper in the child's group, its parent
// gone) is found among every process on the machine by KillOrphans, killed
// and reaped; the gateway's own children are not touched.
func TestKillOrphansEndsWhatAChildLeftRunning(t *testing.T) {
	subreaper(t)
	keep := exec.Command("/bin/sh", "-c", "sleep 60")
	keep.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd := exec.Command("/bin/sh", "-c", "sleep 60 & echo $!")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	release := Starting()
	err = keep.Start()
	if err == nil {
		OwnLocked(keep.Process.Pid)
		if err = cmd.Start(); err == nil {
			OwnLocked(cmd.Process.Pid)
		}
	}
	release()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		keep.Process.Kill()
		keep.Wait()
		Disown(keep.Process.Pid)
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("read the grandchild's pid: %v", err)
	}
	orphan, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("grandchild pid %q: %v", line, err)
	}
	cmd.Wait()
	Disown(cmd.Process.Pid)
	if n := KillOrphans(nil); n < 1 {
		t.Fatalf("KillOrphans killed %d, want the orphan %d", n, orphan)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := os.Stat("/proc/" + strconv.Itoa(orphan)); errors.Is(err, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("orphan %d still there 60 s after KillOrphans", orphan)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := syscall.Kill(keep.Process.Pid, 0); err != nil {
		t.Fatalf("an own child was touched: %v", err)
	}
}
