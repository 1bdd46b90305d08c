package contain

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

var (
	mu    sync.Mutex // held while a child starts and while orphans are reaped
	info  = Info{Mode: ModeNone}
	setup bool
	own   = map[int]bool{} // processes the gateway started itself (their exit is theirs to wait for)
	seq   atomic.Int64
)

// Setup makes the gateway a child subreaper and, where it can, the parent
// of a cgroup per child; it returns what is in force. Later calls return
// the same.
func Setup() Info {
	mu.Lock()
	defer mu.Unlock()
	if setup {
		return info
	}
	setup = true
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		info = Info{Mode: ModeNone, Why: fmt.Sprintf("PR_SET_CHILD_SUBREAPER: %v", err)}
		return info
	}
	info = Info{Mode: ModeSubreaper}
	go reapOrphans()
	dir, err := cgroupBase()
	if err != nil {
		info.Why = err.Error()
		return info
	}
	info.Mode, info.Cgroup = ModeCgroup, dir
	return info
}

// Current is the containment in force.
func Current() Info {
	mu.Lock()
	defer mu.Unlock()
	return info
}

// cgroupBase makes the directory under which each child gets its cgroup:
// cmcp-PID in the gateway's own cgroup v2.
func cgroupBase() (string, error) {
	mount, err := cgroup2Mount()
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", fmt.Errorf("read /proc/self/cgroup: %w", err)
	}
	var own string
	for _, l := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(l, "0::"); ok {
			own = p
		}
	}
	if own == "" {
		return "", errors.New("the gateway is in no cgroup v2 (/proc/self/cgroup has no 0:: line)")
	}
	dir := filepath.Join(mount, own, fmt.Sprintf("cmcp-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("cannot make a cgroup under the gateway's own (%v)", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "cgroup.kill")); err != nil {
		os.Remove(dir)
		return "", fmt.Errorf("the kernel has no cgroup.kill (Linux 5.14 or later has)")
	}
	return dir, nil
}

// cgroup2Mount finds where cgroup v2 is mounted.
func cgroup2Mount() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", fmt.Errorf("read /proc/self/mountinfo: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS ... - FSTYPE SOURCE SUPER
		l := sc.Text()
		i := strings.Index(l, " - ")
		if i < 0 {
			continue
		}
		after, before := strings.Fields(l[i+3:]), strings.Fields(l[:i])
		if len(after) > 0 && after[0] == "cgroup2" && len(before) >= 5 && before[3] == "/" {
			return before[4], nil
		}
	}
	return "", errors.New("cgroup v2 is not mounted")
}

// Group is the cgroup of one child.
type Group struct {
	path string
	f    *os.File
}

