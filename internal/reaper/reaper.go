// Package reaper kills the process groups of the gateway's children when
// the gateway dies, however it dies (SIGKILL included). A child's
// parent-death signal reaches the child only: what the child started in its
// process group (npx -> node) would otherwise outlive the gateway.
//
// The reaper is a second process: the gateway's own executable
// (/proc/self/exe, the bytes the genesis record measured) run again with
// CMCP_REAPER=1, which this package's init takes over before main. It reads
// "+pgid" and "-pgid" lines from a pipe whose only writer is the gateway;
// when the pipe ends (the gateway exited, or was killed) it sends SIGKILL to
// every group still registered and exits. It runs in its own process group
// and ignores SIGINT, SIGTERM and SIGHUP, so that a Ctrl-C to the gateway's
// terminal does not end it first. A grandchild that leaves its group
// (setsid, setpgid) is covered where the child has a cgroup of its own
// (package contain): "c<path>" and "C<path>" lines register and forget
// it, and the reaper writes its cgroup.kill.
package reaper

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/confidential-mcp/cmcp/internal/contain"
)

// env marks the reaper process.
const env = "CMCP_REAPER"

func init() {
	if os.Getenv(env) == "1" {
		os.Exit(run(os.NewFile(3, "reaper-pipe")))
	}
}

// run is the reaper process: it keeps the registered groups and kills them
// when r ends.
func run(r io.Reader) int {
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE)
	groups := map[int]bool{}
	cgroups := map[string]bool{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if len(line) < 2 {
			continue
		}
		switch line[0] {
		case 'c':
			cgroups[line[1:]] = true
			continue
		case 'C':
			delete(cgroups, line[1:])
			continue
		}
		pgid, err := strconv.Atoi(line[1:])
		if err != nil || pgid <= 1 {
			continue
		}
		switch line[0] {
		case '+':
			groups[pgid] = true
		case '-':
			delete(groups, pgid)
		}
	}
	for pgid := range groups {
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	}
	// A cgroup holds what left its group too (setsid).
	for path := range cgroups {
		contain.KillPath(path)
	}
	return 0
}

// Reaper is the gateway's handle on its reaper process.
type Reaper struct {
	mu     sync.Mutex
	w      *os.File
	cmd    *exec.Cmd
	err    error // the reaper is gone: why
	closed bool  // by Close: its end was meant
}

// Start starts a reaper process.
func Start() (*Reaper, error) {
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("start the reaper: %w", err)
	}
	cmd := &exec.Cmd{
		Path:        "/proc/self/exe",
		Args:        []string{"cmcp-reaper"},
		Env:         []string{env + "=1"}, // nothing of the gateway's environment
		ExtraFiles:  []*os.File{pr},
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	release := contain.Starting() // its own group: never taken for an orphan
	if err := cmd.Start(); err != nil {
		release()
		pr.Close()
		pw.Close()
		return nil, fmt.Errorf("start the reaper (%s run again): %w", cmd.Path, err)
	}
	contain.OwnLocked(cmd.Process.Pid)
	release()
	pr.Close()
	r := &Reaper{w: pw, cmd: cmd}
	go func() {
		err := cmd.Wait()
		contain.Disown(cmd.Process.Pid)
		r.mu.Lock()
		if r.err == nil {
			r.err = fmt.Errorf("the reaper process ended: %v", err)
		}
		unexpected := !r.closed // whatever a write to it found meanwhile
		r.mu.Unlock()
		if unexpected {
			replace(r)
		}
	}()
	return r, nil
}

// Add registers process group pgid: it is killed if the gateway dies
// before Remove.
func (r *Reaper) Add(pgid int) error { return r.send('+', pgid) }

// Remove forgets process group pgid (its leader has been reaped).
func (r *Reaper) Remove(pgid int) error { return r.send('-', pgid) }

func (r *Reaper) send(op byte, pgid int) error { return r.sendLine(string(op) + strconv.Itoa(pgid)) }

func (r *Reaper) sendLine(line string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return r.err
	}
	if _, err := r.w.WriteString(line + "\n"); err != nil {
		r.err = fmt.Errorf("the reaper process is gone: %w", err)
		return r.err
	}
	return nil
}

// Close ends the reaper: it kills the groups still registered and exits.
func (r *Reaper) Close() error {
	r.mu.Lock()
	if r.err == nil {
		r.err = errors.New("the reaper is closed")
	}
	r.closed = true
	r.mu.Unlock()
	return r.w.Close()
}

// The process's reaper and the groups registered with it, so that a
// reaper that ended (killed by someone) is replaced with every group.
var (
	mu      sync.Mutex
	cur     *Reaper
	groups  = map[int]bool{}
	cgroups = map[string]bool{}
)

// Ready starts the process's reaper (again, if it ended) unless it runs:
// a gateway calls it before starting a child, so that the child is not
// started when its group could not be watched.
func Ready() error {
	if runtime.GOOS != "linux" {
		return nil // no /proc/self/exe; the children's groups are killed on a clean shutdown only
	}
	mu.Lock()
	defer mu.Unlock()
	return ready()
}

func ready() error {
	if cur != nil {
		cur.mu.Lock()
		gone := cur.err != nil
		cur.mu.Unlock()
		if !gone {
			return nil
		}
	}
	r, err := Start()
	if err != nil {
		return err
	}
	if cur != nil {
		cur.w.Close() // the pipe to the reaper that ended
	}
	cur = r
	for g := range groups {
		if err := r.Add(g); err != nil {
			return err
		}
	}
	for p := range cgroups {
		if err := r.sendLine("c" + p); err != nil {
			return err
		}
	}
	return nil
}

// WatchCgroup registers a child's cgroup (contain.Group) with the
// process's reaper: every process in it is killed (cgroup.kill) if the
// gateway dies before ForgetCgroup. Call it after Watch of the child's
// group (which starts the reaper).
func WatchCgroup(path string) error {
	if runtime.GOOS != "linux" || strings.ContainsAny(path, "\n") {
		return nil
	}
	mu.Lock()
	defer mu.Unlock()
	cgroups[path] = true
	if cur != nil && cur.sendLine("c"+path) == nil {
		return nil
	}
	return ready()
}

// ForgetCgroup unregisters a cgroup that was ended and removed.
func ForgetCgroup(path string) {
	mu.Lock()
	defer mu.Unlock()
	delete(cgroups, path)
	if cur != nil {
		_ = cur.sendLine("C" + path)
	}
}

// Watch registers process group pgid with the process's reaper, starting
// the reaper (again, if it ended) when needed: the group is killed if the
// gateway dies before Forget.
func Watch(pgid int) error {
	if runtime.GOOS != "linux" {
		return nil
	}
	mu.Lock()
	defer mu.Unlock()
	groups[pgid] = true
	if cur != nil && cur.Add(pgid) == nil {
		return nil
	}
	if err := ready(); err != nil { // a new reaper gets every group, pgid included
		delete(groups, pgid)
		return err
	}
	return nil
}

// replace starts a new reaper with every registered group when r, the
// process's reaper, ended without being closed (someone killed it), so
// that the groups are not left unwatched until the next spawn.
func replace(r *Reaper) {
	mu.Lock()
	defer mu.Unlock()
	if cur == r && len(groups) > 0 {
		_ = ready() // on failure the next Watch tries again, and refuses its spawn
	}
}

// Forget unregisters process group pgid: none of its members is left (or
// none will be signalled through it again).
func Forget(pgid int) {
	mu.Lock()
	defer mu.Unlock()
	delete(groups, pgid)
	if cur != nil {
		_ = cur.Remove(pgid)
	}
}
