package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/front/httpfront"
	"github.com/confidential-mcp/cmcp/internal/gateway"
	"github.com/confidential-mcp/cmcp/internal/killswitch"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// killSwitchGateway is a configuration for a gateway process with an agent
// token and an admin listener, whose audit directory is dir/audit.
func killSwitchGateway(t *testing.T, dir string) (cfgPath, admin string) {
	t.Helper()
	exe, pin := selfDigest(t)
	adminAddr := freePort(t)
	cfgPath = filepath.Join(dir, "cmcp.yaml")
	if err := os.WriteFile(cfgPath, []byte(fmt.Sprintf(`version: 1
server:
  listen: 127.0.0.1:0
  tee: software
  shutdown_grace: 5s
  tokens:
    - identity: agent-a
      sha256: %s
audit: {dir: audit}
admin:
  listen: %s
  token_sha256: %s
upstreams:
  - name: t
    stdio: {command: %s, env: {%s: server}}
    pin: {command: %s}
`, httpfront.TokenDigest(testAgentToken), adminAddr, httpfront.TokenDigest(testAdminToken), exe, childEnv, pin)), 0o600); err != nil {
		t.Fatal(err)
	}
	return cfgPath, "http://" + adminAddr
}

// callOnce opens an agent session on endpoint, makes one echo call and
// returns its error.
func callOnce(t *testing.T, endpoint string) error {
	t.Helper()
	cs, err := connectWith(endpoint, testAgentToken)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer cs.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "t__echo", Arguments: map[string]any{"text": "x"}})
	return err
}

// lastEpochAdmin returns the admin records of the newest epoch in dir.
func lastEpochAdmin(t *testing.T, dir string) []*record.Admin {
	t.Helper()
	var out []*record.Admin
	for _, e := range logEntries(t, dir) {
		switch r := e.Rec.(type) {
		case *record.Genesis:
			out = nil
		case *record.Admin:
			out = append(out, r)
		}
	}
	return out
}

func stopGateway(t *testing.T, cmd *exec.Cmd, sig syscall.Signal) {
	t.Helper()
	if err := cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	if sig == syscall.SIGTERM && err != nil {
		t.Fatalf("gateway stopped with SIGTERM: %v", err)
	}
}

// TestKillSwitchSurvivesRestart: a kill switch engaged when the gateway is
// stopped (SIGTERM) or killed (SIGKILL) is still engaged when it starts
// again on the same audit directory: calls are refused (-32064), the admin
// status says who engaged it and why, and the new epoch holds a
// kill_switch_on record saying it was carried over. Once cleared (recorded)
// a restart lets calls through, with no carried-over record.
func TestKillSwitchSurvivesRestart(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			dir := t.TempDir()
			cfgPath, admin := killSwitchGateway(t, dir)
			auditDir := filepath.Join(dir, "audit")
			state := filepath.Join(auditDir, killswitch.StateFile)

			cmd, endpoint, stderr := startGatewayProcess(t, cfgPath)
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			if err := callOnce(t, endpoint); err != nil {
				t.Fatalf("call before the kill switch: %v", err)
			}
			code, body := adminPost(t, admin+"/admin/kill-switch/engage", `{"reason":"incident 7"}`)
			if code != 200 {
				t.Fatalf("engage: %d %s", code, body)
			}
			if _, err := os.Stat(state); err != nil {
				t.Fatalf("no state file after engaging: %v", err)
			}
			if err := callOnce(t, endpoint); wireCode(err) != gateway.CodeKillSwitch {
				t.Fatalf("call while engaged: %v", err)
			}
			stopGateway(t, cmd, sig)

			// Restarted: still engaged.
			cmd2, endpoint2, stderr2 := startGatewayProcess(t, cfgPath)
			t.Cleanup(func() { cmd2.Process.Kill(); cmd2.Wait() })
			if err := callOnce(t, endpoint2); wireCode(err) != gateway.CodeKillSwitch {
				t.Fatalf("call after the restart: %v, want %d\n%s", err, gateway.CodeKillSwitch, clip(stderr2.String(), 3000))
			}
			if !strings.Contains(stderr2.String(), "stays ENGAGED") {
				t.Errorf("the restarted gateway did not say the kill switch is engaged:\n%s", clip(stderr2.String(), 3000))
			}
			code, body = httpDo(t, "GET", admin+"/admin/kill-switch", testAdminToken)
			var st killswitch.Status
			if err := json.Unmarshal([]byte(body), &st); err != nil || code != 200 || !st.Engaged || st.Reason != "incident 7" ||
				!strings.HasPrefix(st.Actor, "admin-token@127.0.0.1") || st.Since.IsZero() {
				t.Fatalf("status after the restart: %d %s", code, body)
			}
			if code, _ := httpDo(t, "GET", admin+"/readyz", ""); code != 503 {
				t.Errorf("readyz after the restart: %d, want 503", code)
			}
			recs := lastEpochAdmin(t, auditDir)
			if len(recs) != 1 || recs[0].Action != gateway.AdminKillSwitchOn || recs[0].Actor != gateway.KillSwitchRestartActor ||
				!strings.Contains(recs[0].Reason, "carried over from before the restart") || !strings.Contains(recs[0].Reason, "incident 7") {
				t.Fatalf("admin records of the new epoch: %+v", recs)
			}

			// Cleared through the admin API: recorded, the state file
			// gone, calls flow, and still after another restart.
			if code, body := adminPost(t, admin+"/admin/kill-switch/clear", `{"reason":"resolved"}`); code != 200 {
				t.Fatalf("clear: %d %s", code, body)
			}
			if _, err := os.Stat(state); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("state file after clearing: %v", err)
			}
			if err := callOnce(t, endpoint2); err != nil {
				t.Fatalf("call after clearing: %v", err)
			}
			stopGateway(t, cmd2, syscall.SIGTERM)
			cmd3, endpoint3, _ := startGatewayProcess(t, cfgPath)
			t.Cleanup(func() { cmd3.Process.Kill(); cmd3.Wait() })
			if err := callOnce(t, endpoint3); err != nil {
				t.Fatalf("call after clearing and restarting: %v", err)
			}
			if recs := lastEpochAdmin(t, auditDir); len(recs) != 0 {
				t.Fatalf("admin records after a clean restart: %+v", recs)
			}
			stopGateway(t, cmd3, syscall.SIGTERM)
			if _, err := auditlog.Verify(auditDir, auditlog.VerifyOptions{}); err != nil {
				t.Fatalf("the log does not verify: %v", err)
			}
			if t.Failed() {
				t.Logf("first gateway:\n%s", clip(stderr.String(), 3000))
			}
		})
	}
}

