//go:build peers

// The tests in this file run real MCP peers from npm and need them installed:
//
//	eval "$(bash scripts/peers.sh)"
//	go test -tags peers -run ServerEverything ./internal/server
//
// scripts/test.sh (CI) does exactly that.

package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/gateway"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// everythingPeer is @modelcontextprotocol/server-everything as installed by
// scripts/peers.sh: Node 22, the package's prefix (its tree pin covers the
// package and every dependency under node_modules) and its entry point.
type everythingPeer struct {
	node, tree, js string
}

func needEverything(t *testing.T) everythingPeer {
	t.Helper()
	p := everythingPeer{node: os.Getenv("CMCP_NODE22"), tree: os.Getenv("CMCP_SERVER_EVERYTHING_DIR"), js: os.Getenv("CMCP_SERVER_EVERYTHING_JS")}
	if p.node == "" || p.tree == "" || p.js == "" {
		t.Fatal(`@modelcontextprotocol/server-everything is not installed for this test: run
	eval "$(bash scripts/peers.sh)"
	go test -tags peers -run ServerEverything ./internal/server
(CMCP_NODE22, CMCP_SERVER_EVERYTHING_DIR and CMCP_SERVER_EVERYTHING_JS must be set)`)
	}
	return p
}

// serveEverything runs the real gateway (Serve, as `cmcp serve` does) from a
// cmcp.yaml whose only upstream is server-everything, pinned by the digest of
// the node binary and the tree digest of the package directory. It returns
// the MCP endpoint and the audit directory.
func serveEverything(t *testing.T, p everythingPeer, treePin digest.Digest, environ []string) (string, string) {
	t.Helper()
	nodeReal, err := filepath.EvalSymlinks(p.node)
	if err != nil {
		t.Fatal(err)
	}
	f, nodePin, err := digest.OpenFile(nodeReal)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	dir := t.TempDir()
	yaml := fmt.Sprintf(`version: 1
server:
  listen: 127.0.0.1:0
  tee: software
audit:
  dir: audit
upstreams:
  - name: se
    stdio:
      command: %s
      args: [%s, stdio]
    pin:
      command: %s
      target: %s
      target_digest: %s
`, p.node, p.js, nodePin, p.tree, treePin)
	return serveYAML(t, dir, yaml, environ)
}

func connectTo(t *testing.T, endpoint string) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := mcp.NewClient(&mcp.Implementation{Name: "everything-test", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: http.DefaultClient, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatalf("connect %s: %v", endpoint, err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func textOf(t *testing.T, res *mcp.CallToolResult) string {
	t.Helper()
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

func TestServerEverythingThroughCmcp(t *testing.T) {
	p := needEverything(t)
	treePin, err := digest.Tree(context.Background(), p.tree, digest.TreeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Secrets in the gateway's own environment: none may reach the child.
	secrets := map[string]string{
		"CMCP_ADMIN_TOKEN":      "cmcp-admin-secret-7f3a9c",
		"AWS_SECRET_ACCESS_KEY": "aws-secret-0b1e2d4c",
		"UPSTREAM_BEARER_TOKEN": "upstream-bearer-93ac11",
	}
	environ := os.Environ()
	for k, v := range secrets {
		environ = append(environ, k+"="+v)
	}
	endpoint, auditDir := serveEverything(t, p, treePin, environ)
	cs := connectTo(t, endpoint)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	var names []string
	for tool, err := range cs.Tools(ctx, nil) {
		if err != nil {
			t.Fatalf("tools/list: %v", err)
		}
		names = append(names, tool.Name)
	}
	t.Logf("%d tools through cmcp: %v", len(names), names)
	for _, want := range []string{"se__echo", "se__get-env", "se__get-sum", "se__get-tiny-image"} {
		if !slices.Contains(names, want) {
			t.Errorf("tools/list lacks %s", want)
		}
	}

	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "se__echo", Arguments: map[string]any{"message": "hello through cmcp"}})
	if err != nil || res.IsError || textOf(t, res) != "Echo: hello through cmcp" {
		t.Fatalf("echo: %v, %+v", err, res)
	}
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "se__get-sum", Arguments: map[string]any{"a": 2, "b": 3}})
	if err != nil || res.IsError || !strings.Contains(textOf(t, res), "5") {
		t.Fatalf("get-sum: %v, %+v", err, res)
	}
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "se__get-tiny-image", Arguments: map[string]any{}})
	if err != nil || res.IsError || !slices.ContainsFunc(res.Content, func(c mcp.Content) bool { _, ok := c.(*mcp.ImageContent); return ok }) {
		t.Fatalf("get-tiny-image: %v, %+v", err, res)
	}

	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "se__get-env", Arguments: map[string]any{}})
	if err != nil || res.IsError {
		t.Fatalf("get-env: %v, %+v", err, res)
	}
	envText := textOf(t, res)
	var envOfChild map[string]string
	if err := json.Unmarshal([]byte(envText), &envOfChild); err != nil {
		t.Fatalf("get-env output is not the JSON environment: %v\n%s", err, envText)
	}
	t.Logf("the child's environment has %d variables: %v", len(envOfChild), slices.Sorted(maps.Keys(envOfChild)))
	for k, v := range secrets {
		if _, ok := envOfChild[k]; ok {
			t.Errorf("the gateway's secret %s reached the child", k)
		}
		if strings.Contains(envText, v) {
			t.Errorf("the value of %s reached the child", k)
		}
	}
	if envOfChild["PATH"] == "" {
		t.Errorf("the child got no PATH (the default allowlist passes it): %v", envOfChild)
	}

	// The audit log holds one measured spawn with the tree pin, and a call
	// record plus a result record for each of the four calls.
	// A result record is appended after the response is written: wait for
	// the last one rather than read the log the moment the call returned.
	cancel()
	cs.Close()
	var counts map[record.Kind]int
	var spawn *record.Spawn
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		counts, spawn = map[record.Kind]int{}, nil
		for _, rec := range readAuditRecords(t, auditDir) {
			counts[rec.Kind()]++
			if s, ok := rec.(*record.Spawn); ok && spawn == nil {
				spawn = s
			}
		}
		if counts[record.KindResult] >= 4 || time.Now().After(deadline) {
			break
		}
	}
	if counts[record.KindCall] != 4 || counts[record.KindResult] != 4 {
		t.Errorf("audit: %d call and %d result records, want 4 and 4 (%v)", counts[record.KindCall], counts[record.KindResult], counts)
	}
	if spawn == nil {
		t.Fatal("audit: no spawn record")
	}
	sb, _ := json.Marshal(spawn)
	if !strings.Contains(string(sb), treePin.String()) || !strings.Contains(string(sb), "spawn-measured") {
		t.Errorf("spawn record does not carry the tree pin %s as spawn-measured: %s", treePin, sb)
	}
}

