package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/config"
	"github.com/confidential-mcp/cmcp/internal/front/httpfront"
	"github.com/confidential-mcp/cmcp/internal/gateway"
	"github.com/confidential-mcp/cmcp/internal/gwtest"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
)

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestServeMutualTLS runs Serve in process with server.tls and client_ca:
// a client certificate's subject is the identity, a bearer token works too,
// plain HTTP is refused, and cancelling Serve seals the log.
func TestServeMutualTLS(t *testing.T) {
	exe, pin := selfDigest(t)
	dir := t.TempDir()
	ca, serverCert, clientCert, caPEM := certs(t)
	writePEM(t, filepath.Join(dir, "server.crt"), "CERTIFICATE", serverCert.Certificate[0])
	key, _ := x509.MarshalPKCS8PrivateKey(serverCert.PrivateKey)
	writePEM(t, filepath.Join(dir, "server.key"), "PRIVATE KEY", key)
	os.WriteFile(filepath.Join(dir, "agents.pem"), caPEM, 0o600)

	cfgPath := filepath.Join(dir, "cmcp.yaml")
	os.WriteFile(cfgPath, []byte(fmt.Sprintf(`version: 1
server:
  listen: 127.0.0.1:0
  tee: software
  tokens:
    - identity: bot
      sha256: %s
  tls: {cert: server.crt, key: server.key, client_ca: agents.pem}
audit: {dir: audit}
upstreams:
  - name: t
    stdio: {command: %s, env: {%s: server}}
    pin: {command: %s}
`, httpfront.TokenDigest("tok-1"), exe, childEnv, pin)), 0o600)
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, cfg, ServeOptions{Environ: os.Environ(), Started: func(ep string, _ *gateway.Gateway, _ *auditlog.Writer) { ready <- ep }})
	}()
	var endpoint string
	select {
	case endpoint = <-ready:
	case err := <-done:
		t.Fatalf("Serve: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("Serve did not start")
	}
	if !strings.HasPrefix(endpoint, "https://") {
		t.Fatalf("endpoint %s", endpoint)
	}
	connect := func(tc *tls.Config, hdr http.RoundTripper) (*mcp.ClientSession, error) {
		var rt http.RoundTripper = &http.Transport{TLSClientConfig: tc}
		if hdr != nil {
			rt = gwtest.Bearer{Tok: "tok-1", Base: rt}
		}
		c := mcp.NewClient(&mcp.Implementation{Name: "tls-agent", Version: "1"}, nil)
		return c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: &http.Client{Transport: rt}, MaxRetries: -1}, nil)
	}
	if _, err := connect(&tls.Config{RootCAs: ca}, nil); err == nil {
		t.Fatal("connected with neither certificate nor token")
	}
	for _, tc := range []struct {
		name  string
		tls   *tls.Config
		token bool
		who   string
	}{
		{"client certificate", &tls.Config{RootCAs: ca, Certificates: []tls.Certificate{clientCert}}, false, "cert:CN=agent-7,O=acme"},
		{"bearer token", &tls.Config{RootCAs: ca}, true, "bot"},
	} {
		var rt http.RoundTripper
		if tc.token {
			rt = http.DefaultTransport
		}
		cs, err := connect(tc.tls, rt)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if _, err := call(t, cs, "t__echo", map[string]any{"text": tc.name}); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		cs.Close()
	}
	// Plain HTTP on the same port, with a valid token, is refused.
	plain := strings.Replace(endpoint, "https://", "http://", 1)
	req, _ := http.NewRequest("POST", plain, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"p","version":"1"}}}`))
	req.Header.Set("Authorization", "Bearer tok-1")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode < 400 || strings.Contains(string(b), `"result"`) {
			t.Fatalf("plain HTTP was served: %d %q", resp.StatusCode, b)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Serve returned %v", err)
	}
	audit := filepath.Join(dir, "audit")
	rep, err := auditlog.Verify(audit, auditlog.VerifyOptions{})
	if err != nil || !rep.Epochs[0].Sealed {
		t.Fatalf("log after shutdown: %v", err)
	}
	var agents []string
	for _, r := range kinds(readRecords(t, audit), "call") {
		agents = append(agents, r.Body["agent"].(string))
	}
	if strings.Join(agents, "|") != "cert:CN=agent-7,O=acme|bot" {
		t.Fatalf("recorded agents %v", agents)
	}
}
