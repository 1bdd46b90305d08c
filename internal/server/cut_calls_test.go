package server

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/gateway"
)

// TestCallCutByTheShutdownIsAnswered: a call still running when the drain
// ends (shutdown_grace after SIGTERM, or the signal to `serve --stdio`) is
// cancelled upstream and answered -32068 on its own request before the
// connection closes, on both fronts, one shutdown_grace after the signal
// (not two); its result record says the gateway's shutdown cut it, not
// that the agent cancelled it; and the gateway exits 0 on both fronts,
// warning of the cut call, with a sealed log that verifies.
func TestCallCutByTheShutdownIsAnswered(t *testing.T) {
	const grace = 2 * time.Second
	t.Run("http-SIGTERM", func(t *testing.T) {
		exe, pin := selfDigest(t)
		dir := t.TempDir()
		cfgPath := filepath.Join(dir, "cmcp.yaml")
		os.WriteFile(cfgPath, []byte(fmt.Sprintf(`version: 1
server: {listen: %s, tee: software, shutdown_grace: %s}
audit: {dir: audit}
upstreams:
  - name: t
    stdio: {command: %s, env: {%s: server}}
    pin: {command: %s}
`, freePort(t), grace, exe, childEnv, pin)), 0o600)
		cmd, endpoint, stderr := startGatewayProcess(t, cfgPath)
		cs, err := connectWith(endpoint, "")
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		type answer struct {
			status int
			body   string
			err    error
			at     time.Time
		}
		// One call the fast path answers, one go-sdk answers (its _meta
		// has a member name with an escape).
		got := make(chan answer, 2)
		for _, p := range callPaths {
			go func() {
				st, b, err := postCall(endpoint, cs.ID(), "", `{"jsonrpc":"2.0","id":"`+p.name+`","method":"tools/call","params":{"name":"t__sleep",`+p.meta+`"arguments":{"text":"10s"}}}`)
				got <- answer{st, b, err, time.Now()}
			}()
		}
		audit := filepath.Join(dir, "audit")
		waitForwarded(t, audit, "t__sleep", 2)
		sent := time.Now()
		cmd.Process.Signal(syscall.SIGTERM)
		for range callPaths {
			a := <-got
			if a.err != nil || a.status != http.StatusOK || answerCode(a.body) != gateway.CodeShuttingDown || !strings.Contains(a.body, "server.shutdown_grace") {
				t.Errorf("a cut call got %d %q (%v), want a JSON-RPC error %d", a.status, a.body, a.err, gateway.CodeShuttingDown)
			}
			if d := a.at.Sub(sent); d > grace+1500*time.Millisecond {
				t.Errorf("a cut call was answered %v after SIGTERM: the drain lasts one shutdown_grace (%v)", d, grace)
			}
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("gateway exit: %v\n%s", err, stderr.String())
		}
		if !strings.Contains(stderr.String(), "cutting them") {
			t.Errorf("no warning of the cut call:\n%s", stderr.String())
		}
		checkCutResult(t, audit, 2, gateway.CodeShuttingDown, "gateway shutdown")
		checkStoppedLog(t, audit, stderr.String())
	})
	t.Run("stdio-signal", func(t *testing.T) {
		st := serveStdio(t, fmt.Sprintf("  shutdown_grace: %s\n", grace))
		type answer struct {
			err error
			at  time.Time
		}
		got := make(chan answer, 1)
		go func() {
			_, err := st.cs.CallTool(st.ctx, &mcp.CallToolParams{Name: "t__sleep", Arguments: map[string]any{"text": "10s"}})
			got <- answer{err, time.Now()}
		}()
		audit := filepath.Join(st.dir, "audit")
		waitForwarded(t, audit, "t__sleep", 1)
		sent := time.Now()
		st.signal()
		var a answer
		select {
		case a = <-got:
		case <-time.After(15 * time.Second):
			t.Fatalf("the cut call was never answered\n%s", st.logs.String())
		}
		if wireCode(a.err) != gateway.CodeShuttingDown || !strings.Contains(a.err.Error(), "server.shutdown_grace") {
			t.Fatalf("the cut call got %v, want %d", a.err, gateway.CodeShuttingDown)
		}
		if d := a.at.Sub(sent); d > grace+1500*time.Millisecond {
			t.Errorf("the cut call was answered %v after the signal: the drain lasts one shutdown_grace (%v)", d, grace)
		}
		st.wait(t) // Serve returns nil: exit 0, as over HTTP
		if !strings.Contains(st.logs.String(), "cutting them") {
			t.Errorf("no warning of the cut call:\n%s", st.logs.String())
		}
		checkCutResult(t, audit, 1, gateway.CodeShuttingDown, "gateway shutdown")
		checkStoppedLog(t, audit, st.logs.String())
	})
}
