package gateway

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/pkg/auditlog"
)

// checkStoppedLog checks the audit log of a gateway that stopped
// gracefully: it verifies and is sealed, and before the seal it holds the
// end of every session that started, the disconnection of every upstream
// connection, and the exit of every child started; the gateway's log has
// no failed append.
func checkStoppedLog(t *testing.T, auditDir, gatewayLog string) {
	t.Helper()
	if strings.Contains(gatewayLog, "audit append failed") || strings.Contains(gatewayLog, "audit log is closed") {
		t.Errorf("the gateway lost records at its stop:\n%s", gatewayLog)
	}
	rep, err := auditlog.Verify(auditDir, auditlog.VerifyOptions{})
	if err != nil || len(rep.Epochs) != 1 || !rep.Epochs[0].Sealed {
		t.Fatalf("verify after the stop: %v (%+v)", err, rep)
	}
	rs := readRecords(t, auditDir)
	seal := -1
	for i, r := range rs {
		if r.Kind == "seal" {
			seal = i
		}
	}
	if seal < 0 {
		t.Fatal("no seal record")
	}
	defer func() {
		if t.Failed() {
			var ks []string
			for _, r := range rs {
				ks = append(ks, r.Kind)
			}
			t.Logf("records: %v (the seal is #%d)", ks, seal)
		}
	}()
	open := map[string]int{} // what started and has not ended, before the seal
	for _, r := range rs[:seal] {
		b := r.Body
		switch {
		case r.Kind == "session" && b["event"] == "start":
			open["session "+fmt.Sprint(b["id"])]++
		case r.Kind == "session" && b["event"] == "end":
			open["session "+fmt.Sprint(b["id"])]--
		case r.Kind == "upstream" && b["event"] == "connected":
			open["upstream "+fmt.Sprint(b["name"], " session ", b["session"])]++
		case r.Kind == "upstream" && b["event"] == "disconnected":
			open["upstream "+fmt.Sprint(b["name"], " session ", b["session"])]--
		case r.Kind == "spawn" && b["outcome"] == "started":
			open["child "+fmt.Sprint(b["pid"])]++
		case r.Kind == "spawn" && b["outcome"] == "exited":
			open["child "+fmt.Sprint(b["pid"])]--
		}
	}
	sessions := 0
	for what, n := range open {
		if strings.HasPrefix(what, "session ") {
			sessions++
		}
		if n != 0 {
			t.Errorf("%s: %d more start(s) than end(s) before the seal", what, n)
		}
	}
	if sessions == 0 {
		t.Errorf("no session was recorded: %v", open)
	}
}

// TestGracefulStopRecordsEverythingBeforeTheSeal: a graceful stop (SIGTERM
// to `cmcp serve`; a signal to, or the agent's EOF on, `serve --stdio`)
// with a session open and its child running ends the session, disconnects
// and stops the child, and writes each of those records before the seal;
// none is lost to a closed log. The children ignore SIGTERM, so that each
// stop takes child_stop_grace: a session that an agent ended just before
// the stop is still ending when it begins.
func TestGracefulStopRecordsEverythingBeforeTheSeal(t *testing.T) {
	t.Run("http-SIGTERM", func(t *testing.T) {
		exe, pin := selfDigest(t)
		dir := t.TempDir()
		cfgPath := filepath.Join(dir, "cmcp.yaml")
		os.WriteFile(cfgPath, []byte(fmt.Sprintf(`version: 1
server: {listen: %s, tee: software, shutdown_grace: 10s, child_stop_grace: 1s}
audit: {dir: audit}
upstreams:
  - name: t
    stdio: {command: %s, env: {%s: ignoreterm}}
    pin: {command: %s}
`, freePort(t), exe, childEnv, pin)), 0o600)
		cmd, endpoint, stderr := startGatewayProcess(t, cfgPath)
		c := mcp.NewClient(&mcp.Implementation{Name: "a", Version: "1"}, nil)
		cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: endpoint, MaxRetries: -1}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := call(t, cs, "t__echo", map[string]any{"text": "a"}); err != nil {
			t.Fatal(err)
		}
		cs.Close() // its end and its child's stop are under way at the SIGTERM
		cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			t.Fatalf("gateway exit: %v\n%s", err, stderr.String())
		}
		checkStoppedLog(t, filepath.Join(dir, "audit"), stderr.String())
	})
	for _, how := range []string{"signal", "EOF"} {
		t.Run("stdio-"+how, func(t *testing.T) {
			st := serveStdioMode(t, "ignoreterm", "  shutdown_grace: 10s\n  child_stop_grace: 1s\n")
			if _, err := st.cs.CallTool(st.ctx, &mcp.CallToolParams{Name: "t__echo", Arguments: map[string]any{"text": "x"}}); err != nil {
				t.Fatal(err)
			}
			if how == "signal" {
				st.signal()
			} else {
				st.cs.Close()
			}
			st.wait(t)
			time.Sleep(200 * time.Millisecond) // a record written after Serve returned would show in the log
			checkStoppedLog(t, filepath.Join(st.dir, "audit"), st.logs.String())
		})
	}
}