func TestServerEverythingTreeMismatchRefused(t *testing.T) {
	p := needEverything(t)
	wrong := digest.Bytes([]byte("not the package tree"))
	endpoint, _ := serveEverything(t, p, wrong, os.Environ())
	cs := connectTo(t, endpoint)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "se__echo", Arguments: map[string]any{"message": "x"}})
	var je *jsonrpc.Error
	if !errors.As(err, &je) {
		t.Fatalf("call to a mismatched upstream: err = %v, want a JSON-RPC error", err)
	}
	if je.Code != gateway.CodeUpstreamUnavailable || !strings.Contains(je.Message, `upstream "se"`) || !strings.Contains(je.Message, wrong.String()) {
		t.Fatalf("got %d %q, want code %d naming the upstream and the pin", je.Code, je.Message, gateway.CodeUpstreamUnavailable)
	}
	t.Logf("refused as expected: %d %s", je.Code, je.Message)
}

// TestServerEverythingAsScript: server-everything run through its npm bin,
// a "#!/usr/bin/env node" script, as `cmcp spawn-digest -- mcp-server-everything`
// pins it: the script, node found on the child's PATH (the interpreter
// pin), and the package tree. The gateway executes the pinned node itself
// with the script as /proc/self/fd/3, which node resolves to the script's
// real path to load its modules: the server works, as spawn-measured, the
// record naming node. Another node first on PATH is refused.
func TestServerEverythingAsScript(t *testing.T) {
	p := needEverything(t)
	treePin, err := digest.Tree(context.Background(), p.tree, digest.TreeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(p.tree, "node_modules", ".bin", "mcp-server-everything")
	f, scriptPin, err := digest.OpenFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	nodeReal, err := filepath.EvalSymlinks(p.node)
	if err != nil {
		t.Fatal(err)
	}
	f, nodePin, err := digest.OpenFile(nodeReal)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	serve := func(t *testing.T, path string) string {
		endpoint, _ := serveYAML(t, t.TempDir(), fmt.Sprintf(`version: 1
server: {listen: "127.0.0.1:0", tee: software}
audit: {dir: audit}
upstreams:
  - name: se
    stdio: {command: %s, args: [stdio], env: {PATH: %s}}
    pin: {command: %s, interpreter: %s, target: %s, target_digest: %s}
`, bin, path, scriptPin, nodePin, p.tree, treePin), os.Environ())
		return endpoint
	}
	t.Run("pinned node", func(t *testing.T) {
		cs := connectTo(t, serve(t, filepath.Dir(p.node)+":/usr/bin:/bin"))
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "se__echo", Arguments: map[string]any{"message": "hello via #!"}})
		if err != nil || res.IsError || textOf(t, res) != "Echo: hello via #!" {
			t.Fatalf("echo: %v, %+v", err, res)
		}
	})
	t.Run("another node first on PATH", func(t *testing.T) {
		other := t.TempDir()
		if err := os.WriteFile(filepath.Join(other, "node"), []byte("\x7fELF not node\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		cs := connectTo(t, serve(t, other+":"+filepath.Dir(p.node)))
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "se__echo", Arguments: map[string]any{"message": "x"}})
		var je *jsonrpc.Error
		if !errors.As(err, &je) || je.Code != gateway.CodeUpstreamUnavailable || !strings.Contains(je.Message, filepath.Join(other, "node")) || !strings.Contains(je.Message, nodePin.String()) {
			t.Fatalf("got %v, want -32062 naming the other node and the pin", err)
		}
	})
}
