package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/upstream"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
)

// TestAgentCredentialsNeverReachHTTPUpstream: an agent authenticates to the
// gateway with its bearer token and calls a tool of an HTTP upstream (a real
// go-sdk server on 127.0.0.1). Every request the upstream receives carries
// the credential configured for the upstream (from the gateway's
// environment) and never the agent's token, in any header.
func TestAgentCredentialsNeverReachHTTPUpstream(t *testing.T) {
	const agentToken = "agent-token-9c41e0"
	const upstreamToken = "upstream-credential-2b7f"
	s := mcp.NewServer(&mcp.Implementation{Name: "http-upstream", Version: "1"}, nil)
	type in struct {
		Text string `json:"text"`
	}
	mcp.AddTool(s, &mcp.Tool{Name: "echo", Description: "echoes text"},
		func(ctx context.Context, req *mcp.CallToolRequest, a in) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "up: " + a.Text}}}, nil, nil
		})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{SessionTimeout: time.Minute})
	var mu sync.Mutex
	var requests int
	var leaks, badAuth []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		requests++
		for k, vs := range r.Header {
			for _, v := range vs {
				if strings.Contains(v, agentToken) {
					leaks = append(leaks, k+": "+v)
				}
			}
		}
		if got := r.Header.Get("Authorization"); got != "Bearer "+upstreamToken {
			badAuth = append(badAuth, got)
		}
		mu.Unlock()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)

	environ := append(os.Environ(), "REMOTE_TOKEN="+upstreamToken)
	cfg := fmt.Sprintf(`version: 1
server:
  listen: 127.0.0.1:0
  tee: software
  tokens: [{identity: alice, sha256: %q}]
audit:
  dir: audit
upstreams:
  - name: remote
    http:
      url: %s/mcp
      bearer_token_env: REMOTE_TOKEN
`, TokenDigest(agentToken).String(), srv.URL)
	endpoint, _ := serveYAML(t, t.TempDir(), cfg, environ)
	cs, err := connectWith(endpoint, agentToken)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "remote__echo", Arguments: map[string]any{"text": "hi"}})
	if err != nil || res.IsError || res.Content[0].(*mcp.TextContent).Text != "up: hi" {
		t.Fatalf("call: %v %+v", err, res)
	}
	mu.Lock()
	defer mu.Unlock()
	if requests == 0 {
		t.Fatal("the upstream received no request")
	}
	if len(leaks) > 0 {
		t.Fatalf("the agent's token reached the upstream: %v", leaks)
	}
	if len(badAuth) > 0 {
		t.Fatalf("upstream requests without the configured credential: %q", badAuth)
	}
}

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
	logs := &lockedWriter{b: &strings.Builder{}}
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
		if u, ok := r.(*auditlog.Upstream); ok && u.Event == "connected" {
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
