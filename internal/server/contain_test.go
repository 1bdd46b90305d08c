package server

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

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
