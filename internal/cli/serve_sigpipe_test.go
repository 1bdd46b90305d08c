package cli

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/pkg/auditlog"
)

// TestServeSurvivesAClosedStderr: a gateway whose log reader goes away
// (`cmcp serve 2>&1 | head`, a restarted log shipper) keeps serving, and
// still seals its log on SIGTERM. Go kills a process by SIGPIPE when a write
// to its stderr meets a closed pipe, unless the signal is handled: before,
// the next log line killed the gateway mid-call, its epoch unsealed.
func TestServeSurvivesAClosedStderr(t *testing.T) {
	tmp := t.TempDir()
	server, pin := buildSampleServer(t, tmp)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cfgPath := filepath.Join(tmp, "cmcp.yaml")
	cfg := "version: 1\nserver:\n  listen: " + addr + "\n  tee: software\naudit:\n  dir: audit\n" +
		"upstreams:\n  - name: files\n    stdio:\n      command: " + server + "\n      args: [--root, " + tmp + "]\n    pin:\n      command: " + pin.String() + "\n"
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	gw := exec.Command(os.Args[0], "serve", "-c", cfgPath, "--log-level", "debug")
	gw.Env = append(os.Environ(), "CMCP_CLI_CHILD=1")
	gw.Stderr = w
	if err := gw.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	exited := make(chan error, 1)
	go func() { exited <- gw.Wait() }()
	defer func() {
		if gw.ProcessState == nil {
			gw.Process.Kill()
			<-exited
		}
	}()
	// Read the first lines, then go away, as `head` does.
	buf := make([]byte, 512)
	r.Read(buf)
	r.Close()

	ctx := context.Background()
	cs := connectWhenServing(t, addr, exited)
	for i := range 3 {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		res, err := cs.CallTool(cctx, &mcp.CallToolParams{Name: "files__echo", Arguments: map[string]any{"text": "hi"}})
		cancel()
		if err != nil || res.IsError {
			t.Fatalf("call %d with the gateway's stderr closed: %v %v", i, res, err)
		}
	}
	cs.Close()
	stopServe(t, gw, exited)
	rep, err := auditlog.Verify(filepath.Join(tmp, "audit"), auditlog.VerifyOptions{})
	if err != nil || !rep.Epochs[len(rep.Epochs)-1].Sealed {
		t.Fatalf("the log after the run: %v (sealed: %v)", err, err == nil && rep.Epochs[len(rep.Epochs)-1].Sealed)
	}
}
