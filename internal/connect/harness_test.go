package connect

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/tunnel"
	"github.com/confidential-mcp/cmcp/internal/upstream"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

const serverEnv = "CMCP_CONNECT_TEST_SERVER"

func TestMain(m *testing.M) {
	if os.Getenv(serverEnv) == "1" {
		testServer()
		return
	}
	os.Exit(m.Run())
}

// testServer is a go-sdk stdio MCP server: whoami (the MACHINE variable),
// echo, and block (until cancelled).
func testServer() {
	s := mcp.NewServer(&mcp.Implementation{Name: "connect-test", Version: "1"}, nil)
	text := func(s string) *mcp.CallToolResult {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
	}
	obj := json.RawMessage(`{"type":"object"}`)
	s.AddTool(&mcp.Tool{Name: "whoami", InputSchema: obj}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return text(os.Getenv("MACHINE")), nil
	})
	s.AddTool(&mcp.Tool{Name: "echo", InputSchema: obj}, func(_ context.Context, r *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return text(string(r.Params.Arguments)), nil
	})
	s.AddTool(&mcp.Tool{Name: "block", InputSchema: obj}, func(ctx context.Context, _ *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	_ = s.Run(context.Background(), &mcp.StdioTransport{})
}

// serverSpec is this test binary as a pinned stdio server.
func serverSpec(t testing.TB, machine string) *upstream.StdioSpec {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	_, d, err := digest.OpenFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	return &upstream.StdioSpec{Name: "files", Command: exe, Pin: d, StopGrace: 2 * time.Second,
		Env: map[string]string{serverEnv: "1", "MACHINE": machine}}
}

const testToken = "machine-token-for-tests"

func tokenSum(s string) digest.Digest { return digest.Bytes([]byte(s)) }

// gateway is a hub on a real 127.0.0.1 listener.
type gateway struct {
	hub  *tunnel.Hub
	srv  *http.Server
	ln   net.Listener
	addr string
	done chan struct{}
}

func startGateway(t testing.TB, addr string, o tunnel.Options) *gateway {
	t.Helper()
	if o.Upstreams == nil {
		o.Upstreams = []tunnel.Upstream{{Name: "files", Tokens: []tunnel.Token{{SHA256: tokenSum(testToken)}}}}
	}
	if o.Heartbeat == 0 {
		o.Heartbeat = time.Second
	}
	hub, err := tunnel.New(o)
	if err != nil {
		t.Fatal(err)
	}
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	var ln net.Listener
	for i := 0; ; i++ { // a restarted gateway takes its old port back
		ln, err = net.Listen("tcp", addr)
		if err == nil || i == 50 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/tunnel", hub)
	g := &gateway{hub: hub, srv: &http.Server{Handler: mux}, ln: ln, addr: ln.Addr().String(), done: make(chan struct{})}
	go func() { g.srv.Serve(ln); close(g.done) }()
	t.Cleanup(g.stop)
	return g
}

func (g *gateway) url() string { return "http://" + g.addr + "/tunnel" }

func (g *gateway) stop() {
	g.srv.Close()
	g.hub.Close()
	<-g.done
}

// waitMachines waits until upstream files has exactly ids live.
func waitMachines(t testing.TB, hub *tunnel.Hub, ids ...string) {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		ch := hub.Changed()
		var got []string
		for _, m := range hub.Machines("files") {
			got = append(got, m.ID)
		}
		if strings.Join(got, ",") == strings.Join(ids, ",") {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("live machines %v, want %v", got, ids)
		}
	}
}

// runConnector runs a connector until the test ends.
func runConnector(t testing.TB, o Options) (states chan State, stop func()) {
	t.Helper()
	if o.Upstream == "" {
		o.Upstream = "files"
	}
	if o.Token == "" {
		o.Token = testToken
	}
	if o.InitialBackoff == 0 {
		o.InitialBackoff, o.MaxBackoff = 50*time.Millisecond, 500*time.Millisecond
	}
	states = make(chan State, 100)
	o.State = func(s State) {
		select {
		case states <- s:
		default:
		}
	}
	c, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return states, stop
}

// proxy is a TCP relay on 127.0.0.1 that the test can cut or stall.
type proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	stall  chan struct{} // closed: nothing more is forwarded
	free   chan struct{} // closed at cleanup: stalled pipes end
}

func startProxy(t testing.TB, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, stall: make(chan struct{}), free: make(chan struct{})}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			go p.pipe(c, u)
			go p.pipe(u, c)
		}
	}()
	t.Cleanup(func() { ln.Close(); close(p.free); p.cut() })
	return p
}

func (p *proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		select {
		case <-p.stall:
			<-p.free // hold the bytes, keep the sockets open: half-open
			return
		default:
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				dst.Close()
			}
			return
		}
	}
}

func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func (p *proxy) url() string { return "http://" + p.ln.Addr().String() + "/tunnel" }
