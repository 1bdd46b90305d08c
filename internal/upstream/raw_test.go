package upstream

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/gwtest"
)

const rawChildEnv = "CMCP_UPSTREAM_RAW_TEST_CHILD"

func TestMain(m *testing.M) {
	switch os.Getenv(rawChildEnv) {
	case "1":
		rawTestServer()
		return
	case "deaf":
		deafTestServer()
		return
	case "flood":
		floodTestServer()
		return
	}
	os.Exit(m.Run())
}

// rawTestServer is a go-sdk stdio server: echo, block (until cancelled),
// cancelled (how many blocks were cancelled) and die (exits mid-call).
func rawTestServer() {
	var cancelled atomic.Int64
	s := mcp.NewServer(&mcp.Implementation{Name: "raw-test", Version: "1"}, nil)
	text := func(s string) *mcp.CallToolResult {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
	}
	s.AddTool(&mcp.Tool{Name: "echo", InputSchema: json.RawMessage(`{"type":"object"}`)}, func(_ context.Context, r *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return text(string(r.Params.Arguments)), nil
	})
	s.AddTool(&mcp.Tool{Name: "block", InputSchema: json.RawMessage(`{"type":"object"}`)}, func(ctx context.Context, _ *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		<-ctx.Done()
		cancelled.Add(1)
		return nil, ctx.Err()
	})
	s.AddTool(&mcp.Tool{Name: "cancelled", InputSchema: json.RawMessage(`{"type":"object"}`)}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return text(strings.Repeat("x", int(cancelled.Load()))), nil
	})
	s.AddTool(&mcp.Tool{Name: "die", InputSchema: json.RawMessage(`{"type":"object"}`)}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		os.Exit(3)
		return nil, nil
	})
	_ = s.Run(context.Background(), &mcp.StdioTransport{})
}

// deafTestServer answers the MCP handshake and tools/list by hand, then
// never reads its stdin again (and never exits on its own). On SIGUSR1 it
// sends the client a ping, whose answer is longer than a raw call to echo
// with no arguments.
func deafTestServer() {
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	go func() {
		for range usr1 {
			fmt.Printf(`{"jsonrpc":"2.0","id":"ping-%s","method":"ping"}`+"\n", strings.Repeat("p", 400))
		}
	}()
	in := bufio.NewReader(os.Stdin)
	for {
		line, err := in.ReadBytes('\n')
		if err != nil {
			os.Exit(0)
		}
		var m struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		json.Unmarshal(line, &m)
		switch m.Method {
		case "initialize":
			fmt.Printf(`{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":%q,"capabilities":{"tools":{}},"serverInfo":{"name":"deaf","version":"1"}}}`+"\n", m.ID, ProtocolVersion)
		case "tools/list":
			fmt.Printf(`{"jsonrpc":"2.0","id":%s,"result":{"tools":[{"name":"echo","inputSchema":{"type":"object"}}]}}`+"\n", m.ID)
			time.Sleep(time.Hour) // deaf from now on
		}
	}
}

func rawConn(t *testing.T) *Conn {
	return rawConnMode(t, "1")
}

func rawConnMode(t *testing.T, mode string) *Conn {
	t.Helper()
	exe, d := gwtest.SelfDigest(t)
	up := &Stdio{Spec: StdioSpec{Name: "raw", Command: exe, Pin: d, Env: map[string]string{rawChildEnv: mode}, StopGrace: time.Second}, Share: "per-session"}
	conn, err := up.Connect(context.Background(), mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil), ConnectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if !conn.CanRawCall() {
		t.Fatal("a stdio connection must support raw calls")
	}
	return conn
}

func callParams(tool, args string) json.RawMessage {
	return json.RawMessage(`{"name":"` + tool + `","arguments":` + args + `}`)
}

