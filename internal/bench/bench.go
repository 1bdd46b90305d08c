// Package bench measures cmcp against the upstreams it fronts: the same
// go-sdk client drives tools/call through a real `cmcp serve` process and
// directly against the same upstream, in the same run, so that the results
// are ratios that survive a noisy machine. The benchmark itself is in
// bench_test.go (BenchmarkGateway); see scripts/bench.sh.
package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Connector opens one new MCP client session with the system under test.
type Connector func(ctx context.Context) (*mcp.ClientSession, error)

// Load is one measurement: Concurrency sessions, each with its own
// goroutine, calling Tool Warmup times untimed and then Calls times timed.
type Load struct {
	Concurrency int
	Calls       int // timed calls per session
	Warmup      int // untimed calls per session
	Tool        string
	Args        any
	// Vary gives every call its own arguments ({"n": <call number>}), so
	// that no two calls of a measurement share a policy decision (the
	// gateway's decision cache never hits).
	Vary bool
}

// Result of one Load.
type Result struct {
	Concurrency int
	Calls       int
	P50, P99    time.Duration
	CallsPerSec float64
	// ConnectP50 and FirstCallP50 split a new session (NewSessions):
	// the p50 of its connect (the MCP handshake) and of its first call.
	ConnectP50, FirstCallP50 time.Duration
}

// Measure runs l against connect. All sessions are opened before the clock
// starts, and closed after it stops.
func Measure(ctx context.Context, connect Connector, l Load) (Result, error) {
	if l.Concurrency < 1 || l.Calls < 1 {
		return Result{}, fmt.Errorf("bench: concurrency and calls must be at least 1")
	}
	sessions := make([]*mcp.ClientSession, l.Concurrency)
	defer func() {
		for _, s := range sessions {
			if s != nil {
				s.Close()
			}
		}
	}()
	for i := range sessions {
		s, err := connect(ctx)
		if err != nil {
			return Result{}, fmt.Errorf("bench: open session %d: %w", i, err)
		}
		sessions[i] = s
	}
	var n atomic.Int64
	call := func(s *mcp.ClientSession) error {
		args := l.Args
		if l.Vary {
			args = map[string]any{"n": n.Add(1)}
		}
		res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: l.Tool, Arguments: args})
		if err != nil {
			return err
		}
		if res.IsError {
			return fmt.Errorf("tool %s returned isError: %v", l.Tool, res.Content)
		}
		return nil
	}
	return drive(sessions, l.Concurrency, l.Calls, l.Warmup, call)
}

// percentile of sorted durations (nearest rank).
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted)) + 0.5)
	if i >= len(sorted) {
		i = len(sorted) - 1
	}
	if i > 0 {
		i--
	}
	return sorted[i]
}

// PeakRSS returns the peak resident set size (VmHWM) of process pid, in bytes.
func PeakRSS(pid int) (int64, error) {
	return procStatusKB(pid, "VmHWM:")
}

// CurrentRSS returns the resident set size (VmRSS) of process pid, in bytes.
func CurrentRSS(pid int) (int64, error) {
	return procStatusKB(pid, "VmRSS:")
}

func procStatusKB(pid int, field string) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return statusField(f, field)
}

func statusField(r io.Reader, field string) (int64, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), field)
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("unexpected %s line %q", field, sc.Text())
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, err
		}
		return kb << 10, nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no %s in /proc status", field)
}

// CPUTime returns the user+system CPU time process pid has used so far
// (from /proc/<pid>/stat, in clock ticks of 10ms).
func CPUTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may contain spaces; fields after it start
	// after the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("unexpected /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("unexpected /proc/%d/stat", pid)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("unexpected /proc/%d/stat", pid)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}

// Calls runs callers goroutines over sessions (caller i uses session i mod
// len(sessions)), each making warmup untimed calls and then calls timed
// ones of the tool and arguments params gives for the call's number.
func Calls(ctx context.Context, sessions []*mcp.ClientSession, callers, calls, warmup int, params func(n int64) *mcp.CallToolParams) (Result, error) {
	if len(sessions) < 1 || callers < 1 || calls < 1 {
		return Result{}, fmt.Errorf("bench: sessions, callers and calls must be at least 1")
	}
	var n atomic.Int64
	call := func(s *mcp.ClientSession) error {
		p := params(n.Add(1))
		res, err := s.CallTool(ctx, p)
		if err != nil {
			return err
		}
		if res.IsError {
			return fmt.Errorf("tool %s returned isError: %v", p.Name, res.Content)
		}
		return nil
	}
	return drive(sessions, callers, calls, warmup, call)
}

