package server

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/gateway"
)

// TestSIGHUPReloadsUpstreamCredentials runs a gateway process with an HTTP
// upstream whose bearer token is in a file and whose API key header is in
// an environment variable. The operator rotates the file and sends SIGHUP:
// the upstream gets the new token with the next request, on the
// connection that was open (the agent's session goes on), the change is an
// admin record upstream_credentials_reloaded naming the upstream and never
// the token, and the log says the environment variable is read only at
// start. A file that cannot be read on SIGHUP changes nothing.
func TestSIGHUPReloadsUpstreamCredentials(t *testing.T) {
	const tok1, tok2 = "upstream-token-one-4f1e", "upstream-token-two-9c2a"
	t.Setenv("CMCP_TEST_UPSTREAM_KEY", "key-from-the-environment")
	s := mcp.NewServer(&mcp.Implementation{Name: "remote", Version: "1"}, nil)
	type in struct {
		Text string `json:"text"`
	}
	mcp.AddTool(s, &mcp.Tool{Name: "echo"}, func(ctx context.Context, req *mcp.CallToolRequest, a in) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: a.Text}}}, nil, nil
	})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{SessionTimeout: time.Minute})
	var mu sync.Mutex
	var calls []string // the credentials each tools/call came with
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		if (auth != "Bearer "+tok1 && auth != "Bearer "+tok2) || r.Header.Get("X-Api-Key") != "key-from-the-environment" {
			http.Error(w, "bad credentials", http.StatusUnauthorized)
			return
		}
		if r.Method == http.MethodPost {
			b, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(b))
			if bytes.Contains(b, []byte(`"tools/call"`)) {
				mu.Lock()
				calls = append(calls, auth)
				mu.Unlock()
			}
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)

	dir := t.TempDir()
	tokFile := filepath.Join(dir, "remote.token")
	if err := os.WriteFile(tokFile, []byte(tok1+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "cmcp.yaml")
	y := fmt.Sprintf(`version: 1
server:
  listen: 127.0.0.1:0
  tee: software
audit: {dir: audit}
upstreams:
  - name: remote
    http:
      url: %s/mcp
      bearer_token_file: %s
      headers_from_env: {X-Api-Key: CMCP_TEST_UPSTREAM_KEY}
`, srv.URL, tokFile)
	if err := os.WriteFile(cfgPath, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd, endpoint, stderr := startGatewayProcess(t, cfgPath)
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("gateway log:\n%s", clip(stderr.String(), 6000))
		}
	})
	hup := func(logLine string) {
		t.Helper()
		before := strings.Count(stderr.String(), logLine)
		if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		eventually(t, 20*time.Second, func() string {
			if strings.Count(stderr.String(), logLine) > before {
				return ""
			}
			return "no " + logLine + " in the gateway log"
		})
	}
	cs, err := connectWith(endpoint, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	lastCall := func() string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "remote__echo", Arguments: map[string]any{"text": "x"}})
		if err != nil || res.IsError {
			t.Fatalf("call: %v %+v", err, res)
		}
		mu.Lock()
		defer mu.Unlock()
		return calls[len(calls)-1]
	}
	if got := lastCall(); got != "Bearer "+tok1 {
		t.Fatalf("before the rotation the upstream got %q", got)
	}

	if err := os.WriteFile(tokFile, []byte(tok2+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	hup("SIGHUP: upstream credentials reloaded")
	if got := lastCall(); got != "Bearer "+tok2 {
		t.Fatalf("after the rotation and SIGHUP the upstream got %q, want the new token", got)
	}
	if !strings.Contains(stderr.String(), "upstream credentials from environment variables are read only at start") {
		t.Error("the log does not say that credentials from the environment need a restart")
	}

	// A file that cannot be read changes nothing.
	if err := os.WriteFile(tokFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	hup("could not be read again")
	if got := lastCall(); got != "Bearer "+tok2 {
		t.Fatalf("after an empty token file the upstream got %q, want the token in force", got)
	}

	stopGateway(t, cmd, syscall.SIGTERM)
	var reloads, failed int
	for _, a := range adminRecords(t, filepath.Join(dir, "audit")) {
		if a.Action == gateway.AdminReloadRejected && strings.Contains(a.Reason, "credentials not re-read") {
			// The failed rotation is in the audit log too, not only in the
			// gateway's log: the old credential stayed in force.
			failed++
			if a.Actor != "SIGHUP" || !strings.Contains(a.Reason, `"remote"`) || strings.Contains(a.Reason, tok2) {
				t.Errorf("reload_rejected record: %+v", a)
			}
			continue
		}
		if a.Action != gateway.AdminUpstreamCredentialsReloaded {
			continue
		}
		reloads++
		if a.Actor != "SIGHUP" || !strings.Contains(a.Reason, "remote") || strings.Contains(a.Reason, tok2) {
			t.Errorf("upstream_credentials_reloaded record: %+v", a)
		}
	}
	if reloads != 1 || failed != 1 {
		t.Errorf("%d upstream_credentials_reloaded records and %d reload_rejected for the empty file, want 1 and 1", reloads, failed)
	}
}
