package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// startCmcp starts the test binary as cmcp with args; its stderr goes to
// the returned buffer. The process is killed at the end of the test if it
// still runs.
func startCmcp(t *testing.T, args ...string) (*exec.Cmd, *syncBuffer, <-chan error) {
	t.Helper()
	var stderr syncBuffer
	c := exec.Command(os.Args[0], args...)
	c.Env = append(os.Environ(), "CMCP_CLI_CHILD=1")
	c.Stderr = &stderr
	c.WaitDelay = 5 * time.Second // a grandchild holding stderr open does not hold Wait
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	done := make(chan struct{})
	go func() { exited <- c.Wait(); close(done) }()
	t.Cleanup(func() {
		select {
		case <-done:
		default:
			c.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("%s stderr:\n%s", args[0], stderr.String())
		}
	})
	return c, &stderr, exited
}

// waitFor polls f (every 100 ms) until it returns "" or the time is up.
func waitFor(t *testing.T, within time.Duration, f func() string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		why := f()
		if why == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", within, why)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestServeConnectMachineRecords runs a real `cmcp serve` with a tunnel
// upstream and real `cmcp connect` processes: a machine registering, one
// refused for a wrong token, and the first one killed each leave a signed
// machine record (registered: id, name, the pin and digest it claimed,
// class tunnel, host facts, which token matched; refused: why; gone: why
// and for how long it had been registered). No machine token appears
// anywhere in the audit directory, verify-chain verifies the log and
// replay reads it. The admin listener lists the machines (GET
// /admin/machines and /readyz, to the admin token only; a tunnel upstream
// with no machine leaves the gateway ready and is named) and /metrics
// counts them.
func TestServeConnectMachineRecords(t *testing.T) {
	if testing.Short() {
		t.Skip("runs cmcp serve and cmcp connect processes")
	}
	tmp := t.TempDir()
	server, pin := buildSampleServer(t, tmp)
	const goodToken, groupToken, wrongToken = "machine-token-lab-1-5b3a9d", "group-token-7c1e44", "wrong-token-0f9e2a"
	for name, tok := range map[string]string{"good.token": goodToken, "group.token": groupToken, "wrong.token": wrongToken} {
		if err := os.WriteFile(filepath.Join(tmp, name), []byte(tok+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	aln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	adminAddr := aln.Addr().String()
	aln.Close()
	const adminToken = "admin-token-for-the-machines-test"
	cfg := "version: 1\nserver:\n  listen: " + addr + "\n  tee: software\naudit:\n  dir: audit\n" +
		"admin:\n  listen: " + adminAddr + "\n  token_sha256: " + digest.Bytes([]byte(adminToken)).String() + "\n" +
		"upstreams:\n  - name: files\n    tunnel:\n      tokens:\n" +
		"        - sha256: " + digest.Bytes([]byte(groupToken)).String() + "\n" +
		"        - sha256: " + digest.Bytes([]byte(goodToken)).String() + "\n          machines: [lab-1]\n"
	cfgPath := filepath.Join(tmp, "cmcp.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	gw, _, exited := startCmcp(t, "serve", "-c", cfgPath)
	cs := connectWhenServing(t, addr, exited)
	defer cs.Close()

	// The admin listener: /readyz names the machines (to the admin token
	// only), GET /admin/machines lists them (behind the token), /metrics
	// counts them.
	admin := func(path, token string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, "http://"+adminAddr+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// Before any machine: ready (its machines must be able to reach it),
	// and /readyz says the upstream has none.
	if code, body := admin("/readyz", adminToken); code != 200 || !strings.Contains(body, "tunnel upstream files: no machine connected") {
		t.Errorf("/readyz before any machine: %d %q, want ready, saying no machine is connected", code, body)
	}
	connectArgs := func(tokenFile, machine string) []string {
		return []string{"connect", "--gateway", "http://" + addr + "/tunnel", "--token-file", filepath.Join(tmp, tokenFile), "--name", "files",
			"--machine-id", machine, "--machine-name", machine + " bench", "--pin", pin.String(), "--backoff-initial", "100ms", "--backoff-max", "1m",
			"--", server, "--root", tmp}
	}
	lab1, _, lab1Exited := startCmcp(t, connectArgs("good.token", "lab-1")...)
	call := func(args map[string]any) (*mcp.CallToolResult, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		return cs.CallTool(ctx, &mcp.CallToolParams{Name: "files__echo", Arguments: args})
	}
	waitFor(t, 90*time.Second, func() string {
		r, err := call(map[string]any{"text": "hi", "machineId": "lab-1"})
		if err != nil {
			return err.Error()
		}
		if r.IsError {
			return "lab-1 is not routable yet"
		}
		return ""
	})
	if code, body := admin("/readyz", adminToken); code != 200 || !strings.Contains(body, "tunnel upstream files: 1 machine connected (lab-1)") {
		t.Errorf("/readyz with the token: %d %q", code, body)
	}
	if code, body := admin("/readyz", ""); code != 200 || strings.Contains(body, "lab-1") {
		t.Errorf("/readyz without the token: %d %q, want ready and no machine named", code, body)
	}
	if code, body := admin("/admin/machines", ""); code != http.StatusUnauthorized || strings.Contains(body, "lab-1") {
		t.Errorf("/admin/machines without the token: %d %q", code, body)
	}
	code, body := admin("/admin/machines", adminToken)
	var listed struct {
		Upstreams []struct {
			Name     string
			Machines []struct {
				ID, Name string
				Server   struct{ Digest string }
			}
		}
	}
	if err := json.Unmarshal([]byte(body), &listed); err != nil || code != 200 || len(listed.Upstreams) != 1 || listed.Upstreams[0].Name != "files" ||
		len(listed.Upstreams[0].Machines) != 1 || listed.Upstreams[0].Machines[0].ID != "lab-1" || listed.Upstreams[0].Machines[0].Server.Digest != pin.String() {
		t.Errorf("/admin/machines: %d %s (%v)", code, body, err)
	}
	if strings.Contains(body, goodToken) {
		t.Errorf("/admin/machines shows a machine token")
	}
	if _, body := admin("/metrics", adminToken); !strings.Contains(body, "cmcp_tunnel_machines 1\n") || !strings.Contains(body, "cmcp_tunnel_registrations_total 1\n") {
		t.Errorf("/metrics: no tunnel machine counted:\n%s", body)
	}

	_, wrongErr, _ := startCmcp(t, connectArgs("wrong.token", "lab-2")...)
	waitFor(t, 60*time.Second, func() string {
		if !strings.Contains(wrongErr.String(), "unauthorized") {
			return "the connector with a wrong token was not refused"
		}
		return ""
	})
	lab1.Process.Signal(syscall.SIGKILL)
	<-lab1Exited
	waitFor(t, 60*time.Second, func() string {
		r, err := call(map[string]any{"text": "hi", "machineId": "lab-1"})
		if err == nil && !r.IsError {
			return "lab-1 still routable after its connector was killed"
		}
		return ""
	})
	if code, body := admin("/readyz", adminToken); code != 200 || !strings.Contains(body, "tunnel upstream files: no machine connected") {
		t.Errorf("/readyz with no machine: %d %q, want ready, saying no machine is connected", code, body)
	}
	if _, body := admin("/metrics", adminToken); !strings.Contains(body, "cmcp_tunnel_machines 0\n") || !strings.Contains(body, "cmcp_tunnel_machines_gone_total 1\n") || strings.Contains(body, "cmcp_tunnel_refusals_total 0\n") {
		t.Errorf("/metrics after the refusal and the machine gone:\n%s", body)
	}
	cs.Close()
	stopServe(t, gw, exited)

	auditDir := filepath.Join(tmp, "audit")
	var machines []*record.Machine
	var callMachines []string
	r, err := auditlog.NewReader(auditDir)
	if err != nil {
		t.Fatal(err)
	}
	for {
		e, err := r.Next()
		if err != nil {
			break
		}
		rec, err := e.Decode()
		if err != nil {
			t.Fatal(err)
		}
		switch rec := rec.(type) {
		case *record.Machine:
			machines = append(machines, rec)
		case *record.Call:
			callMachines = append(callMachines, rec.Machine)
		}
	}
	r.Close()
	byEvent := map[string][]*record.Machine{}
	for _, m := range machines {
		byEvent[m.Event] = append(byEvent[m.Event], m)
	}
	reg := byEvent[record.MachineRegistered]
	if len(reg) != 1 {
		t.Fatalf("%d registered records, want 1: %+v", len(reg), machines)
	}
	if m := reg[0]; m.Upstream != "files" || m.Machine != "lab-1" || m.Name != "lab-1 bench" || m.TokenID != "tokens[1]" || m.Class != "tunnel" ||
		m.Server == nil || m.Server.Kind != "stdio" || m.Server.Pin != pin.String() || m.Server.Digest != pin.String() ||
		m.Host == nil || m.Host.OS == "" || m.Host.CPUs == 0 || m.Version == "" || m.Remote == "" {
		t.Errorf("registered record: %+v server %+v host %+v", m, m.Server, m.Host)
	}
	refused := byEvent[record.MachineRefused]
	if len(refused) == 0 || refused[0].Machine != "lab-2" || refused[0].Code != "unauthorized" || refused[0].TokenID != "" || !strings.Contains(refused[0].Reason, "not a machine token") {
		t.Errorf("refused records: %+v", refused)
	}
	gone := byEvent[record.MachineGone]
	if len(gone) != 1 || gone[0].Machine != "lab-1" || gone[0].Reason == "" || gone[0].ConnectedMS <= 0 || gone[0].TokenID != "tokens[1]" {
		t.Errorf("gone records: %+v", gone)
	}
	if len(callMachines) == 0 || callMachines[0] != "lab-1" {
		t.Errorf("call records name machines %v, want lab-1 first", callMachines)
	}
	// No token, in any file of the audit directory.
	filepath.Walk(auditDir, func(p string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() {
			return err
		}
		b, _ := os.ReadFile(p)
		for _, tok := range []string{goodToken, groupToken, wrongToken} {
			if bytes.Contains(b, []byte(tok)) {
				t.Errorf("%s holds a machine token", p)
			}
		}
		return nil
	})
	// The machine records match docs/schema/audit-record.schema.json.
	if kinds := validateAuditLog(t, auditDir); kinds["machine"] == 0 {
		t.Errorf("no machine record checked against the schema: %v", kinds)
	}
	if out, errs, code := run("verify-chain", auditDir); code != 0 {
		t.Fatalf("verify-chain: %d\n%s\n%s", code, out, errs)
	}
	if out, errs, code := run("replay", auditDir); code != 0 || !strings.Contains(out, "files__echo") || strings.Contains(out+errs, "no machine record") {
		t.Fatalf("replay: %d\n%s\n%s", code, out, errs)
	}
}
