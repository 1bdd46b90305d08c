package server

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/confidential-mcp/cmcp/internal/connect"
	"github.com/confidential-mcp/cmcp/internal/gwtest"
	"github.com/confidential-mcp/cmcp/internal/upstream"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// TestServeTunnelUpstream runs `serve` with a tunnel upstream and a
// machine token, and a connector that dials its /tunnel endpoint with a
// pinned stdio server: the agent lists the machine's tools (loaded once
// it registered) and calls one, recorded with the evidence class tunnel.
// A machine whose server publishes other tools is refused.
func TestServeTunnelUpstream(t *testing.T) {
	exe, pin := selfDigest(t)
	const token = "machine-token-serve-test"
	dir := t.TempDir()
	yaml := fmt.Sprintf(`version: 1
server:
  listen: 127.0.0.1:0
  tee: software
audit:
  dir: audit
upstreams:
  - name: files
    tunnel:
      tokens:
        - sha256: %s
`, digest.Bytes([]byte(token)))
	endpoint, audit := serveYAML(t, dir, yaml, os.Environ())
	tunnelURL := strings.TrimSuffix(endpoint, "/mcp") + "/tunnel"
	run := func(machine, mode string) chan connect.State {
		states := make(chan connect.State, 16)
		c, err := connect.New(connect.Options{Gateway: tunnelURL, Token: token, Upstream: "files", MachineID: machine,
			Stdio:          &upstream.StdioSpec{Name: "files", Command: exe, Pin: pin, StopGrace: 2 * time.Second, Env: map[string]string{gwtest.ChildEnv: mode}},
			InitialBackoff: 100 * time.Millisecond, MaxBackoff: time.Second,
			State: func(s connect.State) {
				select {
				case states <- s:
				default:
				}
			}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { c.Run(ctx); close(done) }()
		t.Cleanup(func() { cancel(); <-done })
		return states
	}
	run("lab-1", "server")
	cs, err := connectWith(endpoint, "")
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	eventually(t, 60*time.Second, func() string {
		r, err := cs.ListTools(context.Background(), nil)
		if err != nil {
			return err.Error()
		}
		for _, tool := range r.Tools {
			if tool.Name == "files__echo" {
				return ""
			}
		}
		return fmt.Sprintf("%d tools, no files__echo yet", len(r.Tools))
	})
	res, err := call(t, cs, "files__echo", map[string]any{"text": "through the tunnel"})
	if err != nil || !strings.Contains(firstText(res), "through the tunnel") {
		t.Fatalf("call through the tunnel: %v %v", firstText(res), err)
	}
	var found bool
	for _, r := range readRecords(t, audit) {
		if r.Kind == "call" && r.Body["tool"] == "files__echo" {
			found = true
			if r.Body["evidence_class"] != upstream.ClassTunnel {
				t.Fatalf("call recorded with class %v, want tunnel", r.Body["evidence_class"])
			}
		}
	}
	if !found {
		t.Fatal("no call record")
	}
	// Another server (its echo's description differs): refused.
	states := run("lab-2", "drift")
	for s := range states {
		if s.Kind == "registered" {
			continue
		}
		if s.Err == nil || !strings.Contains(s.Err.Error(), `publishes other tools`) {
			t.Fatalf("a machine with other tools: %+v", s)
		}
		break
	}
}
