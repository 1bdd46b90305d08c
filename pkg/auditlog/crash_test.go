package auditlog

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logtest"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// TestCrashChild is the writer process of TestCrashSIGKILL. It appends from
// 8 goroutines until it is killed and prints "epoch index tag" for every
// record whose Append returned, after it returned.
func TestCrashChild(t *testing.T) {
	dir := os.Getenv("CMCP_AUDIT_CRASH_DIR")
	if dir == "" {
		return
	}
	mode := os.Getenv("CMCP_AUDIT_CRASH_MODE")
	w, err := Open(dir, Options{Key: logtest.Key(t), Durability: mode, CheckpointEvery: 64, CheckpointInterval: 20 * time.Millisecond, SegmentBytes: 64 << 10})
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		os.Exit(3)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				tag := fmt.Sprintf("g%d-%d", g, i)
				r, err := w.Append(context.Background(), &record.Session{ID: tag, Event: "start", Agent: "crash"})
				if err != nil {
					fmt.Fprintln(os.Stderr, "append:", err)
					os.Exit(4)
				}
				mu.Lock()
				fmt.Fprintf(os.Stdout, "%d %d %s\n", r.Epoch, r.Index, tag)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
}

// crashKills is how many times TestCrashSIGKILL kills its writer: each
// durability mode at least 7 times. Each kill re-verifies the whole log,
// so the test's CPU grows about with the square of this count (50 kills
// took 42.4 CPU-s, 30 kills 15.7). A writer that holds acknowledged records
// in its buffer (interval mode writing only when it syncs) failed at the
// first or second interval kill in 3 runs of 3.
const crashKills = 30

// TestCrashSIGKILL kills a writer process under concurrent appends at
// random moments (after 1 to 300 acknowledged records), crashKills times. After each kill it reopens the log
// (crash recovery), verifies every epoch, and checks that every record
// whose Append had returned is present where its receipt said.
func TestCrashSIGKILL(t *testing.T) {
	if os.Getenv("CMCP_AUDIT_CRASH_DIR") != "" {
		return
	}
	dir := t.TempDir()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	type ack struct {
		epoch int
		index int64
	}
	acked := map[ack]string{}
	modes := []string{record.DurabilityGroup, record.DurabilityGroup, record.DurabilityStrict, record.DurabilityInterval}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	kills, earlyKills, cuts := 0, 0, 0
	start := time.Now()
	for kills < crashKills {
		cmd := exec.Command(exe, "-test.run=^TestCrashChild$")
		mode := modes[kills%len(modes)]
		cmd.Env = append(os.Environ(), "CMCP_AUDIT_CRASH_DIR="+dir, "CMCP_AUDIT_CRASH_MODE="+mode)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Kill after a random number of acknowledged records, counted as
		// the child prints them: a moment chosen among the appends, not
		// a fixed delay that a loaded machine can spend starting the
		// child (it once killed 50 times before any acknowledgement).
		lines := make(chan string, 1024)
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				lines <- sc.Text()
			}
			close(lines)
		}()
		want := 1 + rng.IntN(300)
		var got []string
		timeout := time.After(2 * time.Minute)
	acks:
		for len(got) < want {
			select {
			case l, ok := <-lines:
				if !ok {
					break acks // the child ended: reported below
				}
				got = append(got, l)
			case <-timeout:
				cmd.Process.Signal(syscall.SIGKILL)
				t.Fatalf("kill %d (%s): no record acknowledged within 2 minutes: %s", kills, mode, stderr.String())
			}
		}
		cmd.Process.Signal(syscall.SIGKILL)
		for l := range lines {
			got = append(got, l)
		}
		werr := cmd.Wait()
		var ee *exec.ExitError
		if !errors.As(werr, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("kill %d: child ended with %v before the kill: %s", kills, werr, stderr.String())
		}
		kills++
		if len(got) == 0 {
			earlyKills++
		}
		for _, l := range got {
			f := strings.Fields(l)
			if len(f) != 3 {
				continue // the line being printed when the kill came
			}
			e, _ := strconv.Atoi(f[0])
			i, _ := strconv.ParseInt(f[1], 10, 64)
			acked[ack{e, i}] = f[2]
		}

		// Reopen (recovery), close, verify, and count.
		w, err := Open(dir, Options{Key: logtest.Key(t)})
		if err != nil {
			t.Fatalf("kill %d (%s): reopen: %v", kills, mode, err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := Verify(dir, VerifyOptions{}); err != nil {
			t.Fatalf("kill %d (%s): verify after recovery: %v", kills, mode, err)
		}
		present := map[ack]string{}
		r, err := NewReader(dir)
		if err != nil {
			t.Fatal(err)
		}
		for {
			e, err := r.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if e.Kind == record.KindRecovery && kills == crashKills {
				rec, _ := e.Decode()
				if rec.(*record.Recovery).DroppedBytes > 0 {
					cuts++
				}
			}
			if e.Kind == record.KindSession {
				rec, _ := e.Decode()
				present[ack{e.Pos.Epoch, e.Index}] = rec.(*record.Session).ID
			}
		}
		r.Close()
		for a, tag := range acked {
			if present[a] != tag {
				t.Fatalf("kill %d (%s): acknowledged record %s (epoch %d, index %d) is missing after recovery (found %q)", kills, mode, tag, a.epoch, a.index, present[a])
			}
		}
	}
	t.Logf("%d kills (%d before any acknowledgement), %d torn tails cut, %d acknowledged records all present, %v", kills, earlyKills, cuts, len(acked), time.Since(start).Round(time.Millisecond))
	if len(acked) == 0 {
		t.Fatal("no record was ever acknowledged: the test exercised nothing")
	}
}