// NewSessions opens n sessions one after another, each timed from the
// start of its connect (the MCP handshake) to the answer of its first
// call (first gives its params), and closed untimed, gap before the next one opens.
func NewSessions(ctx context.Context, connect Connector, n int, gap time.Duration, first func() *mcp.CallToolParams) (Result, error) {
	lat := make([]time.Duration, 0, n)
	conns, firsts := make([]time.Duration, 0, n), make([]time.Duration, 0, n)
	t0 := time.Now()
	for i := range n {
		if i > 0 && gap > 0 {
			time.Sleep(gap)
		}
		start := time.Now()
		s, err := connect(ctx)
		if err != nil {
			return Result{}, fmt.Errorf("bench: new session %d: %w", i, err)
		}
		connected := time.Now()
		p := first()
		res, err := s.CallTool(ctx, p)
		if err == nil && res.IsError {
			err = fmt.Errorf("tool %s returned isError: %v", p.Name, res.Content)
		}
		if err != nil {
			s.Close()
			return Result{}, fmt.Errorf("bench: first call of new session %d: %w", i, err)
		}
		done := time.Now()
		lat = append(lat, done.Sub(start))
		conns, firsts = append(conns, connected.Sub(start)), append(firsts, done.Sub(connected))
		if err := s.Close(); err != nil {
			return Result{}, fmt.Errorf("bench: close new session %d: %w", i, err)
		}
	}
	elapsed := time.Since(t0)
	slices.Sort(lat)
	slices.Sort(conns)
	slices.Sort(firsts)
	return Result{Concurrency: 1, Calls: n, P50: percentile(lat, 0.50), P99: percentile(lat, 0.99), CallsPerSec: float64(n) / elapsed.Seconds(),
		ConnectP50: percentile(conns, 0.50), FirstCallP50: percentile(firsts, 0.50)}, nil
}

// SchedCPU returns the CPU time the threads of process pid have run so
// far, in nanoseconds (the sum of /proc/<pid>/task/*/schedstat): finer
// than CPUTime's clock ticks, for costs of a few milliseconds. Threads
// that already exited are not counted (a Go process keeps its threads).
func SchedCPU(pid int) (time.Duration, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0, err
	}
	var sum time.Duration
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, t.Name()))
		if err != nil {
			continue // the thread exited meanwhile
		}
		f := strings.Fields(string(b))
		if len(f) < 1 {
			return 0, fmt.Errorf("unexpected schedstat of thread %s of %d", t.Name(), pid)
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("schedstat of thread %s of %d: %w", t.Name(), pid, err)
		}
		sum += time.Duration(ns)
	}
	return sum, nil
}

// drive runs callers goroutines, caller i on sessions[i%len(sessions)],
// each making warmup unmeasured calls and then calls measured ones, all
// released at once; one failed call fails the run.
func drive(sessions []*mcp.ClientSession, callers, calls, warmup int, call func(*mcp.ClientSession) error) (Result, error) {
	for i := range callers {
		for range warmup {
			if err := call(sessions[i%len(sessions)]); err != nil {
				return Result{}, fmt.Errorf("bench: warm-up call: %w", err)
			}
		}
	}
	lat := make([][]time.Duration, callers)
	errs := make([]error, callers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range callers {
		lat[i] = make([]time.Duration, 0, calls)
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := sessions[i%len(sessions)]
			<-start
			for range calls {
				t0 := time.Now()
				if err := call(s); err != nil {
					errs[i] = err
					return
				}
				lat[i] = append(lat[i], time.Since(t0))
			}
		}()
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	elapsed := time.Since(t0)
	for _, err := range errs {
		if err != nil {
			return Result{}, fmt.Errorf("bench: call: %w", err)
		}
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	return Result{Concurrency: callers, Calls: len(all), P50: percentile(all, 0.50), P99: percentile(all, 0.99),
		CallsPerSec: float64(len(all)) / elapsed.Seconds()}, nil
}
