package tunnel_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/tunnel"
	"github.com/confidential-mcp/cmcp/internal/tunnel/wire"
	"github.com/confidential-mcp/cmcp/internal/upstream"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

const token = "rogue-test-token"

func newHub(t *testing.T, o tunnel.Options) (*tunnel.Hub, string) {
	t.Helper()
	o.Upstreams = []tunnel.Upstream{{Name: "files", Tokens: []tunnel.Token{{SHA256: digest.Bytes([]byte(token))}}}}
	if o.Heartbeat == 0 {
		o.Heartbeat = 2 * time.Second
	}
	hub, err := tunnel.New(o)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(hub) // a real listener on 127.0.0.1
	t.Cleanup(func() { srv.Close(); hub.Close() })
	return hub, srv.URL
}

// rogue is a connector written by hand from the protocol, which can send
// what cmcp connect never would.
type rogue struct {
	t  *testing.T
	ws *websocket.Conn
}

func dialRogue(t *testing.T, url, machine string) *rogue {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: []string{wire.Subprotocol}})
	if err != nil {
		t.Fatal(err)
	}
	ws.SetReadLimit(-1)
	t.Cleanup(func() { ws.CloseNow() })
	r := &rogue{t: t, ws: ws}
	r.send(&wire.Frame{T: wire.TRegister, Register: &wire.Register{Token: token, Upstream: "files", MachineID: machine, Name: "rogue", Version: "test", Server: wire.Server{Kind: "http", Command: "http://127.0.0.1:1/mcp", Class: "plaintext"}}})
	if f := r.recv(); f.T != wire.TRegistered {
		t.Fatalf("register answered with %+v", f)
	}
	return r
}

func (r *rogue) send(f *wire.Frame) { r.sendRaw(wire.Encode(f)) }

func (r *rogue) sendRaw(b []byte) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.ws.Write(ctx, websocket.MessageText, b); err != nil {
		r.t.Fatalf("rogue write: %v", err)
	}
}

func (r *rogue) recv() *wire.Frame {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, b, err := r.ws.Read(ctx)
	if err != nil {
		r.t.Fatalf("rogue read: %v", err)
	}
	f, err := wire.Decode(b)
	if err != nil {
		r.t.Fatal(err)
	}
	return f
}

func waitLive(t *testing.T, hub *tunnel.Hub, id string) *tunnel.Machine {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		ch := hub.Changed()
		if m := hub.Machine("files", id); m != nil {
			return m
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("machine %s never live", id)
		}
	}
}

// TestOversizedFrameDropsTheMachine: a message over the limit ends the
// tunnel, said so, and nothing of it is kept.
func TestOversizedFrameDropsTheMachine(t *testing.T) {
	// A long heartbeat: the rogue reads nothing while it writes, so it
	// answers no ping; what is tested here is the limit.
	hub, url := newHub(t, tunnel.Options{Heartbeat: time.Minute})
	r := dialRogue(t, url, "big")
	m := waitLive(t, hub, "big")
	big := wire.EncodeMsg("1", []byte(`{"x":"`+strings.Repeat("a", wire.MaxFrame)+`"}`))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	_ = r.ws.Write(ctx, websocket.MessageText, big) // the gateway may close while it is written
	select {
	case <-m.Done():
	case <-ctx.Done():
		t.Fatal("the machine was not dropped")
	}
	if !strings.Contains(m.Err().Error(), "over the limit") {
		t.Fatalf("dropped for %v, want over the limit", m.Err())
	}
	if hub.Machine("files", "big") != nil {
		t.Fatal("still listed")
	}
}