// TestKillSwitchUnreadableStateFailsClosed: a state file the gateway cannot
// read (garbage, or a directory in its place) makes it start engaged, say
// so in its log, and record a carried-over kill_switch_on naming the
// problem; clearing it through the admin API lets calls through.
func TestKillSwitchUnreadableStateFailsClosed(t *testing.T) {
	for _, bad := range []string{"garbage", "directory"} {
		t.Run(bad, func(t *testing.T) {
			dir := t.TempDir()
			cfgPath, admin := killSwitchGateway(t, dir)
			auditDir := filepath.Join(dir, "audit")
			state := filepath.Join(auditDir, killswitch.StateFile)
			if err := os.MkdirAll(auditDir, 0o700); err != nil {
				t.Fatal(err)
			}
			if bad == "garbage" {
				if err := os.WriteFile(state, []byte("{\"engaged\": tr"), 0o600); err != nil {
					t.Fatal(err)
				}
			} else if err := os.Mkdir(state, 0o700); err != nil {
				t.Fatal(err)
			}
			cmd, endpoint, stderr := startGatewayProcess(t, cfgPath)
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			if err := callOnce(t, endpoint); wireCode(err) != gateway.CodeKillSwitch {
				t.Fatalf("call with an unreadable state file: %v, want %d", err, gateway.CodeKillSwitch)
			}
			if !strings.Contains(stderr.String(), "state file cannot be read") || !strings.Contains(stderr.String(), "fail closed") {
				t.Errorf("the gateway log does not say why it is engaged:\n%s", clip(stderr.String(), 3000))
			}
			recs := lastEpochAdmin(t, auditDir)
			if len(recs) != 1 || recs[0].Action != gateway.AdminKillSwitchOn || !strings.Contains(recs[0].Reason, "cannot be read") {
				t.Fatalf("admin records: %+v", recs)
			}
			code, body := adminPost(t, admin+"/admin/kill-switch/clear", "")
			if code != 200 {
				t.Fatalf("clear: %d %s", code, body)
			}
			if err := callOnce(t, endpoint); err != nil {
				t.Fatalf("call after clearing: %v", err)
			}
			if _, err := os.Stat(state); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("state file after clearing: %v", err)
			}
			var actions []string
			for _, r := range lastEpochAdmin(t, auditDir) {
				actions = append(actions, r.Action)
			}
			if strings.Join(actions, ",") != "kill_switch_on,kill_switch_off" {
				t.Fatalf("admin records: %v", actions)
			}
			stopGateway(t, cmd, syscall.SIGTERM)
		})
	}
}

func adminPost(t *testing.T, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testAdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
