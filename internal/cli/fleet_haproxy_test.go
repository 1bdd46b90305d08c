//go:build peers

package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// servedBy records, per Mcp-Session-Id, the gateway HAProxy sent the
// answers to (the X-Served-By header the test's HAProxy adds).
type servedBy struct {
	mu sync.Mutex
	m  map[string]string
}

func (s *servedBy) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err == nil {
		if id, gw := resp.Header.Get("Mcp-Session-Id"), resp.Header.Get("X-Served-By"); id != "" && gw != "" {
			s.mu.Lock()
			s.m[id] = gw
			s.mu.Unlock()
		}
	}
	return resp, err
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestFleetBehindHAProxy: three gateways (real `cmcp serve` processes, each
// with a measured stdio child, an enforcing Cedar policy and its own audit
// log) behind a real HAProxy from Debian that keeps each MCP session on one
// gateway by its Mcp-Session-Id (learnt from the initialize response, as
// docs/fleet.md configures it). Sessions are driven through it; one gateway
// is killed: only its sessions end (their next call fails), every call of
// the other sessions is answered, and new sessions start on the others.
// Then the three logs verify at once (the killed one unsealed) and replay
// as one timeline.
func TestFleetBehindHAProxy(t *testing.T) {
	haproxy := os.Getenv("CMCP_HAPROXY")
	if haproxy == "" {
		t.Fatal(`CMCP_HAPROXY is not set: run eval "$(bash scripts/peers.sh)" first (it installs Debian's haproxy)`)
	}
	tmp := t.TempDir()
	server, pin := buildSampleServer(t, tmp)
	schema, err := os.ReadFile("../../examples/policy/schema.cedarschema")
	if err != nil {
		t.Fatal(err)
	}
	pdir := filepath.Join(tmp, "policy")
	os.MkdirAll(pdir, 0o755)
	os.WriteFile(filepath.Join(pdir, "schema.cedarschema"), schema, 0o644)
	os.WriteFile(filepath.Join(pdir, "policy.cedar"), []byte(filesPolicy), 0o644)
	expect, err := digest.Tree(context.Background(), pdir, digest.TreeOptions{})
	if err != nil {
		t.Fatal(err)
	}

	type gateway struct {
		name, addr, dir string
		cmd             *exec.Cmd
		exited          chan error
		stderr          *syncBuffer
	}
	var gws []*gateway
	for i := 1; i <= 3; i++ {
		g := &gateway{name: fmt.Sprintf("gw%d", i), addr: freeAddr(t), dir: filepath.Join(tmp, fmt.Sprintf("gw%d", i)), exited: make(chan error, 1), stderr: &syncBuffer{}}
		os.MkdirAll(g.dir, 0o755)
		cfg := "version: 1\nserver:\n  listen: " + g.addr + "\n  tee: software\naudit:\n  dir: audit\n" +
			"upstreams:\n  - name: files\n    stdio:\n      command: " + server + "\n      args: [--root, " + tmp + "]\n    pin:\n      command: " + pin.String() + "\n" +
			"policy:\n  dir: " + pdir + "\n  expect: " + expect.String() + "\n  mode: enforcing\n"
		cfgPath := filepath.Join(g.dir, "cmcp.yaml")
		if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		g.cmd = exec.Command(os.Args[0], "serve", "-c", cfgPath)
		g.cmd.Env = append(os.Environ(), "CMCP_CLI_CHILD=1")
		g.cmd.Stderr = g.stderr
		if err := g.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { g.exited <- g.cmd.Wait() }()
		gws = append(gws, g)
	}
	defer func() {
		for _, g := range gws {
			if g.cmd.ProcessState == nil {
				g.cmd.Process.Kill()
				<-g.exited
			}
			if t.Failed() {
				t.Logf("%s stderr:\n%s", g.name, g.stderr.String())
			}
		}
	}()
	for _, g := range gws {
		cs := connectWhenServing(t, g.addr, g.exited)
		cs.Close()
	}

	// HAProxy, configured as docs/fleet.md says, plus the header that
	// tells the test which gateway answered.
	lb := freeAddr(t)
	hcfg := fmt.Sprintf(`global
    log stderr format raw local0 warning
defaults
    mode http
    timeout connect 5s
    timeout client 1h
    timeout server 1h
    retries 3
    option redispatch
frontend mcp
    bind %s
    default_backend gw
backend gw
    balance roundrobin
    stick-table type string len 64 size 100k expire 30m
    stick store-response res.hdr(Mcp-Session-Id)
    stick match req.hdr(Mcp-Session-Id)
    http-response set-header X-Served-By %%s
    server gw1 %s check inter 200ms fall 1 rise 1
    server gw2 %s check inter 200ms fall 1 rise 1
    server gw3 %s check inter 200ms fall 1 rise 1
`, lb, gws[0].addr, gws[1].addr, gws[2].addr)
	hpath := filepath.Join(tmp, "haproxy.cfg")
	os.WriteFile(hpath, []byte(hcfg), 0o644)
	if out, err := exec.Command(haproxy, "-c", "-f", hpath).CombinedOutput(); err != nil {
		t.Fatalf("haproxy -c: %v\n%s", err, out)
	}
	var hlog syncBuffer
	hp := exec.Command(haproxy, "-db", "-f", hpath)
	hp.Stderr, hp.Stdout = &hlog, &hlog
	if err := hp.Start(); err != nil {
		t.Fatal(err)
	}
	hpExited := make(chan error, 1)
	go func() { hpExited <- hp.Wait() }()
	defer func() {
		hp.Process.Signal(syscall.SIGTERM)
		<-hpExited
		if t.Failed() {
			t.Logf("haproxy:\n%s", hlog.String())
		}
	}()

	sb := &servedBy{m: map[string]string{}}
	hc := &http.Client{Transport: sb}
	connect := func() (*mcp.ClientSession, error) {
		c := mcp.NewClient(&mcp.Implementation{Name: "fleet-test", Version: "1"}, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		return c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://" + lb + "/mcp", HTTPClient: hc, MaxRetries: -1}, nil)
	}
	call := func(cs *mcp.ClientSession, text string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "files__echo", Arguments: map[string]any{"text": text}})
		if err != nil {
			return err
		}
		if res.IsError {
			return fmt.Errorf("tool error: %v", res.Content)
		}
		return nil
	}
	var sessions []*mcp.ClientSession
	deadline := time.Now().Add(60 * time.Second)
	for len(sessions) < 6 {
		cs, err := connect()
		if err != nil {
			if time.Now().After(deadline) {
				t.Fatalf("connect through haproxy: %v", err)
			}
			time.Sleep(100 * time.Millisecond) // haproxy's first health checks
			continue
		}
		sessions = append(sessions, cs)
	}
	on := map[string][]*mcp.ClientSession{}
	for _, cs := range sessions {
		for i := range 3 {
			if err := call(cs, fmt.Sprintf("before %d", i)); err != nil {
				t.Fatalf("session %s: %v", cs.ID(), err)
			}
		}
		sb.mu.Lock()
		gw := sb.m[cs.ID()]
		sb.mu.Unlock()
		if gw == "" {
			t.Fatalf("session %s: no X-Served-By", cs.ID())
		}
		on[gw] = append(on[gw], cs)
	}
	if len(on["gw1"]) == 0 || len(on["gw2"]) == 0 || len(on["gw3"]) == 0 {
		t.Fatalf("round robin left a gateway without a session: %v", on)
	}
	// Sticky: every answer of a session came from one gateway.
	for gw, css := range on {
		for _, cs := range css {
			sb.mu.Lock()
			got := sb.m[cs.ID()]
			sb.mu.Unlock()
			if got != gw {
				t.Fatalf("session %s moved from %s to %s", cs.ID(), gw, got)
			}
		}
	}

	// Kill gw2.
	gws[1].cmd.Process.Signal(syscall.SIGKILL)
	<-gws[1].exited
	for _, cs := range on["gw2"] {
		if err := call(cs, "after"); err == nil {
			t.Fatalf("session %s of the killed gateway still answered", cs.ID())
		}
	}
	answered := 0
	for _, gw := range []string{"gw1", "gw3"} {
		for _, cs := range on[gw] {
			for i := range 5 {
				if err := call(cs, fmt.Sprintf("after %d", i)); err != nil {
					t.Fatalf("session %s on %s (not killed) failed: %v", cs.ID(), gw, err)
				}
				answered++
			}
		}
	}
	// New sessions start on the gateways that are left.
	for i := range 4 {
		cs, err := connect()
		if err != nil {
			t.Fatalf("new session %d after the kill: %v", i, err)
		}
		if err := call(cs, "new"); err != nil {
			t.Fatalf("new session %d after the kill: %v", i, err)
		}
		sb.mu.Lock()
		gw := sb.m[cs.ID()]
		sb.mu.Unlock()
		if gw == "gw2" {
			t.Fatalf("a new session went to the killed gateway")
		}
		cs.Close()
		answered++
	}
	t.Logf("sessions per gateway %d/%d/%d; gw2 killed: its %d sessions ended, %d calls of the others answered",
		len(on["gw1"]), len(on["gw2"]), len(on["gw3"]), len(on["gw2"]), answered)
	for _, cs := range sessions {
		cs.Close()
	}
	for _, g := range []*gateway{gws[0], gws[2]} {
		stopServe(t, g.cmd, g.exited)
	}
	// The three logs at once: all verify; the killed gateway's is unsealed.
	code, out, errOut := runCLI(t, "verify-chain", filepath.Join(gws[0].dir, "audit"), filepath.Join(gws[1].dir, "audit"), filepath.Join(gws[2].dir, "audit"))
	if code != 0 || !strings.Contains(out, "Result: VERIFIED: all 3 audit logs") || !strings.Contains(out, "is not sealed") {
		t.Fatalf("verify the fleet: exit %d\n%s%s", code, out, errOut)
	}
	// And replayed at once: one timeline, every session and call naming
	// its gateway's log, the calls in time order.
	dirs := []string{filepath.Join(gws[0].dir, "audit"), filepath.Join(gws[1].dir, "audit"), filepath.Join(gws[2].dir, "audit")}
	code, out, errOut = runCLI(t, append([]string{"replay", "-o", "json"}, dirs...)...)
	var doc struct {
		Sessions []struct{ Gateway, ID string } `json:"sessions"`
		Calls    []struct {
			Gateway string    `json:"gateway"`
			Time    time.Time `json:"time"`
			Tool    string    `json:"tool"`
		} `json:"calls"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil || code != 0 {
		t.Fatalf("replay the fleet: exit %d: %v\n%s", code, err, errOut)
	}
	per := map[string]int{}
	for i, c := range doc.Calls {
		per[c.Gateway]++
		if i > 0 && c.Time.Before(doc.Calls[i-1].Time) {
			t.Fatalf("replay's fleet timeline is not in time order at call %d", i)
		}
	}
	// 6 sessions x 3 calls before the kill, 4 x 5 after on gw1 and gw3, 4 new.
	if len(per) != 3 || len(doc.Calls) != 18+20+4 || per[dirs[1]] != 6 {
		t.Fatalf("replay's fleet timeline: %d calls, per gateway %v", len(doc.Calls), per)
	}
	if _, out, _ := runCLI(t, append([]string{"replay"}, dirs...)...); !strings.Contains(out, "GATEWAY") {
		t.Fatalf("replay's fleet session table has no GATEWAY column:\n%s", out)
	}
}