// TestFramesForUnknownSessionsDropped: frames for a session the gateway
// never opened are dropped and counted; the machine stays.
func TestFramesForUnknownSessionsDropped(t *testing.T) {
	hub, url := newHub(t, tunnel.Options{})
	r := dialRogue(t, url, "m1")
	m := waitLive(t, hub, "m1")
	r.send(&wire.Frame{T: wire.TMsg, S: "never-opened", M: json.RawMessage(`{"jsonrpc":"2.0","id":1,"result":{}}`)})
	r.send(&wire.Frame{T: wire.TOpened, S: "never-opened"})
	// A heartbeat after them: once it is seen, so were they.
	r.send(&wire.Frame{T: wire.THeartbeat, Host: &wire.Host{Hostname: "after", OS: "linux"}})
	deadline := time.Now().Add(30 * time.Second)
	for m.Info().Host.Hostname != "after" && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := hub.Dropped.Load(); got != 2 || m.Err() != nil {
		t.Fatalf("dropped %d frames, machine err %v; want 2 dropped and the machine live", got, m.Err())
	}
}

// serve answers a session as a minimal MCP server would, with a stray
// answer (an id the gateway never sent) before each real one.
func (r *rogue) serve(sid string) {
	for {
		ctx := context.Background()
		_, b, err := r.ws.Read(ctx)
		if err != nil {
			return
		}
		f, err := wire.Decode(b)
		if err != nil || f.T != wire.TMsg {
			continue
		}
		var req struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		json.Unmarshal(f.M, &req)
		if req.ID == nil {
			continue
		}
		var result string
		switch req.Method {
		case "initialize":
			result = `{"protocolVersion":"2025-11-25","capabilities":{"tools":{}},"serverInfo":{"name":"rogue","version":"1"}}`
		default:
			result = `{"content":[{"type":"text","text":"real"}]}`
		}
		for _, stray := range []string{`"cmcp-999999"`, `424242`} {
			r.sendRaw(wire.EncodeMsg(sid, []byte(`{"jsonrpc":"2.0","id":`+stray+`,"result":{"content":[{"type":"text","text":"stray"}]}}`)))
		}
		r.sendRaw(wire.EncodeMsg(sid, []byte(`{"jsonrpc":"2.0","id":`+string(req.ID)+`,"result":`+result+`}`)))
	}
}