// NewGroup makes a cgroup for a child of the upstream name, or returns nil
// when no cgroup is in force.
func NewGroup(name string) (*Group, error) {
	in := Current()
	if in.Mode != ModeCgroup {
		return nil, nil
	}
	clean := strings.Map(func(r rune) rune {
		if r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, name)
	p := filepath.Join(in.Cgroup, fmt.Sprintf("%s-%d", clean, seq.Add(1)))
	if err := os.Mkdir(p, 0o755); err != nil {
		return nil, fmt.Errorf("make the child's cgroup: %w", err)
	}
	f, err := os.Open(p)
	if err != nil {
		os.Remove(p)
		return nil, fmt.Errorf("open the child's cgroup: %w", err)
	}
	return &Group{path: p, f: f}, nil
}

// Path is the cgroup's directory.
func (g *Group) Path() string { return g.path }

// Apply has the process that attr starts begin in the cgroup.
func (g *Group) Apply(attr *syscall.SysProcAttr) {
	attr.UseCgroupFD, attr.CgroupFD = true, int(g.f.Fd())
}

// Kill ends every process in the cgroup (cgroup.kill), waits until it is
// empty (at most wait) and removes it. The gateway reaps them (its
// orphans) or their parents do. A cgroup already empty (the usual case:
// the child was reaped and left nothing behind) is removed without the
// write to cgroup.kill: nothing can join a cgroup that has no process
// but through the gateway's own descriptor of it, used only to start the
// child.
func (g *Group) Kill(wait time.Duration) error {
	if g == nil {
		return nil
	}
	if g.f != nil {
		defer g.f.Close()
	}
	events := filepath.Join(g.path, "cgroup.events")
	var err error
	if b, rerr := os.ReadFile(events); rerr != nil || !bytes.Contains(b, []byte("populated 0")) {
		err = os.WriteFile(filepath.Join(g.path, "cgroup.kill"), []byte("1"), 0)
		deadline := time.Now().Add(wait)
		for {
			b, rerr := os.ReadFile(events)
			if rerr != nil || bytes.Contains(b, []byte("populated 0")) || time.Now().After(deadline) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if rerr := os.Remove(g.path); rerr != nil && err == nil && !errors.Is(rerr, os.ErrNotExist) {
		err = rerr
	}
	if err != nil {
		return fmt.Errorf("end the child's cgroup %s: %w", g.path, err)
	}
	return nil
}

// KillPath is Group.Kill for a cgroup known by its path only (the reaper
// process's, after the gateway died).
func KillPath(path string) {
	g := &Group{path: path}
	_ = g.Kill(time.Second)
	os.Remove(filepath.Dir(path)) // the gateway's cmcp-PID, once empty
}

// Starting holds off the reaping of orphans while a child is started and
// registered (Own): until then its exit could be taken for an orphan's.
// Call the returned function once it is registered, or failed to start.
func Starting() func() {
	mu.Lock()
	return mu.Unlock
}

// OwnLocked registers a process the gateway started itself, between
// Starting and its release: it is never taken for an orphan.
func OwnLocked(pid int) { own[pid] = true }

// Disown forgets a process registered with OwnLocked (it was waited for).
func Disown(pid int) {
	mu.Lock()
	delete(own, pid)
	mu.Unlock()
	select {
	case disowned <- struct{}{}:
	default:
	}
}

// orphans lists the processes the gateway adopted as subreaper: its
// children that it did not start (another process group than its own,
// which every helper it runs shares; not registered with OwnLocked).
// Called with mu held.
func orphans() (alive, zombies []int) {
	self, pgrp := os.Getpid(), syscall.Getpgrp()
	ents, _ := os.ReadDir("/proc")
	proc, err := unix.Open("/proc", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil
	}
	defer unix.Close(proc)
	var buf [1024]byte
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || own[pid] {
			continue
		}
		state, ppid, pg, ok := readStat(proc, e.Name(), buf[:])
		if !ok || ppid != self || pg == pgrp {
			continue
		}
		if state == 'Z' {
			zombies = append(zombies, pid)
		} else {
			alive = append(alive, pid)
		}
	}
	return alive, zombies
}

// readStat reads the state, parent and process group of process name
// from its stat file under the /proc descriptor proc, with three system
// calls (os.ReadFile takes twice as many, for every process on the
// machine at each scan).
func readStat(proc int, name string, buf []byte) (state byte, ppid, pgrp int, ok bool) {
	fd, err := unix.Openat(proc, name+"/stat", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, 0, 0, false
	}
	n, err := unix.Read(fd, buf)
	unix.Close(fd)
	if err != nil || n <= 0 {
		return 0, 0, 0, false
	}
	b := buf[:n]
	i := bytes.LastIndexByte(b, ')') // the name may hold anything but this last ')'
	if i < 0 {
		return 0, 0, 0, false
	}
	f := strings.Fields(string(b[i+1:])) // state ppid pgrp ...
	if len(f) < 3 || len(f[0]) != 1 {
		return 0, 0, 0, false
	}
	ppid, err1 := strconv.Atoi(f[1])
	pgrp, err2 := strconv.Atoi(f[2])
	return f[0][0], ppid, pgrp, err1 == nil && err2 == nil
}

// reapOrphans waits for the orphans the gateway adopted as they exit.
//
// A SIGCHLD, or one of its own processes waited for (Disown), makes it
// look at the gateway's exited children without reaping them
// (waitid(P_ALL, WNOWAIT)): an orphan's is reaped and the next looked at;
// one of its own (its waiter reaps it) stops the look until that waiter is
// done. Only a zombie of a helper in the gateway's process group first in
// line (nothing tells it when the helper's waiter is done) has it scan
// /proc for orphans, which reads every process's stat file: milliseconds
// on a busy machine, where a SIGCHLD comes with every child that ends.
func reapOrphans() {
	ch := make(chan os.Signal, 16)
	signal.Notify(ch, syscall.SIGCHLD)
	tick := time.NewTicker(5 * time.Second) // a SIGCHLD may be merged with another
	for {
		select {
		case <-ch:
		case <-disowned:
		case <-tick.C:
		}
		mu.Lock()
		if !reapExited() {
			_, zombies := orphans()
			for _, pid := range zombies {
				var ws syscall.WaitStatus
				if p, _ := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil); p > 0 {
					scanReaped.Add(1)
				}
			}
		}
		mu.Unlock()
	}
}

// disowned tells reapOrphans that a process of the gateway's own was
// waited for: an exited orphan may have been queued behind it.
var disowned = make(chan struct{}, 1)

// scanReaped counts the orphans that a scan of /proc found and reaped,
// for the tests: reapExited should have reaped them first.
var scanReaped atomic.Int64

// siPid is where si_pid is in a siginfo_t: after three ints, aligned
// as the union's pointers are.
const siPid = 3*4 + (unsafe.Sizeof(uintptr(0)) - 4)

// reapExited reaps the orphans among the gateway's exited children, the
// first one at a time as waitid(P_ALL, WNOWAIT) shows them, until none
// is left (true) or the first is one of its own or a helper's. It
// returns false when it cannot tell without a scan of /proc (a helper's
// zombie first, or waitid failed). Called with mu held.
func reapExited() bool {
	pgrp := syscall.Getpgrp()
	for range 1000 {
		var si unix.Siginfo
		err := unix.Waitid(unix.P_ALL, 0, &si, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
		if errors.Is(err, syscall.ECHILD) {
			return true
		}
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return false
		}
		pid := int(*(*int32)(unsafe.Add(unsafe.Pointer(&si), siPid)))
		if pid == 0 {
			return true // no child has exited
		}
		if own[pid] {
			return true // its waiter reaps it, then Disown looks again
		}
		if pg, ok := procPgrp(pid); !ok || pg == pgrp {
			return false // a helper's, which its own waiter reaps
		}
		var ws syscall.WaitStatus
		if _, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil); err != nil {
			return false
		}
	}
	return false
}

// procPgrp reads the process group of pid from /proc/PID/stat.
func procPgrp(pid int) (int, bool) {
	var buf [1024]byte
	_, _, pg, ok := readStat(unix.AT_FDCWD, "/proc/"+strconv.Itoa(pid), buf[:])
	return pg, ok
}

// KillOrphans kills every orphan the gateway adopted and that keep does
// not claim, and reaps them. With the subreaper alone an orphan cannot be
// traced to the child it came from (its parent is gone): serve calls it
// when any upstream child ends and when it stops. It returns how many it
// killed.
func KillOrphans(keep func(pid int) bool) int {
	mu.Lock()
	defer mu.Unlock()
	if !setup || info.Mode == ModeNone {
		return 0
	}
	n := 0
	for round := 0; round < 50; round++ {
		alive, zombies := orphans()
		for _, pid := range zombies {
			var ws syscall.WaitStatus
			_, _ = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		}
		killed := 0
		for _, pid := range alive {
			if keep != nil && keep(pid) {
				continue
			}
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				killed++
			}
		}
		if killed == 0 {
			break
		}
		n += killed
		// Killed orphans are reaped by the next round; an orphan's own
		// children become orphans in turn.
		time.Sleep(10 * time.Millisecond)
	}
	return n
}
