package server

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/connect"
	"github.com/confidential-mcp/cmcp/internal/gateway"
	"github.com/confidential-mcp/cmcp/internal/gwtest"
	"github.com/confidential-mcp/cmcp/internal/replay"
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

// runTunnelConnector runs `cmcp connect` (the library) for machine until
// the test ends, serving the pinned test server in mode.
func runTunnelConnector(t *testing.T, tunnelURL, token, machine, mode, exe string, pin digest.Digest) {
	t.Helper()
	c, err := connect.New(connect.Options{Gateway: tunnelURL, Token: token, Upstream: "files", MachineID: machine,
		Stdio:          &upstream.StdioSpec{Name: "files", Command: exe, Pin: pin, StopGrace: 2 * time.Second, Env: map[string]string{gwtest.ChildEnv: mode, "MACHINE": machine}},
		InitialBackoff: 100 * time.Millisecond, MaxBackoff: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// TestServeTunnelPolicySeesMachine: Cedar sees the machine a tunnel call
// is routed to as context.machine. A policy forbids agent alice on lab-2:
// her call there is denied, her call on lab-1 and bob's on lab-2 go
// through; the call records' policy input names the machine, and replay
// against the bundle re-decides every call the same.
func TestServeTunnelPolicySeesMachine(t *testing.T) {
	exe, pin := selfDigest(t)
	const token = "machine-token-policy-test"
	pdir := policyBundle(t, `@id("all") permit (principal, action, resource);
@id("alice-not-on-lab-2")
forbid (principal == Agent::"alice", action == Action::"call_tool", resource)
when { context has machine && context.machine == "lab-2" };
@id("bob-no-machine-list")
forbid (principal == Agent::"bob", action, resource == Tool::"files__list_machines");
`)
	pdigest, err := digest.Tree(context.Background(), pdir, digest.TreeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	yaml := fmt.Sprintf(`version: 1
server:
  listen: 127.0.0.1:0
  tee: software
  tokens: [{identity: alice, sha256: %s}, {identity: bob, sha256: %s}]
audit:
  dir: audit
policy:
  dir: %s
  expect: %s
  mode: enforcing
upstreams:
  - name: files
    tunnel:
      tokens:
        - sha256: %s
`, digest.Bytes([]byte("tok-alice")), digest.Bytes([]byte("tok-bob")), pdir, pdigest, digest.Bytes([]byte(token)))
	endpoint, audit := serveYAML(t, dir, yaml, os.Environ())
	tunnelURL := strings.TrimSuffix(endpoint, "/mcp") + "/tunnel"
	runTunnelConnector(t, tunnelURL, token, "lab-1", "server", exe, pin)
	runTunnelConnector(t, tunnelURL, token, "lab-2", "server", exe, pin)
	alice, err := connectWith(endpoint, "tok-alice")
	if err != nil {
		t.Fatal(err)
	}
	defer alice.Close()
	bob, err := connectWith(endpoint, "tok-bob")
	if err != nil {
		t.Fatal(err)
	}
	defer bob.Close()
	eventually(t, 60*time.Second, func() string {
		res, err := call(t, bob, "files__env", map[string]any{"machineId": "lab-2"})
		if err != nil {
			return err.Error()
		}
		if res.IsError || !strings.Contains(firstText(res), "MACHINE=lab-2") {
			return "lab-2 not serving bob yet: " + clip(firstText(res), 200)
		}
		return ""
	})
	if res, err := call(t, alice, "files__env", map[string]any{"machineId": "lab-1"}); err != nil || res.IsError || !strings.Contains(firstText(res), "MACHINE=lab-1") {
		t.Fatalf("alice on lab-1: %v %v", clip(firstText(res), 300), err)
	}
	_, err = call(t, alice, "files__env", map[string]any{"machineId": "lab-2"})
	if wireCode(err) != gateway.CodeDenied || !strings.Contains(err.Error(), "alice-not-on-lab-2") {
		t.Fatalf("alice on lab-2: want denied by alice-not-on-lab-2, got %v", err)
	}
	// tools/list: the gateway's files__list_machines, and a machineId
	// property on the machines' tools; the policy hides the list from bob.
	for _, who := range []struct {
		cs   *mcp.ClientSession
		list bool
	}{{alice, true}, {bob, false}} {
		r, err := who.cs.ListTools(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		var list, env bool
		for _, tool := range r.Tools {
			switch tool.Name {
			case "files__list_machines":
				list = true
			case "files__env":
				b, _ := json.Marshal(tool.InputSchema)
				env = strings.Contains(string(b), `"machineId":{"description":`) && strings.Contains(string(b), `"type":"string"`)
			}
		}
		if list != who.list || !env {
			t.Fatalf("tools/list: files__list_machines %v (want %v), files__env has machineId %v", list, who.list, env)
		}
	}
	res, err := call(t, alice, "files__list_machines", map[string]any{})
	if err != nil || res.IsError {
		t.Fatalf("list_machines: %v %v", clip(firstText(res), 300), err)
	}
	var listed struct {
		Upstream string `json:"upstream"`
		Machines []struct {
			ID            string         `json:"id"`
			Name          string         `json:"name"`
			Since         time.Time      `json:"connected_since"`
			LastHeartbeat time.Time      `json:"last_heartbeat"`
			Host          map[string]any `json:"host"`
		} `json:"machines"`
	}
	if err := json.Unmarshal([]byte(firstText(res)), &listed); err != nil || listed.Upstream != "files" || len(listed.Machines) != 2 {
		t.Fatalf("list_machines answered %s: %v", firstText(res), err)
	}
	for i, m := range listed.Machines {
		if m.ID != []string{"lab-1", "lab-2"}[i] || m.Since.IsZero() || m.Host == nil {
			t.Fatalf("list_machines machine %d: %+v", i, m)
		}
	}
	if _, err := call(t, bob, "files__list_machines", map[string]any{}); wireCode(err) != gateway.CodeDenied || !strings.Contains(err.Error(), "bob-no-machine-list") {
		t.Fatalf("bob's list_machines: want denied by bob-no-machine-list, got %v", err)
	}
	type seen struct{ agent, machine, decision string }
	var got []seen
	for _, r := range kinds(readRecords(t, audit), "call") {
		if r.Body["tool"] != "files__env" {
			continue
		}
		in, _ := r.Body["policy_input"].(map[string]any)
		if in == nil {
			continue // refused before the policy was asked (the upstream was loading)
		}
		if in["machine"] != r.Body["machine"] {
			t.Fatalf("call record's policy input does not name its machine %v: %v", r.Body["machine"], r.Body["policy_input"])
		}
		got = append(got, seen{r.Body["agent"].(string), r.Body["machine"].(string), r.Body["decision"].(string)})
	}
	var lists []seen
	for _, r := range kinds(readRecords(t, audit), "call") {
		if r.Body["tool"] == "files__list_machines" {
			if r.Body["evidence_class"] != upstream.ClassTunnel || r.Body["policy_input"] == nil {
				t.Fatalf("list_machines record: %v", r.Body)
			}
			lists = append(lists, seen{r.Body["agent"].(string), r.Body["outcome"].(string), r.Body["decision"].(string)})
		}
	}
	if !slices.Equal(lists, []seen{{"alice", "forwarded", "allow"}, {"bob", "refused", "deny"}}) {
		t.Fatalf("list_machines records (agent, outcome, decision): %v", lists)
	}
	want := seen{"alice", "lab-2", "deny"}
	if len(got) < 3 || got[len(got)-1] != want || !slices.Contains(got, seen{"alice", "lab-1", "allow"}) || !slices.Contains(got, seen{"bob", "lab-2", "allow"}) {
		t.Fatalf("call records (agent, machine, decision): %v", got)
	}
	rep, err := replay.Run(context.Background(), audit, replay.Options{Policies: []string{pdir}, Unverified: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Summary.Differs != 0 || rep.Summary.Same < 5 {
		t.Fatalf("replay: %+v", rep.Summary)
	}
}
