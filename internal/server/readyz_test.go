package server

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/confidential-mcp/cmcp/internal/front/httpfront"
)

// TestReadyzNotReadyDuringTheDrain: once SIGTERM starts the drain the MCP
// listener takes no new connection, so /readyz answers 503 ("shutting
// down" with the admin token) for the whole drain, while a call in flight
// is still running, not 200 until the process is gone.
func TestReadyzNotReadyDuringTheDrain(t *testing.T) {
	const grace = 4 * time.Second
	exe, pin := selfDigest(t)
	dir := t.TempDir()
	adminAddr := freePort(t)
	cfgPath := filepath.Join(dir, "cmcp.yaml")
	os.WriteFile(cfgPath, []byte(fmt.Sprintf(`version: 1
server: {listen: %s, tee: software, shutdown_grace: %s}
audit: {dir: audit}
admin: {listen: %s, token_sha256: %s}
upstreams:
  - name: t
    stdio: {command: %s, env: {%s: server}}
    pin: {command: %s}
`, freePort(t), grace, adminAddr, httpfront.TokenDigest(testAdminToken), exe, childEnv, pin)), 0o600)
	cmd, endpoint, stderr := startGatewayProcess(t, cfgPath)
	readyz := "http://" + adminAddr + "/readyz"
	if code, body := httpDo(t, "GET", readyz, testAdminToken); code != 200 {
		t.Fatalf("readyz before the drain: %d %s", code, body)
	}
	cs, err := connectWith(endpoint, "")
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	answered := make(chan struct{})
	go func() {
		defer close(answered)
		postCall(endpoint, cs.ID(), "", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t__sleep","arguments":{"text":"10s"}}}`)
	}()
	waitForwarded(t, filepath.Join(dir, "audit"), "t__sleep", 1)
	cmd.Process.Signal(syscall.SIGTERM)
	time.Sleep(300 * time.Millisecond)
	for i := 0; i < 3; i++ {
		select {
		case <-answered:
			t.Fatal("the call in flight was answered before the drain could be observed")
		default:
		}
		code, body := httpDo(t, "GET", readyz, testAdminToken)
		if code != 503 || !strings.Contains(body, "shutting down") {
			t.Fatalf("readyz %v into the drain: %d %q, want 503 shutting down", time.Duration(i)*500*time.Millisecond, code, body)
		}
		if code, body := httpDo(t, "GET", readyz, ""); code != 503 || strings.Contains(body, "shutting") {
			t.Fatalf("readyz without the token during the drain: %d %q, want 503 without the reason", code, body)
		}
		time.Sleep(500 * time.Millisecond)
	}
	<-answered
	if err := cmd.Wait(); err != nil {
		t.Fatalf("gateway exit: %v\n%s", err, stderr.String())
	}
}
