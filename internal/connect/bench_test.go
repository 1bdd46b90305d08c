package connect

// Benchmarks of the tunnel (issue 16), run with
//
//	go test -run '^$' -bench Tunnel -benchtime 1x ./internal/connect
//
// BenchmarkTunnelVsDirectHTTP: the same go-sdk HTTP server, called
// through a tunnel (gateway side upstream.Tunnel, connector dialling the
// server with --http), directly as an HTTP upstream, through the floor of
// a correct tunnel (floorTunnel: the bare hop plus the work the tunnel's
// properties take on every call) and through the floor of any WebSocket
// relay (bareRelay: one bare hop and a relay that POSTs each message), in
// one run: p50 of sequential calls, the four ways taking turns call by
// call in a random order (a busy moment of a shared machine falls on all
// of them alike), and calls/s at concurrency 8, the ways taking turns
// every 2 s; each as a ratio to direct.
// BenchmarkTunnelIdle: 1,000 idle tunnels from connectors in a child
// process; the gateway process's heap per tunnel and its CPU per
// heartbeat per tunnel. BenchmarkTunnelReconnect: 100 connectors (child
// process, default backoff 1 s .. 60 s) and a gateway restarted on the same
// address: time until all are routable again.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/go-json-experiment/json/jsontext"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/rpcwire"
	"github.com/confidential-mcp/cmcp/internal/tunnel"
	"github.com/confidential-mcp/cmcp/internal/tunnel/wire"
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
	// cpu is the process's CPU time per call at concurrency 8 (every
	// part runs in this process): steadier than calls/s on a loaded
	// machine.
	cpu time.Duration
}

// sequential makes 330 sequential calls on the first session of each way,
// the ways taking turns call by call in a random order, and returns each
// way's p50 over the last 300.
func sequential(b *testing.B, ways [][]func() error) []time.Duration {
	lat := make([][]time.Duration, len(ways))
	for i := range 330 {
		for _, w := range mrand.Perm(len(ways)) {
			t0 := time.Now()
			if err := ways[w][0](); err != nil {
				b.Fatal(err)
			}
			if i >= 30 {
				lat[w] = append(lat[w], time.Since(t0))
			}
		}
	}
	p50 := make([]time.Duration, len(ways))
	for w := range lat {
		slices.Sort(lat[w])
		p50[w] = lat[w][len(lat[w])/2]
	}
	return p50
}

