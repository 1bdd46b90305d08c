package server

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

// TestStopCutsTheSharedUpstreamsProbe: a stop (SIGTERM) while the
// background re-probe of a shared upstream whose connection failed is
// starting its child (which never answers the handshake; connect_timeout
// 50 s) cuts that probe at once, as a per-session upstream's: Serve returns
// within shutdown_grace, and the probe child's exit and the upstream's
// failure are recorded before the seal.
func TestStopCutsTheSharedUpstreamsProbe(t *testing.T) {
	mark := filepath.Join(t.TempDir(), "hang")
	const grace = 3 * time.Second
	// The mode is the first entry of the child's env mapping: the mark's
	// path is the second.
	st := serveStdioMode(t, "failhang, CMCP_TEST_MARK: "+mark,
		fmt.Sprintf("  connect_timeout: 50s\n  shutdown_grace: %s\n  child_stop_grace: 1s\n", grace),
		"    lifecycle: shared\n")
	if err := os.WriteFile(mark, nil, 0o600); err != nil { // the next probe's child hangs
		t.Fatal(err)
	}
	audit := filepath.Join(st.dir, "audit")
	before := len(readRecords(t, audit)) // the failed starts
	probePid := ""
	eventually(t, 15*time.Second, func() string {
		for _, r := range kinds(readRecords(t, audit)[before:], "spawn") {
			if r.Body["outcome"] == "started" {
				probePid = fmt.Sprint(r.Body["pid"])
				return ""
			}
		}
		return "no probe child started"
	})
	time.Sleep(300 * time.Millisecond) // in its handshake
	st.signal()
	t0 := time.Now()
	select {
	case err := <-st.done:
		if err != nil {
			t.Fatalf("Serve: %v\n%s", err, st.logs.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("Serve did not return\n%s", st.logs.String())
	}
	if d := time.Since(t0); d > grace+2*time.Second {
		t.Errorf("Serve returned %v after the stop, want within shutdown_grace (%v)", d.Round(time.Millisecond), grace)
	}
	time.Sleep(200 * time.Millisecond) // a record written after Serve returned would show in the log
	rs := readRecords(t, audit)
	started, exited, failed := false, false, false
	for _, r := range rs {
		switch {
		case r.Kind == "seal":
			if !exited || !failed {
				t.Errorf("before the seal: probe child %s exit recorded %v, upstream failure recorded %v", probePid, exited, failed)
			}
		case r.Kind == "spawn" && fmt.Sprint(r.Body["pid"]) == probePid:
			started = true
			exited = exited || r.Body["outcome"] == "exited"
		case r.Kind == "upstream" && r.Body["event"] == "failed" && started:
			failed = true
		}
	}
	checkStoppedLog(t, audit, st.logs.String())
}
