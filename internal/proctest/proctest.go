// Package proctest reads the process table from /proc (Linux), for tests
// that look for a process's children and for the zombies it leaves.
package proctest

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Proc is what /proc/PID/stat says of a process.
type Proc struct {
	PID, PPID int
	State     string // R, S, Z, ...
	Comm      string
}

// List returns the processes there are now.
func List(t testing.TB) []Proc {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var ps []Proc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // gone meanwhile
		}
		s := string(b)
		i, j := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if i < 0 || j < i {
			continue
		}
		f := strings.Fields(s[j+1:])
		if len(f) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		ps = append(ps, Proc{PID: pid, PPID: ppid, State: f[0], Comm: s[i+1 : j]})
	}
	return ps
}

// ZombiesOf lists the zombies whose parent is pid.
func ZombiesOf(t testing.TB, pid int) []Proc {
	t.Helper()
	var z []Proc
	for _, p := range List(t) {
		if p.PPID == pid && p.State == "Z" {
			z = append(z, p)
		}
	}
	return z
}

// ChildOf returns the pid of parent's only child, waiting up to two
// seconds for it.
func ChildOf(t testing.TB, parent int) int {
	t.Helper()
	for range 100 {
		for _, p := range List(t) {
			if p.PPID == parent {
				return p.PID
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("process %d has no child", parent)
	return 0
}
