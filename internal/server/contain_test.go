package server

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/gwtest"
)

func init() {
	gwtest.ChildModes["setsidforker"] = setsidForker
	gwtest.ChildModes["daemonize"] = func() {
		// Double fork: a sleeper in a session of its own, whose parent
		// (this process) exits at once.
		gc := exec.Command(os.Args[0])
		gc.Env = append(os.Environ(), childEnv+"=sleeper")
		gc.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if gc.Start() == nil {
			appendPID(gc.Process.Pid)
		}
	}
}

func appendPID(pid int) {
	if f, err := os.OpenFile(os.Getenv("CMCP_TEST_MARK"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600); err == nil {
		fmt.Fprintln(f, pid)
		f.Close()
	}
}

// setsidForker is a server that starts 50 sleepers that leave its process
// group: 25 it starts with setsid, 25 double-forked (their parent, which
// called setsid for them, exits at once). Every pid goes to
// CMCP_TEST_MARK. Then it serves the test upstream.
func setsidForker() {
	var parents []*exec.Cmd
	for i := range 50 {
		mode := "sleeper"
		if i%2 == 1 {
			mode = "daemonize"
		}
		c := exec.Command(os.Args[0])
		c.Env = append(os.Environ(), childEnv+"="+mode)
		c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if c.Start() != nil {
			continue
		}
		if mode == "sleeper" {
			appendPID(c.Process.Pid)
		} else {
			parents = append(parents, c)
		}
	}
	// The double-forking parents run at once and are waited for only
	// now: one after the other, 25 starts of a -race test binary took
	// longer than the gateway's start-up probe may wait on a loaded machine.
	for _, c := range parents {
		c.Wait()
	}
	_ = gwtest.NewChildServer("server").Run(context.Background(), &mcp.StdioTransport{})
}

// TestSetsidGrandchildrenAreContained: a server that starts 50 processes
// that call setsid (half of them double-forked) leaves none running after
// its session ends, after the gateway's SIGTERM and, where each child has
// a cgroup of its own, after the gateway's SIGKILL. The gateway is a child
// subreaper, so the orphans come back to it; /readyz and the startup log
// say which containment is in force.
func TestSetsidGrandchildrenAreContained(t *testing.T) {
	if os.Getenv("CMCP_TEST_SHORT") != "" {
		t.Skip("starts 100s of processes")
	}
	for _, end := range []string{"session end", "SIGTERM", "SIGKILL"} {
		t.Run(end, func(t *testing.T) {
			exe, pin := selfDigest(t)
			dir := t.TempDir()
			mark := filepath.Join(dir, "pids")
			cfgPath := filepath.Join(dir, "cmcp.yaml")
			if err := os.WriteFile(cfgPath, []byte(fmt.Sprintf(`version: 1
server: {listen: %s, tee: software}
audit: {dir: audit}
upstreams:
  - name: t
    stdio: {command: %s, env: {%s: setsidforker, CMCP_TEST_MARK: %s}}
    pin: {command: %s}
    lifecycle: per-session
`, freePort(t), exe, childEnv, mark, pin)), 0o600); err != nil {
				t.Fatal(err)
			}
			cmd, endpoint, stderr := startGatewayProcess(t, cfgPath)
			// A SIGTERM, not a SIGKILL: a failed or skipped case leaves
			// nothing running.
			defer func() {
				cmd.Process.Signal(syscall.SIGTERM)
				cmd.Wait()
			}()
			c := mcp.NewClient(&mcp.Implementation{Name: "a", Version: "1"}, nil)
			cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: endpoint, MaxRetries: -1}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer cs.Close()
			pidOf(t, cs, "t__pid")
			var pids []int
			eventually(t, 90*time.Second, func() string {
				b, _ := os.ReadFile(mark)
				pids = pids[:0]
				for _, f := range strings.Fields(string(b)) {
					if n, err := strconv.Atoi(f); err == nil {
						pids = append(pids, n)
					}
				}
				if len(pids) < 50 {
					return fmt.Sprintf("%d sleepers started", len(pids))
				}
				return ""
			})
			log := stderr.String()
			cgroup := strings.Contains(log, "cgroup+subreaper")
			if !cgroup && !strings.Contains(log, "containment=\"subreaper") {
				t.Fatalf("the startup log does not say which containment is in force:\n%s", log)
			}
			switch end {
			case "session end":
				cs.Close()
			case "SIGTERM":
				cmd.Process.Signal(syscall.SIGTERM)
				cmd.Wait()
			case "SIGKILL":
				if !cgroup {
					t.Skip("no cgroup of its own per child here: after SIGKILL of the gateway the orphans go to PID 1 (docs/hostile-peers.md)")
				}
				cmd.Process.Signal(syscall.SIGKILL)
				cmd.Wait()
			}
			eventually(t, 60*time.Second, func() string {
				var alive []int
				for _, p := range pids {
					if pidAlive(p) {
						alive = append(alive, p)
					}
				}
				if len(alive) > 0 {
					return fmt.Sprintf("%d of %d setsid'd descendants alive after %s: %v", len(alive), len(pids), end, alive)
				}
				return ""
			})
		})
	}
}