// TestRawCallBesideTheClient: raw calls return the upstream's exact result
// bytes and share the connection with the MCP client's own requests
// without mixing up responses.
func TestRawCallBesideTheClient(t *testing.T) {
	conn := rawConn(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for i := range 50 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			args := `{"n":` + strings.Repeat("1", i%9+1) + `}`
			res, err := conn.RawCall(ctx, "tools/call", callParams("echo", args))
			if err != nil {
				errs <- err
				return
			}
			var r mcp.CallToolResult
			if err := json.Unmarshal(res, &r); err != nil || len(r.Content) != 1 || r.Content[0].(*mcp.TextContent).Text != args {
				errs <- errors.New("raw call got " + string(res))
			}
		}()
		go func() {
			defer wg.Done()
			r, err := conn.Session.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]int{"m": i}})
			if err != nil {
				errs <- err
				return
			}
			if got := r.Content[0].(*mcp.TextContent).Text; got != `{"m":`+strings.TrimSpace(jsonInt(i))+`}` {
				errs <- errors.New("client call got " + got)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func jsonInt(i int) string { b, _ := json.Marshal(i); return string(b) }

// TestRawCallSaysItsResultWasChecked: a child's answer whose line the
// strict decoder took is reported as checked (WithChecked), so the gateway
// does not check its result again; an error answer sets nothing.
func TestRawCallSaysItsResultWasChecked(t *testing.T) {
	conn := rawConn(t)
	var checked bool
	ctx := WithChecked(context.Background(), &checked)
	if _, err := conn.RawCall(ctx, "tools/call", callParams("echo", `{"a":1}`)); err != nil || !checked {
		t.Fatalf("echo: checked %v, err %v; want a checked result", checked, err)
	}
	checked = false
	if _, err := conn.RawCall(ctx, "tools/call", callParams("no-such-tool", "{}")); err == nil || checked {
		t.Fatalf("an error answer: checked %v, err %v", checked, err)
	}
}

// TestRawCallUpstreamError: a JSON-RPC error comes back as the upstream
// sent it.
func TestRawCallUpstreamError(t *testing.T) {
	conn := rawConn(t)
	_, err := conn.RawCall(context.Background(), "tools/call", callParams("no-such-tool", "{}"))
	var we *jsonrpc.Error
	if !errors.As(err, &we) || we.Code == 0 || !strings.Contains(we.Message, "no-such-tool") {
		t.Fatalf("err = %#v", err)
	}
}

// TestRawCallCancellationReachesTheUpstream: giving up on a raw call sends
// notifications/cancelled, so the upstream stops working on it.
func TestRawCallCancellationReachesTheUpstream(t *testing.T) {
	conn := rawConn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := conn.RawCall(ctx, "tools/call", callParams("block", "{}")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, err := conn.RawCall(context.Background(), "tools/call", callParams("cancelled", "{}"))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(res), `"x"`) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the upstream never saw the cancellation: %s", res)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRawCallChildDies: a child that exits mid-call fails the call with
// the reason, and every later raw call fails at once.
func TestRawCallChildDies(t *testing.T) {
	conn := rawConn(t)
	_, err := conn.RawCall(context.Background(), "tools/call", callParams("die", "{}"))
	if err == nil || !strings.Contains(err.Error(), `upstream "raw"`) {
		t.Fatalf("err = %v", err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := conn.RawCall(context.Background(), "tools/call", callParams("echo", "{}"))
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a raw call on a dead child succeeded")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a raw call on a dead child hung")
	}
}

// TestRawCallToAChildThatStopsReading: a call to a child that no longer
// reads its stdin ends with the call's context instead of waiting for
// ever, the child whose input was cut part way is stopped with the reason,
// and a later call fails at once, saying why.
func TestRawCallToAChildThatStopsReading(t *testing.T) {
	conn := rawConnMode(t, "deaf")
	if _, err := conn.Session.ListTools(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	big := `{"text":"` + strings.Repeat("x", 1<<20) + `"}` // more than a pipe holds
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := conn.RawCall(ctx, "tools/call", callParams("echo", big))
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want the call's deadline", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the call took %v", d)
	}
	_, err = conn.RawCall(rawCallCtx(t), "tools/call", callParams("echo", `{}`))
	if err == nil || !strings.Contains(err.Error(), "stopped reading its stdin") {
		t.Fatalf("a call after the cut: %v", err)
	}
}

// TestAnswerToAChildThatStopsReadingIsBounded: go-sdk answers a request
// the child sent (here ping) with a context that never ends. When the
// child no longer reads its stdin, a raw call does not wait behind that
// answer: it ends with its own context. The answer gives up after
// writeTimeout, the child is stopped with the reason, and closing the
// connection does not wait for anything.
func TestAnswerToAChildThatStopsReadingIsBounded(t *testing.T) {
	t.Cleanup(func(d time.Duration) func() { return func() { writeTimeout = d } }(writeTimeout))
	writeTimeout = 2 * time.Second
	conn := deafChildPinged(t)
	start := time.Now()
	err := shortCall(t, conn)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a raw call behind the answer: %v", err)
	}
	if d := time.Since(start); d >= writeTimeout {
		t.Fatalf("a raw call with a 200ms timeout took %v", d)
	}
	for conn.Fault() == nil {
		if time.Since(start) > 10*time.Second {
			t.Fatal("the child was not stopped after the answer gave up")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := conn.Fault(); !strings.Contains(err.Error(), "took nothing from its stdin for 2s") {
		t.Fatalf("fault = %v", err)
	}
	_, err = conn.RawCall(rawCallCtx(t), "tools/call", callParams("echo", `{}`))
	if err == nil || !strings.Contains(err.Error(), "took nothing from its stdin") {
		t.Fatalf("a call after the child was stopped: %v", err)
	}
	within(t, 5*time.Second, "Conn.Close", conn.Close)
}

// TestCloseWhileAnAnswerWaitsForTheChild: closing the connection (the
// agent's session ends, the gateway shuts down) stops a child that stopped
// reading at once, although go-sdk's close waits for its answer to the
// child's ping, which is bounded by writeTimeout only.
func TestCloseWhileAnAnswerWaitsForTheChild(t *testing.T) {
	conn := deafChildPinged(t)
	within(t, 5*time.Second, "Conn.Close", conn.Close)
	if err := syscall.Kill(childPID(t, conn), 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("the child still exists after Close: %v", err)
	}
}

// deafChildPinged is a connection to a child that stopped reading its
// stdin, whose pipe is full, and that has sent a ping: go-sdk's answer
// waits for the pipe.
func deafChildPinged(t *testing.T) *Conn {
	t.Helper()
	conn := rawConnMode(t, "deaf")
	if _, err := conn.Session.ListTools(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	fillStdin(t, conn)
	if err := syscall.Kill(childPID(t, conn), syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	gwtest.WaitGoroutine(t, "IO wait", "upstream.(*childConn).Write(") // the answer is being written
	return conn
}

// TestRawCallBehindABlockedWrite: a raw call waiting for its turn to write
// to a child that no longer reads its stdin ends with its own context, not
// the context of the call whose write is blocked; closing the connection
// does not wait for that write either, and ends it.
func TestRawCallBehindABlockedWrite(t *testing.T) {
	conn := rawConnMode(t, "deaf")
	if _, err := conn.Session.ListTools(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	fillStdin(t, conn)
	first := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := conn.RawCall(ctx, "tools/call", callParams("echo", `{}`))
		first <- err
	}()
	gwtest.WaitGoroutine(t, "IO wait", "upstream.(*childConn).rawCall(") // its write waits for the full pipe
	err := shortCall(t, conn)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the second call: %v", err)
	}
	within(t, 5*time.Second, "Conn.Close", conn.Close)
	select {
	case err := <-first:
		if err == nil || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("the blocked call: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the blocked call still waits after Close")
	}
}

// fillStdin fills the stdin pipe of a child that no longer reads it with
// whole messages (none longer than PIPE_BUF, so none is cut) until a raw
// call to echo with no arguments no longer fits.
func fillStdin(t *testing.T, conn *Conn) {
	t.Helper()
	for _, args := range []string{`{"t":"` + strings.Repeat("x", 3900) + `"}`, `{}`} {
		for i := 0; ; i++ {
			if i == 1000 {
				t.Fatal("the pipe never filled")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			_, err := conn.RawCall(ctx, "tools/call", callParams("echo", args))
			cancel()
			if err != nil && strings.Contains(err.Error(), "did not read its stdin") {
				break
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("filling the pipe: %v", err)
			}
		}
	}
}

// childPID is the pid of the child behind a stdio connection.
func childPID(t *testing.T, conn *Conn) int {
	t.Helper()
	var pid int
	if _, err := fmt.Sscanf(conn.Ref, "pid %d", &pid); err != nil {
		t.Fatalf("ref %q: %v", conn.Ref, err)
	}
	return pid
}

// within runs f and fails the test if it has not returned after d.
func within(t *testing.T, d time.Duration, what string, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		t.Fatalf("%s still waits after %v", what, d)
		return nil
	}
}

// shortCall makes a raw call with a 200 ms timeout, failing t if it does
// not return within 5 s.
func shortCall(t *testing.T, conn *Conn) error {
	t.Helper()
	return within(t, 5*time.Second, "a raw call with a 200ms timeout", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		_, err := conn.RawCall(ctx, "tools/call", callParams("echo", `{}`))
		return err
	})
}