// concurrent runs 8 goroutines for 2 s, each with its own session
// (calls/s, CPU per call).
func concurrent(b *testing.B, calls []func() error) measured {
	var wg sync.WaitGroup
	var mu sync.Mutex
	n := 0
	stop := time.Now().Add(2 * time.Second)
	c0 := cpuTime()
	for _, c := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := 0
			for time.Now().Before(stop) {
				if err := c(); err != nil {
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
	cpu := cpuTime() - c0
	return measured{perS: float64(n) / 2, total: n, cpu: cpu / time.Duration(max(n, 1))}
}

var benchParams = json.RawMessage(`{"name":"echo","arguments":{"q":"hello"}}`)

// rawCalls makes a tools/call on each conn.
func rawCalls(conns []*upstream.Conn) []func() error {
	var fs []func() error
	for _, c := range conns {
		fs = append(fs, func() error {
			_, err := c.RawCall(context.Background(), "tools/call", benchParams)
			return err
		})
	}
	return fs
}

// serverSessions opens n sessions of the server directly (not timed)
// and returns their ids.
func serverSessions(b *testing.B, server string, n int) []string {
	sids := make([]string, n)
	post := func(sid string, body []byte) (*http.Response, error) {
		req, _ := http.NewRequest(http.MethodPost, server, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if sid != "" {
			req.Header.Set("Mcp-Session-Id", sid)
			req.Header.Set("Mcp-Protocol-Version", upstream.ProtocolVersion)
		}
		return http.DefaultClient.Do(req)
	}
	for i := range sids {
		resp, err := post("", []byte(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"`+upstream.ProtocolVersion+`","capabilities":{},"clientInfo":{"name":"floor","version":"1"}}}`))
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		sids[i] = resp.Header.Get("Mcp-Session-Id")
		resp, err = post(sids[i], []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`))
		if err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
	}
	return sids
}

// bareRelay is the floor of any WebSocket relay: the same calls to the
// same server through one bare hop of the same kind, a WebSocket carrying
// eight sessions' messages to a relay that POSTs each verbatim and sends
// the answer's body back. Nothing is checked, decoded or recorded, and a
// session's messages wait while its request is posted: what it costs is
// what any relay costs here, correct or not (floorTunnel adds what a
// correct one must do).
func bareRelay(b *testing.B, server string) []func() error {
	ctx := context.Background()
	const n = 8
	sids := serverSessions(b, server, n)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = n
	relayClient := &http.Client{Transport: tr}
	// The relay: one WebSocket; message = session index byte + body.
	c := wsHop(b, func(c *websocket.Conn) {
		ins := make([]chan []byte, n)
		for i := range ins {
			ins[i] = make(chan []byte, 16)
			go func() {
				for m := range ins[i] {
					req, _ := http.NewRequest(http.MethodPost, server, bytes.NewReader(m))
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("Accept", "application/json, text/event-stream")
					req.Header.Set("Mcp-Session-Id", sids[i])
					req.Header.Set("Mcp-Protocol-Version", upstream.ProtocolVersion)
					resp, err := relayClient.Do(req)
					if err != nil {
						c.CloseNow()
						return
					}
					body, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					c.Write(ctx, websocket.MessageText, append([]byte{byte(i)}, body...))
				}
			}()
		}
		for {
			_, m, err := c.Read(ctx)
			if err != nil {
				return
			}
			ins[m[0]] <- m[1:]
		}
	})
	outs := make([]chan []byte, n)
	for i := range outs {
		outs[i] = make(chan []byte, 1)
	}
	go func() {
		for {
			_, m, err := c.Read(ctx)
			if err != nil {
				return
			}
			outs[m[0]] <- m[1:]
		}
	}()
	var fs []func() error
	for i := range n {
		id := 0
		fs = append(fs, func() error {
			id++
			msg := append([]byte{byte(i)}, `{"jsonrpc":"2.0","id":`+strconv.Itoa(id)+`,"method":"tools/call","params":`+string(benchParams)+`}`...)
			if err := c.Write(ctx, websocket.MessageText, msg); err != nil {
				return err
			}
			select {
			case ans := <-outs[i]:
				if !bytes.Contains(ans, []byte(`hello`)) {
					return fmt.Errorf("floor: unexpected answer %s", ans)
				}
				return nil
			case <-time.After(30 * time.Second):
				return errors.New("floor: no answer in 30 s")
			}
		})
	}
	return fs
}

// floorTunnel is the floor of a correct tunnel: bareRelay's hop plus the
// work that each of the tunnel's properties takes on every call, done the
// cheapest way this file knows, and nothing else:
//   - every frame in the tunnel's envelope (wire.EncodeMsg), decoded
//     strictly on arrival at either end (wire.Decode): the gateway must
//     not act on what an untrusted machine sends before it checked it, and
//     the connector must not send what would end every session's tunnel;
//   - routing by session id (a map under a lock) at both ends, and on the
//     gateway by JSON-RPC id to the call waiting for it (one session
//     carries several calls at once, and the SDK's own messages);
//   - the server's answer read as the event stream it is: each message
//     checked to be one JSON value and sent on as soon as it is read
//     (progress and the server's requests come before an answer);
//   - a deadline on every write, so that a stalled tunnel is dropped and
//     never holds its callers (a stopped timer, reused);
//   - a session's messages still read while one of its requests is
//     posted (a cancellation, or the answer to a request of the server,
//     must not wait for the call's answer): the goroutine that read a
//     request posts it and another takes over the reading, one that is
//     idle where there is one.
func floorTunnel(b *testing.B, server string) []func() error {
	ctx := context.Background()
	const n = 8
	sids := serverSessions(b, server, n)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = n
	relayClient := &http.Client{Transport: tr}
	// write sends b on c within 30 s, or closes c.
	write := func(c *websocket.Conn, timers *sync.Pool, b []byte) error {
		wd, _ := timers.Get().(*time.Timer)
		if wd == nil {
			wd = time.AfterFunc(30*time.Second, func() { c.CloseNow() })
		} else {
			wd.Reset(30 * time.Second)
		}
		err := c.Write(ctx, websocket.MessageText, b)
		if wd.Stop() {
			timers.Put(wd)
		}
		return err
	}
	// The relay.
	c := wsHop(b, func(c *websocket.Conn) {
		var timers sync.Pool
		var mu sync.Mutex
		ins := map[string]chan []byte{}
		for i := range n {
			id := strconv.Itoa(i)
			in := make(chan []byte, 16)
			ins[id] = in
			lead := make(chan struct{})
			var serve func()
			serve = func() {
				for m := range in {
					select {
					case lead <- struct{}{}:
					default:
						go serve()
					}
					req, _ := http.NewRequest(http.MethodPost, server, bytes.NewReader(m))
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("Accept", "application/json, text/event-stream")
					req.Header.Set("Mcp-Session-Id", sids[i])
					req.Header.Set("Mcp-Protocol-Version", upstream.ProtocolVersion)
					resp, err := relayClient.Do(req)
					if err != nil {
						c.CloseNow()
						return
					}
					events := upstream.NewSSEMessages(resp.Body, wire.MaxMessage)
					for {
						data, err := events.Next()
						if err != nil {
							break
						}
						if !jsontext.Value(data).IsValid() {
							c.CloseNow()
							return
						}
						if write(c, &timers, wire.EncodeMsg(id, data)) != nil {
							return
						}
					}
					events.Release()
					resp.Body.Close()
					<-lead
				}
			}
			go serve()
		}
		for {
			_, m, err := c.Read(ctx)
			if err != nil {
				return
			}
			f, err := wire.Decode(m)
			if err != nil || f.T != wire.TMsg {
				c.CloseNow()
				return
			}
			mu.Lock()
			in := ins[f.S]
			mu.Unlock()
			select {
			case in <- f.M:
			default:
				c.CloseNow()
				return
			}
		}
	})
	type session struct {
		id      string
		mu      sync.Mutex
		pending map[string]chan []byte
	}
	var mu sync.Mutex
	sessions := map[string]*session{}
	for i := range n {
		id := strconv.Itoa(i)
		sessions[id] = &session{id: id, pending: map[string]chan []byte{}}
	}
	dead := make(chan struct{}) // the read loop ended: no answer comes
	go func() {
		defer close(dead)
		for {
			_, m, err := c.Read(ctx)
			if err != nil {
				return
			}
			f, err := wire.Decode(m)
			if err != nil || f.T != wire.TMsg || !f.Checked() {
				c.CloseNow()
				return
			}
			mu.Lock()
			s := sessions[f.S]
			mu.Unlock()
			msg, ok := rpcwire.DecodeChecked(f.M)
			resp, isResp := msg.(*jsonrpc.Response)
			if s == nil || !ok || !isResp {
				continue
			}
			id, _ := resp.ID.Raw().(string)
			s.mu.Lock()
			ch := s.pending[id]
			delete(s.pending, id)
			s.mu.Unlock()
			if ch != nil {
				ch <- f.M
			}
		}
	}()
	var timers sync.Pool
	var next atomic.Uint64
	var fs []func() error
	for i := range n {
		s := sessions[strconv.Itoa(i)]
		fs = append(fs, func() error {
			id := "floor-" + strconv.FormatUint(next.Add(1), 10)
			ch := make(chan []byte, 1)
			s.mu.Lock()
			s.pending[id] = ch
			s.mu.Unlock()
			msg := `{"jsonrpc":"2.0","id":"` + id + `","method":"tools/call","params":` + string(benchParams) + `}`
			if err := write(c, &timers, wire.EncodeMsg(s.id, []byte(msg))); err != nil {
				return err
			}
			select {
			case ans := <-ch:
				if !bytes.Contains(ans, []byte(`hello`)) {
					return fmt.Errorf("floor: unexpected answer %s", ans)
				}
				return nil
			case <-dead:
				return errors.New("floor: the tunnel ended")
			}
		})
	}
	return fs
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
	ways := [][]func() error{rawCalls(open(direct)), rawCalls(open(tun)), floorTunnel(b, url), bareRelay(b, url)}
	ms := make([][]measured, len(ways)) // direct, tunnel, floor, bare
	// Taking turns, so that a busy moment hits all ways.
	for range 3 {
		p50 := sequential(b, ways)
		for w := range ways {
			m := concurrent(b, ways[w])
			m.p50 = p50[w]
			ms[w] = append(ms[w], m)
		}
	}
	med := func(w int, get func(measured) float64) float64 {
		v := []float64{get(ms[w][0]), get(ms[w][1]), get(ms[w][2])}
		slices.Sort(v)
		return v[1]
	}
	p50 := func(m measured) float64 { return float64(m.p50.Microseconds()) }
	perS := func(m measured) float64 { return m.perS }
	cpu := func(m measured) float64 { return float64(m.cpu.Microseconds()) }
	for w, name := range []string{"direct", "tunnel", "floor", "bare"} {
		b.ReportMetric(med(w, p50), name+"-p50-µs")
		b.ReportMetric(med(w, perS), name+"-c8-calls/s")
		b.ReportMetric(med(w, cpu), name+"-cpu-µs/call")
		if w > 0 {
			b.ReportMetric(med(w, p50)/med(0, p50), name+"-p50-ratio")
			b.ReportMetric(med(w, perS)/med(0, perS), name+"-c8-ratio")
		}
	}
	b.ReportMetric(med(1, p50)/med(2, p50), "tunnel/floor-p50")
	b.ReportMetric(med(1, perS)/med(2, perS), "tunnel/floor-c8")
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

// wsHop is one bare WebSocket connection on loopback, both ends reading
// without a limit: relay serves the accepting end (it returns when the
// connection ends), and the dialling end is returned.
func wsHop(b *testing.B, relay func(c *websocket.Conn)) *websocket.Conn {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	rs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		c.SetReadLimit(-1)
		relay(c)
	})}
	go rs.Serve(ln)
	b.Cleanup(func() { rs.Close() })
	c, _, err := websocket.Dial(context.Background(), "ws://"+ln.Addr().String()+"/", nil)
	if err != nil {
		b.Fatal(err)
	}
	c.SetReadLimit(-1)
	b.Cleanup(func() { c.CloseNow() })
	return c
}
