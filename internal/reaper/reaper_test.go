//go:build linux

package reaper

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// gatewayEnv makes the test binary a stand-in gateway: it starts a child in
// its own process group, which starts a grandchild in the same group, has
// the reaper watch the group, prints the grandchild's pid and waits to be
// killed.
const gatewayEnv = "CMCP_REAPER_TEST_GATEWAY"

func TestMain(m *testing.M) {
	if os.Getenv(gatewayEnv) == "1" {
		child := exec.Command("/bin/sh", "-c", "sleep 300 & echo $!; wait")
		child.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		out, _ := child.StdoutPipe()
		if err := child.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if err := Watch(child.Process.Pid); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		line, _ := bufio.NewReader(out).ReadString('\n')
		fmt.Printf("GRANDCHILD %s", line)
		select {}
	}
	os.Exit(m.Run())
}

func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// A zombie (state Z) is dead; it waits for its new parent to reap it.
	f := strings.Fields(string(b))
	return len(f) > 2 && f[2] != "Z"
}

// TestGrandchildDiesWithAKilledGateway: the gateway is killed with SIGKILL;
// its child dies by its parent-death signal (not here: the stand-in sets
// none) and the grandchild, in the child's process group, is killed by the
// reaper.
func TestGrandchildDiesWithAKilledGateway(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	gw := exec.Command(exe)
	gw.Env = append(os.Environ(), gatewayEnv+"=1")
	out, _ := gw.StdoutPipe()
	gw.Stderr = os.Stderr
	if err := gw.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		gw.Process.Kill()
		t.Fatalf("stand-in gateway: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "GRANDCHILD ")))
	if err != nil || !alive(pid) {
		t.Fatalf("grandchild %q: %v", line, err)
	}
	gw.Process.Signal(syscall.SIGKILL)
	gw.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("grandchild %d outlived the gateway's SIGKILL", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestForgottenGroupIsLeftAlone: a group the gateway forgot (its members
// are gone, its number may be reused) is not signalled when the reaper
// ends; a group still registered is.
func TestForgottenGroupIsLeftAlone(t *testing.T) {
	kept, forgotten := sleeper(t), sleeper(t)
	r, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Add(kept.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if err := r.Add(forgotten.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if err := r.Remove(forgotten.Process.Pid); err != nil {
		t.Fatal(err)
	}
	r.Close()
	done := make(chan error, 1)
	go func() { done <- kept.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the registered group was not killed when the reaper's pipe ended")
	}
	time.Sleep(200 * time.Millisecond)
	if !alive(forgotten.Process.Pid) {
		t.Fatal("a forgotten group was killed")
	}
}

// TestReaperHoldsNoSecrets: the reaper's environment is only its marker.
func TestReaperHoldsNoSecrets(t *testing.T) {
	t.Setenv("CMCP_TEST_SECRET", "hunter2")
	r, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	pid := r.cmd.Process.Pid
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); strings.HasPrefix(string(b), "cmcp-reaper") {
			break // executed: the environment is the reaper's own
		}
		if time.Now().After(deadline) {
			t.Fatal("the reaper did not start")
		}
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Trim(string(b), "\x00"); got != env+"=1" {
		t.Fatalf("reaper environment %q", got)
	}
}

// TestKilledReaperIsReplaced: a reaper killed by someone is replaced at
// once, with the groups registered so far, and the gateway's end of its
// pipe is closed (no descriptor leaks per replacement).
func TestKilledReaperIsReplaced(t *testing.T) {
	c := sleeper(t)
	if err := Watch(c.Process.Pid); err != nil {
		t.Fatal(err)
	}
	defer Forget(c.Process.Pid)
	mu.Lock()
	first := cur
	mu.Unlock()
	first.cmd.Process.Kill()
	r := waitReplaced(first, 10*time.Second)
	if r == nil {
		t.Fatal("the killed reaper was not replaced")
	}
	if _, err := first.w.Stat(); err == nil {
		t.Fatalf("the killed reaper's pipe (fd %d) is still open", first.w.Fd())
	}
	// The new one has the group: closing it kills the group.
	r.Close()
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the replacement reaper did not have the registered group")
	}
}

func waitReplaced(first *Reaper, d time.Duration) *Reaper {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		r := cur
		mu.Unlock()
		if r != first {
			return r
		}
	}
	return nil
}

func sleeper(t *testing.T) *exec.Cmd {
	c := exec.Command("/bin/sh", "-c", "exec sleep 300")
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-c.Process.Pid, syscall.SIGKILL); c.Wait() })
	return c
}

// TestKilledReaperIsReplacedWhileChildrenEnd: a killed reaper is replaced
// even when a Forget (a child being reaped) wrote to its dead pipe first.
func TestKilledReaperIsReplacedWhileChildrenEnd(t *testing.T) {
	c := sleeper(t)
	if err := Watch(c.Process.Pid); err != nil {
		t.Fatal(err)
	}
	defer Forget(c.Process.Pid)
	for i := 0; i < 20; i++ {
		mu.Lock()
		first := cur
		mu.Unlock()
		first.cmd.Process.Kill()
		for {
			Forget(1 << 30) // an unrelated child being reaped meanwhile
			first.mu.Lock()
			gone := first.err != nil
			first.mu.Unlock()
			if gone {
				break
			}
		}
		if waitReplaced(first, 2*time.Second) == nil {
			t.Fatalf("attempt %d: killed reaper never replaced although group %d is registered", i, c.Process.Pid)
		}
	}
}
