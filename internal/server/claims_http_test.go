package server

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/confidential-mcp/cmcp/internal/front/httpfront"
	"github.com/modelcontextprotocol/go-sdk/mcp"
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
`, httpfront.TokenDigest(agentToken).String(), srv.URL)
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
