package cli

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/proctest"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// forker is the test binary as an upstream (CMCP_TEST_FORKER=server) whose
// tools leave orphans behind, as npx leaves node: "orphans" double-forks
// grandchildren into the server's process group (one ends at once, one
// sleeps until it is killed), "die" ends the server mid-call.
func forker(mode string) int {
	self := func(mode, arg string) *exec.Cmd {
		c := exec.Command("/proc/self/exe", arg)
		c.Env = []string{"CMCP_TEST_FORKER=" + mode}
		return c
	}
	switch mode {
	case "server":
		s := mcp.NewServer(&mcp.Implementation{Name: "forker", Version: "1"}, nil)
		mcp.AddTool(s, &mcp.Tool{Name: "orphans"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
			for range 2 {
				if err := self("fork", "").Run(); err != nil {
					return nil, nil, err
				}
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil, nil
		})
		mcp.AddTool(s, &mcp.Tool{Name: "die"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
			os.Exit(1)
			return nil, nil, nil
		})
		if err := s.Run(context.Background(), &mcp.StdioTransport{}); err != nil {
			return 1
		}
		return 0
	case "fork": // start the grandchildren and leave them
		self("sleep", "10ms").Start()
		self("sleep", "1h").Start()
		return 0
	case "sleep":
		d, _ := time.ParseDuration(os.Args[1])
		time.Sleep(d)
		return 0
	}
	return 2
}

// TestServeAsPID1ReapsOrphans: `cmcp serve --stdio` run as process 1 of a
// PID namespace (a container started without --init) reaps the orphans its
// upstreams leave: grandchildren that end by themselves, and those killed
// with the group of a child that died and was respawned. Before, every one
// stayed a zombie of the gateway for as long as it ran, until the namespace
// ran out of PIDs. The stdio session works through cmcp's init, SIGTERM to
// process 1 stops the gateway gracefully (the log is sealed) and process 1
// exits 0, the gateway's status.
func TestServeAsPID1ReapsOrphans(t *testing.T) {
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("unshare(1) is not installed: cannot run cmcp as PID 1")
	}
	if out, err := exec.Command("unshare", "-fp", "--kill-child", "true").CombinedOutput(); err != nil {
		t.Skipf("cannot make a PID namespace here (unshare -fp: %v %s): needs root or CAP_SYS_ADMIN", err, bytes.TrimSpace(out))
	}
	tmp := t.TempDir()
	f, pin, err := digest.OpenFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	cfgPath := filepath.Join(tmp, "cmcp.yaml")
	cfg := "version: 1\nserver:\n  tee: software\n  child_stop_grace: 1s\naudit:\n  dir: audit\n" +
		"upstreams:\n  - name: f\n    stdio:\n      command: " + os.Args[0] + "\n      env: {CMCP_TEST_FORKER: server}\n    pin:\n      command: " + pin.String() + "\n"
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	stderrPath := filepath.Join(tmp, "stderr")
	stderr, err := os.Create(stderrPath)
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close()
	logs := func() string { b, _ := os.ReadFile(stderrPath); return string(b) }

	gw := exec.Command("unshare", "-fp", "--kill-child", os.Args[0], "serve", "--stdio", "-c", cfgPath)
	gw.Env = append(os.Environ(), "CMCP_CLI_CHILD=1")
	gw.Stderr = stderr
	in, err := gw.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := gw.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- gw.Wait() }()
	defer func() {
		if gw.ProcessState == nil {
			gw.Process.Kill()
			<-exited
		}
	}()

	// A bound for the whole session, not a delay: four spawns of the
	// measured, contained child took over a minute on a loaded machine.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := mcp.NewClient(&mcp.Implementation{Name: "cli-test", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &mcp.IOTransport{Reader: out, Writer: in}, nil)
	if err != nil {
		t.Fatalf("connect over stdio: %v\n%s", err, logs())
	}
	defer cs.Close()
	call := func(tool string) *mcp.CallToolResult {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "f__" + tool, Arguments: map[string]any{}})
		if tool == "die" {
			if err == nil && !res.IsError {
				t.Fatalf("die: %v", res)
			}
			return nil
		}
		if err != nil || res.IsError {
			t.Fatalf("%s: %v %v\n%s", tool, res, err, logs())
		}
		return res
	}
	// Each round leaves orphans, then the child dies: its group (the
	// sleeping orphans) is killed, and the next call respawns it.
	for range 3 {
		call("orphans")
		call("die")
	}
	call("orphans")

	init := proctest.ChildOf(t, gw.Process.Pid)
	deadline := time.Now().Add(15 * time.Second)
	for z := proctest.ZombiesOf(t, init); len(z) > 0; z = proctest.ZombiesOf(t, init) {
		if time.Now().After(deadline) {
			t.Fatalf("zombies left with process 1 (host pid %d) as parent: %v", init, z)
		}
		time.Sleep(100 * time.Millisecond)
	}

	if err := syscall.Kill(init, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit after SIGTERM to process 1: %v, want 0\n%s", err, logs())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the gateway did not stop on SIGTERM to process 1\n%s", logs())
	}
	rep, err := auditlog.Verify(filepath.Join(tmp, "audit"), auditlog.VerifyOptions{})
	if err != nil || !rep.Epochs[len(rep.Epochs)-1].Sealed {
		t.Fatalf("the log after SIGTERM: %v (sealed: %v)", err, err == nil && rep.Epochs[len(rep.Epochs)-1].Sealed)
	}
	if n := strings.Count(logs(), "cmcp: running as PID 1"); n != 1 {
		t.Fatalf("stderr says %d times that cmcp acts as init, want once:\n%s", n, logs())
	}
}
