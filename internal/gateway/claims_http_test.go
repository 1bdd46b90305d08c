package gateway

import (
	"context"
	"encoding/json"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/upstream"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// TestHTTPUpstreamURLQueryStaysSecret: an HTTP upstream's url may carry a
// secret in its query (?api_key=...). The query reaches the upstream with
// every request, and nothing else: not the agent's error when the upstream
// cannot be reached (connection refused), not the gateway's log, not any
// audit record (the failed upstream's reason, a connected upstream's
// endpoint).
func TestHTTPUpstreamURLQueryStaysSecret(t *testing.T) {
	const secret = "SUPERSECRET"
	s := mcp.NewServer(&mcp.Implementation{Name: "http-upstream", Version: "1"}, nil)
	s.AddTool(&mcp.Tool{Name: "echo", InputSchema: json.RawMessage(`{"type":"object"}`)}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "pong"}}}, nil
	})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)
	var mu sync.Mutex
	var queries []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		queries = append(queries, r.Method+" "+r.URL.RawQuery)
		mu.Unlock()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)

	w, dir := openTestLog(t)
	down, err := upstream.NewHTTP(upstream.HTTPOptions{Name: "down", URL: "http://127.0.0.1:1/mcp?api_key=" + secret})
	if err != nil {
		t.Fatal(err)
	}
	up, err := upstream.NewHTTP(upstream.HTTPOptions{Name: "up", URL: srv.URL + "/mcp?api_key=" + secret})
	if err != nil {
		t.Fatal(err)
	}
	logs := &lockedWriter{}
	g, err := New(Options{Log: w, Logger: slog.New(slog.NewTextHandler(logs, nil)), Upstreams: []UpstreamOptions{
		{Upstream: down, Namespaced: true, Transport: "http", Class: down.Class()},
		{Upstream: up, Namespaced: true, Transport: "http", Class: up.Class()},
	}})
	if err != nil {
		t.Fatal(err)
	}
	cs := startAndConnect(t, g)

	_, err = call(t, cs, "down__echo", nil)
	if wireCode(err) != CodeUpstreamUnavailable {
		t.Fatalf("call to the unreachable upstream: %v, want %d", err, CodeUpstreamUnavailable)
	}
	if !strings.Contains(err.Error(), "127.0.0.1:1/mcp") || strings.Contains(err.Error(), secret) {
		t.Errorf("the agent's error must name the endpoint without its query: %v", err)
	}
	if res, err := call(t, cs, "up__echo", nil); err != nil || firstText(res) != "pong" {
		t.Fatalf("call to the reachable upstream: %v %v", firstText(res), err)
	}

	mu.Lock()
	if len(queries) == 0 {
		t.Error("the upstream received no request")
	}
	for _, q := range queries {
		if !strings.HasSuffix(q, " api_key="+secret) {
			t.Errorf("a request reached the upstream without the configured query: %q", q)
		}
	}
	mu.Unlock()
	if l := logs.String(); !strings.Contains(l, "127.0.0.1:1") || strings.Contains(l, secret) {
		t.Errorf("the gateway's log must name the endpoint without its query:\n%s", l)
	}
	g.results.Wait()
	connected := 0
	for _, r := range readAuditRecords(t, dir) {
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), secret) {
			t.Errorf("an audit record has the url's query: %s", b)
		}
		if u, ok := r.(*record.Upstream); ok && u.Event == "connected" {
			connected++
			if u.Endpoint != srv.URL+"/mcp" {
				t.Errorf("connected record's endpoint %q, want %q", u.Endpoint, srv.URL+"/mcp")
			}
		}
	}
	if connected == 0 {
		t.Error("no connected record")
	}
	// The files themselves, not only the records as decoded.
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), secret) {
			t.Errorf("%s has the url's query", p)
		}
		return nil
	})
}
