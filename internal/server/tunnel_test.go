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
			Stdio:          &upstream.StdioSpec{Name: "files", Command: exe, Pin: pin, StopGrace: 2 * time.Second, Env: map[string]string{gwtest.ChildEnv: mode, "MACHINE": machine}},
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
	// A second machine with the same server: a call needs machineId now,
	// goes where it says, and the record names the machine.
	run("lab-2", "server")
	eventually(t, 60*time.Second, func() string {
		res, err := call(t, cs, "files__env", map[string]any{})
		if err != nil {
			return err.Error()
		}
		if !res.IsError || !strings.Contains(firstText(res), "live machines: lab-1, lab-2") {
			return "no refusal listing both machines yet: " + clip(firstText(res), 200)
		}
		return ""
	})
	for _, m := range []string{"lab-1", "lab-2"} {
		res, err := call(t, cs, "files__env", map[string]any{"machineId": m})
		if err != nil || res.IsError || !strings.Contains(firstText(res), "MACHINE="+m) {
			t.Fatalf("call on %s: %v %v", m, clip(firstText(res), 300), err)
		}
	}
	res, err = call(t, cs, "files__env", map[string]any{"machineId": "lab-9"})
	if err != nil || !res.IsError || !strings.Contains(firstText(res), `machine "lab-9" of upstream "files" is not connected; live machines: lab-1, lab-2`) {
		t.Fatalf("unknown machine: %v %v", firstText(res), err)
	}
	machines := map[string]int{}
	for _, r := range readRecords(t, audit) {
		if r.Kind == "call" && r.Body["tool"] == "files__env" && r.Body["outcome"] == "forwarded" {
			m, _ := r.Body["machine"].(string)
			machines[m]++
		}
	}
	if machines["lab-1"] < 1 || machines["lab-2"] != 1 || machines[""] != 0 {
		t.Fatalf("forwarded calls by machine in the records: %v", machines)
	}
	// Another server (its echo's description differs): refused.
	states := run("lab-3", "drift")
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