// TestAnswersForIDsNeverSent: answers to requests the gateway never sent
// are dropped; the call gets its own answer and the session goes on.
func TestAnswersForIDsNeverSent(t *testing.T) {
	hub, url := newHub(t, tunnel.Options{})
	r := dialRogue(t, url, "m1")
	waitLive(t, hub, "m1")
	go func() {
		f := r.recv()
		if f.T != wire.TOpen {
			t.Errorf("want open, got %+v", f)
			return
		}
		r.send(&wire.Frame{T: wire.TOpened, S: f.S})
		r.serve(f.S)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := upstream.NewTunnel("files", hub).Connect(ctx, mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil), upstream.ConnectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for i := range 3 {
		res, err := conn.RawCall(ctx, "tools/call", json.RawMessage(`{"name":"x","arguments":{}}`))
		if err != nil || !strings.Contains(string(res), `"real"`) {
			t.Fatalf("call %d: %s, %v; want the real answer", i, res, err)
		}
	}
	if err := conn.Fault(); err != nil {
		t.Fatalf("session faulted: %v", err)
	}
}

// TestSlowSessionIsClosedNotBuffered: a gateway session that takes none
// of its machine's messages is closed at its bound; the machine and its
// other sessions go on.
func TestSlowSessionIsClosedNotBuffered(t *testing.T) {
	hub, url := newHub(t, tunnel.Options{SessionQueue: 16, SessionBytes: 1 << 20})
	r := dialRogue(t, url, "m1")
	m := waitLive(t, hub, "m1")
	opened := make(chan string, 2)
	go func() {
		for {
			ctx := context.Background()
			_, b, err := r.ws.Read(ctx)
			if err != nil {
				return
			}
			if f, _ := wire.Decode(b); f != nil && f.T == wire.TOpen {
				r.send(&wire.Frame{T: wire.TOpened, S: f.S})
				opened <- f.S
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	slow, err := m.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sid := <-opened
	for range 100 { // never read by the gateway side
		r.sendRaw(wire.EncodeMsg(sid, []byte(`{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"`+strings.Repeat("x", 1000)+`"}}`)))
	}
	select {
	case <-slow.Done():
	case <-ctx.Done():
		t.Fatal("the slow session was not closed")
	}
	if !strings.Contains(slow.Err().Error(), "did not take its messages") {
		t.Fatalf("closed for %v", slow.Err())
	}
	other, err := m.Open(ctx)
	if err != nil || m.Err() != nil {
		t.Fatalf("after a slow session: open %v, machine %v", err, m.Err())
	}
	other.Close()
}

// TestCancelledWriteKeepsTheTunnel: a session write whose caller already
// gave up (an agent's cancelled call) fails alone; the machine's tunnel
// and its sessions stay up (coder/websocket would close the whole
// connection if the write ran on the cancelled context).
func TestCancelledWriteKeepsTheTunnel(t *testing.T) {
	hub, url := newHub(t, tunnel.Options{})
	r := dialRogue(t, url, "m1")
	m := waitLive(t, hub, "m1")
	s := openRogueSession(t, m, r)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Write(ctx, []byte(`{"jsonrpc":"2.0","method":"notifications/first"}`)); err == nil {
		t.Fatal("a write with a cancelled context succeeded")
	}
	if err := m.Err(); err != nil {
		t.Fatalf("the machine went away: %v", err)
	}
	if err := s.Write(context.Background(), []byte(`{"jsonrpc":"2.0","method":"notifications/second"}`)); err != nil {
		t.Fatalf("the next write: %v", err)
	}
	if f := r.recv(); f.T != wire.TMsg || !strings.Contains(string(f.M), "second") {
		t.Fatalf("the connector got %+v, want the second message", f)
	}
}

// TestStalledTunnelDropped: a connector that stops reading (its TCP
// window fills) is dropped once a write waited WriteTimeout, and the
// writer gets the machine's error instead of waiting on; the hub holds
// no queue of what it could not send.
func TestStalledTunnelDropped(t *testing.T) {
	// A long heartbeat: what drops the machine here is the write timeout,
	// not a missing pong.
	hub, url := newHub(t, tunnel.Options{Heartbeat: time.Minute, WriteTimeout: time.Second})
	r := dialRogue(t, url, "m1")
	m := waitLive(t, hub, "m1")
	s := openRogueSession(t, m, r)
	// The rogue reads nothing more: the writes fill the socket buffers,
	// then one waits.
	big := []byte(`{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"` + strings.Repeat("x", 1<<20) + `"}}`)
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		for range 1000 {
			if err := s.Write(context.Background(), big); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	var err error
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("a write to a connector that reads nothing still waits after 60 s")
	}
	if err == nil {
		t.Fatal("1 GiB written to a connector that reads nothing")
	}
	if !strings.Contains(err.Error(), "took nothing for 1s") {
		t.Fatalf("the write failed with %v, want the write timeout", err)
	}
	select {
	case <-m.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the machine was not dropped")
	}
	if hub.Machine("files", "m1") != nil {
		t.Fatal("the stalled machine is still listed")
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("dropped after %v, want about the write timeout", d)
	}
}

// openRogueSession opens a session on m, answering the open frame from
// the rogue connector r, and returns the gateway's end of it.
func openRogueSession(t *testing.T, m *tunnel.Machine, r *rogue) *tunnel.Session {
	t.Helper()
	opened := make(chan *tunnel.Session, 1)
	go func() {
		s, err := m.Open(context.Background())
		if err != nil {
			t.Error(err)
		}
		opened <- s
	}()
	f := r.recv()
	if f.T != wire.TOpen {
		t.Fatalf("got %+v, want an open frame", f)
	}
	r.send(&wire.Frame{T: wire.TOpened, S: f.S})
	s := <-opened
	if s == nil {
		t.FailNow()
	}
	return s
}
