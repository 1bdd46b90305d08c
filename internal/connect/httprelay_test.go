package connect

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/tunnel"
	"github.com/confidential-mcp/cmcp/internal/upstream"
)

//lint:file-ignore SA1019 go-sdk deprecates MCP roots (SEP-2577) with no replacement; the test uses a roots/list request to prove a server's request is relayed both ways

// TestHTTPServerThroughTheTunnel: a connector with --http relays each
// gateway session to a real go-sdk Streamable HTTP server verbatim: the
// handshake (the server's session id and protocol version go with every
// later POST), tools/list, calls answered as JSON, a call during which the
// server asks the gateway's client for its roots (an event-stream answer
// carrying the server's request, whose answer is POSTed back), and eight
// sessions calling at once. A server that goes away ends the session with
// an error naming it.
func TestHTTPServerThroughTheTunnel(t *testing.T) {
	s := mcp.NewServer(&mcp.Implementation{Name: "httpsrv", Version: "1"}, nil)
	s.AddTool(&mcp.Tool{Name: "echo", InputSchema: json.RawMessage(`{"type":"object"}`)}, func(_ context.Context, r *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(r.Params.Arguments)}}}, nil
	})
	s.AddTool(&mcp.Tool{Name: "roots", InputSchema: json.RawMessage(`{"type":"object"}`)}, func(ctx context.Context, r *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		res, err := r.Session.ListRoots(ctx, nil)
		if err != nil {
			return nil, err
		}
		var names []string
		for _, root := range res.Roots {
			names = append(names, root.URI)
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "roots:" + strings.Join(names, ",")}}}, nil
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	url := "http://" + ln.Addr().String() + "/mcp"

	g := startGateway(t, "", tunnel.Options{})
	runConnector(t, Options{Gateway: g.url(), MachineID: "lab-1", HTTP: url})
	waitMachines(t, g.hub, "lab-1")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	up := upstream.NewTunnel("files", g.hub)
	client := mcp.NewClient(&mcp.Implementation{Name: "test-gateway", Version: "1"}, nil)
	client.AddRoots(&mcp.Root{URI: "file:///data"})
	conn, err := up.Connect(ctx, client, upstream.ConnectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if tools, err := conn.Session.ListTools(ctx, nil); err != nil || len(tools.Tools) != 2 {
		t.Fatalf("tools/list: %v %v", tools, err)
	}
	if got, err := call(ctx, conn, "echo", `{"q":"hi"}`); err != nil || got != `{"q":"hi"}` {
		t.Fatalf("echo: %q %v", got, err)
	}
	res, err := conn.Session.CallTool(ctx, &mcp.CallToolParams{Name: "roots", Arguments: map[string]any{}})
	if err != nil || res.IsError || len(res.Content) == 0 || res.Content[0].(*mcp.TextContent).Text != "roots:file:///data" {
		t.Fatalf("a call that asks the client for its roots: %+v %v", res, err)
	}
	done := make(chan error, 8)
	for i := range 8 {
		go func() {
			c, err := up.Connect(ctx, newClient(), upstream.ConnectOptions{})
			if err != nil {
				done <- err
				return
			}
			defer c.Close()
			for j := range 20 {
				arg := `{"n":"` + string(rune('a'+i)) + string(rune('a'+j)) + `"}`
				if got, err := call(ctx, c, "echo", arg); err != nil || got != arg {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	for range 8 {
		if err := <-done; err != nil {
			t.Fatalf("concurrent sessions: %v", err)
		}
	}
	srv.Close()
	_, err = call(ctx, conn, "echo", `{}`)
	if err == nil || !strings.Contains(err.Error(), ln.Addr().String()) {
		t.Fatalf("a call with the server gone: %v, want an error naming %s", err, url)
	}
}

// TestHTTPServerStreamEndsUnanswered: a server whose event stream ends
// before it answers the request (cut mid-call) ends the gateway session at
// once with an error saying so, rather than leave the call waiting for its
// timeout; an empty 200 to a notification is taken as accepted.
func TestHTTPServerStreamEndsUnanswered(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.WriteHeader(http.StatusMethodNotAllowed)
			return
		}
		var msg struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		json.NewDecoder(r.Body).Decode(&msg)
		switch {
		case msg.Method == "initialize":
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Mcp-Session-Id", "s-1")
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":%q,"capabilities":{"tools":{}},"serverInfo":{"name":"cut","version":"1"}}}`, msg.ID, upstream.ProtocolVersion)
		case len(msg.ID) == 0:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusOK) // empty: accepted
		default:
			if r.Header.Get("Mcp-Session-Id") != "s-1" {
				http.Error(w, "no session id", http.StatusBadRequest)
				return
			}
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"level\":\"info\",\"data\":\"working\"}}\n\n")
			// and the stream ends, unanswered
		}
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	g := startGateway(t, "", tunnel.Options{})
	runConnector(t, Options{Gateway: g.url(), MachineID: "lab-1", HTTP: "http://" + ln.Addr().String() + "/mcp"})
	waitMachines(t, g.hub, "lab-1")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := upstream.NewTunnel("files", g.hub).Connect(ctx, newClient(), upstream.ConnectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	t0 := time.Now()
	_, err = call(ctx, conn, "echo", `{}`)
	if err == nil || !strings.Contains(err.Error(), "ended its event stream before it answered") {
		t.Fatalf("a call whose stream ends unanswered: %v", err)
	}
	if d := time.Since(t0); d > 30*time.Second {
		t.Fatalf("the call waited %v", d)
	}
}
