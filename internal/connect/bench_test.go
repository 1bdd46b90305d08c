package connect

// Benchmarks of the tunnel (issue 16), run with
//
//	go test -run '^$' -bench Tunnel -benchtime 1x ./internal/connect
//
// BenchmarkTunnelVsDirectHTTP: the same go-sdk HTTP server, called
// through a tunnel (gateway side upstream.Tunnel, connector dialling the
// server with --http) and directly as an HTTP upstream, alternating, in
// one run: p50 of sequential calls and calls/s at concurrency 8.
// BenchmarkTunnelIdle: 1,000 idle tunnels from connectors in a child
// process; the gateway process's heap per tunnel and its CPU per
// heartbeat per tunnel. BenchmarkTunnelReconnect: 100 connectors (child
// process, default backoff 1 s .. 60 s) and a gateway restarted on the same
// address: time until all are routable again.

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/tunnel"
	"github.com/confidential-mcp/cmcp/internal/upstream"
)

// httpEchoServer is a go-sdk Streamable HTTP server with an echo tool on
// 127.0.0.1.
func httpEchoServer(b *testing.B) string {
	s := mcp.NewServer(&mcp.Implementation{Name: "bench", Version: "1"}, nil)
	s.AddTool(&mcp.Tool{Name: "echo", InputSchema: json.RawMessage(`{"type":"object"}`)}, func(_ context.Context, r *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(r.Params.Arguments)}}}, nil
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)}
	go srv.Serve(ln)
	b.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String() + "/mcp"
}

type measured struct {
	p50   time.Duration
	perS  float64
	total int
}

// measure: 300 sequential calls (p50), then 8 goroutines for 2 s, each on
// its own connection (calls/s).
func measure(b *testing.B, conns []*upstream.Conn) measured {
	ctx := context.Background()
	params := json.RawMessage(`{"name":"echo","arguments":{"q":"hello"}}`)
	var lat []time.Duration
	for i := range 330 {
		t0 := time.Now()
		if _, err := conns[0].RawCall(ctx, "tools/call", params); err != nil {
			b.Fatal(err)
		}
		if i >= 30 {
			lat = append(lat, time.Since(t0))
		}
	}
	slices.Sort(lat)
	var wg sync.WaitGroup
	var mu sync.Mutex
	n := 0
	stop := time.Now().Add(2 * time.Second)
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := 0
			for time.Now().Before(stop) {
				if _, err := c.RawCall(ctx, "tools/call", params); err != nil {
					b.Error(err)
					return
				}
				k++
			}
			mu.Lock()
			n += k
			mu.Unlock()
		}()
	}
	wg.Wait()
	return measured{p50: lat[len(lat)/2], perS: float64(n) / 2, total: n}
}

func BenchmarkTunnelVsDirectHTTP(b *testing.B) {
	url := httpEchoServer(b)
	g := startGateway(b, "", tunnel.Options{Heartbeat: 15 * time.Second})
	runConnector(b, Options{Gateway: g.url(), MachineID: "bench", HTTP: url})
	waitMachines(b, g.hub, "bench")
	ctx := context.Background()
	direct, err := upstream.NewHTTP(upstream.HTTPOptions{Name: "direct", URL: url})
	if err != nil {
		b.Fatal(err)
	}
	tun := upstream.NewTunnel("files", g.hub)
	open := func(u upstream.Upstream) []*upstream.Conn {
		var cs []*upstream.Conn
		for range 8 {
			c, err := u.Connect(ctx, newClient(), upstream.ConnectOptions{})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { c.Close() })
			cs = append(cs, c)
		}
		return cs
	}
	dc, tc := open(direct), open(tun)
	var d, t []measured
	for range 3 { // alternating, so that a noisy moment hits both
		d = append(d, measure(b, dc))
		t = append(t, measure(b, tc))
	}
	med := func(ms []measured, f func(measured) float64) float64 {
		v := []float64{f(ms[0]), f(ms[1]), f(ms[2])}
		slices.Sort(v)
		return v[1]
	}
	p50 := func(m measured) float64 { return float64(m.p50.Microseconds()) }
	perS := func(m measured) float64 { return m.perS }
	b.ReportMetric(med(d, p50), "direct-p50-µs")
	b.ReportMetric(med(t, p50), "tunnel-p50-µs")
	b.ReportMetric(med(t, p50)/med(d, p50), "p50-ratio")
	b.ReportMetric(med(d, perS), "direct-c8-calls/s")
	b.ReportMetric(med(t, perS), "tunnel-c8-calls/s")
	b.ReportMetric(med(t, perS)/med(d, perS), "c8-ratio")
}

const connectorsEnv = "CMCP_BENCH_CONNECTORS"

func init() {
	// The child of BenchmarkTunnelIdle and BenchmarkTunnelReconnect: N
	// idle connectors to the gateway URL in CMCP_BENCH_GATEWAY.
	n, _ := strconv.Atoi(os.Getenv(connectorsEnv))
	if n == 0 {
		return
	}
	ctx := context.Background()
	for i := range n {
		c, err := New(Options{Gateway: os.Getenv("CMCP_BENCH_GATEWAY"), Token: testToken, Upstream: "files",
			MachineID: fmt.Sprintf("m%04d", i), HTTP: "http://127.0.0.1:1/mcp"})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		go c.Run(ctx)
	}
	select {}
}

func startConnectors(b *testing.B, n int, url string) {
	exe, _ := os.Executable()
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), connectorsEnv+"="+strconv.Itoa(n), "CMCP_BENCH_GATEWAY="+url)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
}

func waitCount(b *testing.B, hub *tunnel.Hub, n int, within time.Duration) {
	deadline := time.After(within)
	for {
		ch := hub.Changed()
		if len(hub.Machines("files")) == n {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			b.Fatalf("%d of %d machines live", len(hub.Machines("files")), n)
		}
	}
}

func heapInuse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse + m.StackInuse
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func BenchmarkTunnelIdle(b *testing.B) {
	const n = 1000
	hb := time.Second
	g := startGateway(b, "", tunnel.Options{Heartbeat: hb, Upstreams: []tunnel.Upstream{{Name: "files", MaxMachines: n, Tokens: []tunnel.Token{{SHA256: tokenSum(testToken)}}}}})
	before := heapInuse()
	startConnectors(b, n, g.url())
	waitCount(b, g.hub, n, 5*time.Minute)
	time.Sleep(2 * hb) // heartbeats flowing
	after := heapInuse()
	c0 := cpuTime()
	const window = 10 * time.Second
	time.Sleep(window)
	cpu := cpuTime() - c0
	beats := float64(n) * float64(window/hb)
	b.ReportMetric(float64(after-before)/n/1024, "KiB/idle-tunnel")
	b.ReportMetric(float64(cpu.Microseconds())/beats, "cpu-µs/heartbeat")
	b.ReportMetric(float64(cpu)/float64(window)*100, "cpu-%-of-a-core-at-1s-heartbeat")
}

func BenchmarkTunnelReconnect(b *testing.B) {
	const n = 100
	o := tunnel.Options{Upstreams: []tunnel.Upstream{{Name: "files", MaxMachines: n, Tokens: []tunnel.Token{{SHA256: tokenSum(testToken)}}}}}
	g := startGateway(b, "", o)
	startConnectors(b, n, g.url())
	waitCount(b, g.hub, n, 2*time.Minute)
	addr := g.addr
	g.stop()
	t0 := time.Now()
	g2 := startGateway(b, addr, o)
	waitCount(b, g2.hub, n, 2*time.Minute)
	b.ReportMetric(float64(time.Since(t0).Milliseconds()), "ms-until-all-100-routable")
}
