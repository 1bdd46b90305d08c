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
// (setsid, setpgid) is not covered.
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
	"sync"
	"syscall"
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
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if len(line) < 2 {
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
	if err := cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		return nil, fmt.Errorf("start the reaper (%s run again): %w", cmd.Path, err)
	}
	pr.Close()
	r := &Reaper{w: pw, cmd: cmd}
	go func() {
		err := cmd.Wait()
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

func (r *Reaper) send(op byte, pgid int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return r.err
	}
	if _, err := r.w.WriteString(string(op) + strconv.Itoa(pgid) + "\n"); err != nil {
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
	mu     sync.Mutex
	cur    *Reaper
	groups = map[int]bool{}
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
	return nil
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
