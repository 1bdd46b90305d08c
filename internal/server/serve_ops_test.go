package server

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/config"
	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/confidential-mcp/cmcp/internal/front/httpfront"
	"github.com/confidential-mcp/cmcp/internal/gateway"
	"github.com/confidential-mcp/cmcp/internal/metrics"
	"github.com/confidential-mcp/cmcp/internal/upstream"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// serveYAML runs the real gateway (Serve, as `cmcp serve` does) from the
// configuration text in dir until the test ends, and returns the MCP
// endpoint and the audit directory (the config must say `audit: {dir: audit}`).
func serveYAML(t *testing.T, dir, yaml string, environ []string) (string, string) {
	t.Helper()
	return serveYAMLWith(t, dir, yaml, ServeOptions{Environ: environ})
}

// serveYAMLWith is serveYAML with more of Serve's options (Environ among
// them); the log, metrics and start hook are the test's.
func serveYAMLWith(t *testing.T, dir, yaml string, o ServeOptions) (string, string) {
	t.Helper()
	cfg, _ := loadConfigFile(t, dir, yaml)
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan string, 1)
	done := make(chan error, 1)
	logs := &lockedWriter{}
	go func() {
		o.Logger = slog.New(slog.NewTextHandler(logs, nil))
		o.Metrics = metrics.New()
		o.Started = func(endpoint string, _ *gateway.Gateway, _ *auditlog.Writer) { started <- endpoint }
		done <- Serve(ctx, cfg, o)
	}()
	var endpoint string
	select {
	case endpoint = <-started:
	case err := <-done:
		cancel()
		t.Fatalf("serve: %v\n%s", err, logs.String())
	case <-time.After(60 * time.Second):
		cancel()
		t.Fatalf("serve did not start\n%s", logs.String())
	}
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
		if t.Failed() {
			t.Logf("gateway log:\n%s", clip(logs.String(), 6000))
		}
	})
	return endpoint, filepath.Join(dir, "audit")
}

// TestServeAdminListenerIsSeparate runs `serve` with an agent token and an
// admin section: the MCP listener has no admin paths, the agent's token
// never opens the admin listener, the admin token is no agent token, and the
// kill switch engaged on the admin listener stops the agent's calls.
func TestServeAdminListenerIsSeparate(t *testing.T) {
	exe, pin := selfDigest(t)
	adminAddr := freePort(t)
	dir := t.TempDir()
	yaml := fmt.Sprintf(`version: 1
server:
  listen: 127.0.0.1:0
  tee: software
  tokens:
    - identity: agent-a
      sha256: %s
audit:
  dir: audit
admin:
  listen: %s
  token_sha256: %s
upstreams:
  - name: t
    stdio:
      command: %s
      env: {%s: server}
    pin:
      command: %s
`, httpfront.TokenDigest(testAgentToken), adminAddr, httpfront.TokenDigest(testAdminToken), exe, childEnv, pin)
	endpoint, auditDir := serveYAML(t, dir, yaml, os.Environ())
	mcpBase := strings.TrimSuffix(endpoint, "/mcp")
	admin := "http://" + adminAddr

	for _, p := range []string{"/admin/kill-switch", "/admin/kill-switch/engage", "/admin/checkpoint", "/metrics", "/healthz", "/readyz"} {
		for _, tok := range []string{testAgentToken, testAdminToken} {
			method := "GET"
			if strings.HasSuffix(p, "engage") || strings.HasSuffix(p, "checkpoint") {
				method = "POST"
			}
			if code, body := httpDo(t, method, mcpBase+p, tok); code != http.StatusNotFound {
				t.Errorf("%s %s on the MCP listener: %d %s, want 404", method, p, code, body)
			}
		}
	}
	if code, _ := httpDo(t, "GET", admin+"/metrics", testAgentToken); code != http.StatusUnauthorized {
		t.Errorf("agent token on admin /metrics: %d, want 401", code)
	}
	if code, _ := httpDo(t, "POST", admin+"/admin/kill-switch/engage", testAgentToken); code != http.StatusUnauthorized {
		t.Errorf("agent token on the kill switch: %d, want 401", code)
	}
	if _, err := connectWith(endpoint, testAdminToken); err == nil {
		t.Errorf("the admin token opened an agent session on the MCP endpoint")
	}

	cs, err := connectWith(endpoint, testAgentToken)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "t__echo", Arguments: map[string]any{"text": "a"}}); err != nil {
		t.Fatalf("call before the kill switch: %v", err)
	}
	if code, body := httpDo(t, "POST", admin+"/admin/kill-switch/engage", testAdminToken); code != 200 {
		t.Fatalf("engage: %d %s", code, body)
	}
	_, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "t__echo", Arguments: map[string]any{"text": "b"}})
	var je *jsonrpc.Error
	if !errors.As(err, &je) || je.Code != gateway.CodeKillSwitch {
		t.Fatalf("call while engaged: %v, want code %d", err, gateway.CodeKillSwitch)
	}
	if code, body := httpDo(t, "POST", admin+"/admin/kill-switch/clear", testAdminToken); code != 200 {
		t.Fatalf("clear: %d %s", code, body)
	}
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "t__echo", Arguments: map[string]any{"text": "c"}}); err != nil {
		t.Fatalf("call after clearing: %v", err)
	}
	code, body := httpDo(t, "GET", admin+"/metrics", testAdminToken)
	if code != 200 {
		t.Fatalf("metrics: %d %s", code, body)
	}
	s := parseExposition(t, body)
	if s[`cmcp_calls_total{upstream="t",decision="allow",outcome="ok"}`] != 2 {
		t.Errorf("metrics do not count the two forwarded calls:\n%s", body)
	}
	if code, body := httpDo(t, "POST", admin+"/admin/checkpoint", testAdminToken); code != 200 {
		t.Fatalf("checkpoint: %d %s", code, body)
	}
	var actions []string
	for _, a := range adminRecords(t, auditDir) {
		actions = append(actions, a.Action)
	}
	if strings.Join(actions, ",") != "kill_switch_on,kill_switch_off,checkpoint" {
		t.Fatalf("admin records: %v", actions)
	}
}

// newUpstreamCert generates a self-signed certificate for 127.0.0.1.
func newUpstreamCert(t *testing.T) (tls.Certificate, *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "pinned upstream"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, leaf
}

// TestServeHTTPUpstreamPinned fronts a real go-sdk HTTPS server whose key is
// pinned: calls go through and are recorded as tls-pinned; with the pin of
// another key the upstream is refused, and the agent is told which upstream
// is unavailable and why.
func TestServeHTTPUpstreamPinned(t *testing.T) {
	const upstreamToken = "upstream-credential-5d1c"
	s := mcp.NewServer(&mcp.Implementation{Name: "https-upstream", Version: "1"}, nil)
	type in struct {
		Text string `json:"text"`
	}
	mcp.AddTool(s, &mcp.Tool{Name: "echo", Description: "echoes text"},
		func(ctx context.Context, req *mcp.CallToolRequest, a in) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "pinned: " + a.Text}}}, nil, nil
		})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{SessionTimeout: time.Minute})
	cert, leaf := newUpstreamCert(t)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+upstreamToken {
			http.Error(w, "no credential", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	environ := append(os.Environ(), "REMOTE_TOKEN="+upstreamToken)
	cfgFor := func(pin digest.Digest) string {
		return fmt.Sprintf(`version: 1
server:
  listen: 127.0.0.1:0
  tee: software
audit:
  dir: audit
upstreams:
  - name: remote
    http:
      url: %s/mcp
      tls_pin: %s
      bearer_token_env: REMOTE_TOKEN
`, srv.URL, pin)
	}

	t.Run("right key", func(t *testing.T) {
		endpoint, auditDir := serveYAML(t, t.TempDir(), cfgFor(upstream.SPKIDigest(leaf)), environ)
		cs, err := connectWith(endpoint, "")
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "remote__echo", Arguments: map[string]any{"text": "hi"}})
		if err != nil || res.IsError || res.Content[0].(*mcp.TextContent).Text != "pinned: hi" {
			t.Fatalf("call: %v %+v", err, res)
		}
		var class string
		for _, rec := range readAuditRecords(t, auditDir) {
			if c, ok := rec.(*record.Call); ok {
				class = c.EvidenceClass
			}
		}
		if class != upstream.ClassTLSPinned {
			t.Fatalf("call record evidence class %q, want %q", class, upstream.ClassTLSPinned)
		}
	})

	t.Run("wrong key", func(t *testing.T) {
		_, other := newUpstreamCert(t)
		endpoint, _ := serveYAML(t, t.TempDir(), cfgFor(upstream.SPKIDigest(other)), environ)
		cs, err := connectWith(endpoint, "")
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "remote__echo", Arguments: map[string]any{"text": "hi"}})
		var je *jsonrpc.Error
		if !errors.As(err, &je) || je.Code != gateway.CodeUpstreamUnavailable ||
			!strings.Contains(je.Message, `upstream "remote"`) || !strings.Contains(je.Message, "does not match tls_pin") {
			t.Fatalf("call through a wrong pin: %v, want code %d naming the upstream and the pin", err, gateway.CodeUpstreamUnavailable)
		}
		t.Logf("refused as expected: %s", je.Message)
	})
}

// TestServeConfigLimits: the server section's limits, read from a real
// configuration file by Serve, are enforced: max_request_bytes (413),
// call_timeout (the upstream timeout code, the upstream told to cancel),
// max_sessions_per_agent (429) and session_timeout (an idle session ends,
// recorded, and frees its place).
func TestServeConfigLimits(t *testing.T) {
	exe, pin := selfDigest(t)
	dir := t.TempDir()
	mark := filepath.Join(dir, "hang-mark")
	yaml := fmt.Sprintf(`version: 1
server:
  listen: 127.0.0.1:0
  tee: software
  max_request_bytes: 4096
  call_timeout: 1s
  session_timeout: 2s
  max_sessions_per_agent: 1
audit:
  dir: audit
upstreams:
  - name: t
    stdio:
      command: %s
      env: {%s: server, CMCP_TEST_MARK: %s}
    pin:
      command: %s
`, exe, childEnv, mark, pin)
	endpoint, auditDir := serveYAML(t, dir, yaml, os.Environ())
	cs, err := connectWith(endpoint, "")
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := connectWith(endpoint, ""); err == nil || !strings.Contains(err.Error(), "Too Many Requests") {
		t.Fatalf("a second session with max_sessions_per_agent 1: %v, want 429", err)
	}

	big := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"t__echo","arguments":{"text":"` + strings.Repeat("a", 8192) + `"}}}`
	if code, body := rawPost(t, endpoint, cs.ID(), []byte(big)); code != http.StatusRequestEntityTooLarge {
		t.Fatalf("8 KiB request with max_request_bytes 4096: status %d %s", code, clip(body, 200))
	}
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "t__echo", Arguments: map[string]any{"text": strings.Repeat("a", 1024)}}); err != nil {
		t.Fatalf("1 KiB call: %v", err)
	}

	start := time.Now()
	_, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "t__hang", Arguments: map[string]any{}})
	var je *jsonrpc.Error
	if !errors.As(err, &je) || je.Code != gateway.CodeUpstreamTimeout {
		t.Fatalf("hung call with call_timeout 1s: %v, want code %d", err, gateway.CodeUpstreamTimeout)
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Fatalf("the timeout took %v", d)
	}
	eventually(t, 10*time.Second, func() string {
		if b, _ := os.ReadFile(mark); string(b) != "cancelled" {
			return "the upstream was not told to cancel the timed-out call"
		}
		return ""
	})

	// Idle past session_timeout: the session ends and its end is recorded.
	sid := cs.ID()
	eventually(t, 20*time.Second, func() string {
		for _, r := range readRecords(t, auditDir) {
			if r.Kind == "session" && r.Body["id"] == sid && r.Body["event"] == "end" {
				return ""
			}
		}
		return "no session end record for the idle session"
	})
	second, err := connectWith(endpoint, "")
	if err != nil {
		t.Fatalf("a session after the idle one ended: %v", err)
	}
	second.Close()
}

// TestIdleConnectionsClosed: a keep-alive connection to the MCP listener
// that carries no request is closed after the idle timeout, so clients
// (here one that was refused 401) cannot hold connections, and with them
// file descriptors, open for ever. (The request has no body: one refused
// with a body gets its connection closed at once, see
// TestRefusedSlowBodyIsAnsweredAndClosed.)
func TestIdleConnectionsClosed(t *testing.T) {
	exe, pin := selfDigest(t)
	dir := t.TempDir()
	yaml := fmt.Sprintf(`version: 1
server:
  listen: 127.0.0.1:0
  tee: software
  tokens: [{identity: alice, sha256: %q}]
audit:
  dir: audit
upstreams:
  - name: t
    stdio:
      command: %s
      env: {%s: server}
    pin:
      command: %s
`, httpfront.TokenDigest("s3cret").String(), exe, childEnv, pin)
	endpoint, _ := serveYAMLWith(t, dir, yaml, ServeOptions{Environ: os.Environ(), IdleConnTimeout: 300 * time.Millisecond})
	host := strings.TrimSuffix(strings.TrimPrefix(endpoint, "http://"), "/mcp")
	conn, err := net.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /mcp HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 0\r\n\r\n", host)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || resp.Close {
		t.Fatalf("unauthenticated request: status %d, close %v; want 401 on a kept-alive connection", resp.StatusCode, resp.Close)
	}
	start := time.Now()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := br.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("idle connection: read %d bytes, %v; want it closed by the gateway (EOF)", n, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("idle connection closed after %v, want about the 300 ms idle timeout", d)
	}
}

// TestRefusedSlowBodyIsAnsweredAndClosed: a request refused before its
// body is read (no or a wrong credential: 401; a rebinding Host: 403;
// another identity's session: 403) is answered at once with Connection:
// close, and the connection closed, however slowly its body trickles in.
// Before, net/http read the unread body before writing the refusal, with no
// deadline (it was set only after authentication): a client without
// credentials sending a byte every few seconds held the connection, and
// its file descriptor, for ever; 300 of them locked alice out.
func TestRefusedSlowBodyIsAnsweredAndClosed(t *testing.T) {
	exe, pin := selfDigest(t)
	dir := t.TempDir()
	yaml := fmt.Sprintf(`version: 1
server:
  listen: 127.0.0.1:0
  tee: software
  tokens: [{identity: alice, sha256: %q}, {identity: bob, sha256: %q}]
audit:
  dir: audit
upstreams:
  - name: t
    stdio:
      command: %s
      env: {%s: server}
    pin:
      command: %s
`, httpfront.TokenDigest("alice-token").String(), httpfront.TokenDigest("bob-token").String(), exe, childEnv, pin)
	endpoint, _ := serveYAMLWith(t, dir, yaml, ServeOptions{Environ: os.Environ(), IdleConnTimeout: 300 * time.Millisecond})
	host := strings.TrimSuffix(strings.TrimPrefix(endpoint, "http://"), "/mcp")
	alice, err := connectWith(endpoint, "alice-token")
	if err != nil {
		t.Fatal(err)
	}
	defer alice.Close()
	for _, tc := range []struct {
		name, header string
		status       int
	}{
		{"no credential", "Host: " + host, http.StatusUnauthorized},
		{"wrong token", "Host: " + host + "\r\nAuthorization: Bearer nope", http.StatusUnauthorized},
		{"rebinding host", "Host: evil.example\r\nAuthorization: Bearer alice-token", http.StatusForbidden},
		{"another identity's session", "Host: " + host + "\r\nAuthorization: Bearer bob-token\r\nMcp-Session-Id: " + alice.ID(), http.StatusForbidden},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", host)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			fmt.Fprintf(conn, "POST /mcp HTTP/1.1\r\n%s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: 100000\r\n\r\n{", tc.header)
			type answer struct {
				resp *http.Response
				err  error
				eof  error // reading on after the answer
			}
			got := make(chan answer, 1)
			go func() {
				br := bufio.NewReader(conn)
				resp, err := http.ReadResponse(br, nil)
				a := answer{resp: resp, err: err}
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					_, a.eof = br.ReadByte()
				}
				got <- a
			}()
			start := time.Now()
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case a := <-got:
					if a.err != nil {
						t.Fatalf("no answer: %v", a.err)
					}
					if a.resp.StatusCode != tc.status || !a.resp.Close || !errors.Is(a.eof, io.EOF) {
						t.Fatalf("status %d, Connection: close %v, then %v; want %d, close and EOF", a.resp.StatusCode, a.resp.Close, a.eof, tc.status)
					}
					if d := time.Since(start); d > 3*time.Second {
						t.Fatalf("answered and closed after %v, want at once", d)
					}
					return
				case <-tick.C:
					if time.Since(start) > 10*time.Second {
						t.Fatal("a refused request trickling its body got no answer after 10 s (the body timeout is a minute; before, there was none): the connection can be held for ever")
					}
					conn.Write([]byte(" ")) // an error once the gateway closed: the answer is still read
				}
			}
		})
	}
}

// TestRefusedLargeBodyGetsItsAnswer: a request refused before its body is
// read to its end (a wrong token: 401; a rebinding Host: 403; another
// identity's session: 403; past the agent's session bound: 429; a batch:
// 400) whose body is larger than what the gateway has buffered gets its
// answer, not a connection reset: a client whose token was rotated must
// see the 401 to know to fetch a new one. The connection is closed after
// the answer with unread bytes in it; closed at once, the kernel sends a
// reset that can overtake the answer. Before, the body limit put in r.Body
// ahead of the checks hid the unread body from net/http, which lingers
// before closing only when its own body is left with more than 256 KiB
// (and never for a client that sent Connection: close): 16 of 20 clients
// posting 2 MiB with a rotated token got a transport error.
func TestRefusedLargeBodyGetsItsAnswer(t *testing.T) {
	exe, pin := selfDigest(t)
	dir := t.TempDir()
	yaml := fmt.Sprintf(`version: 1
server:
  listen: 127.0.0.1:0
  tee: software
  tokens: [{identity: alice, sha256: %q}, {identity: bob, sha256: %q}]
  max_sessions_per_agent: 1
audit:
  dir: audit
upstreams:
  - name: t
    stdio:
      command: %s
      env: {%s: server}
    pin:
      command: %s
`, httpfront.TokenDigest("alice-token").String(), httpfront.TokenDigest("bob-token").String(), exe, childEnv, pin)
	endpoint, _ := serveYAMLWith(t, dir, yaml, ServeOptions{Environ: os.Environ()})
	alice, err := connectWith(endpoint, "alice-token")
	if err != nil {
		t.Fatal(err)
	}
	defer alice.Close()
	for _, tc := range []struct {
		name, token, host, session string
		batch                      bool
		status                     int
	}{
		{name: "rotated token", token: "rotated-token", status: http.StatusUnauthorized},
		{name: "rebinding host", token: "alice-token", host: "evil.example", status: http.StatusForbidden},
		{name: "another identity's session", token: "bob-token", session: alice.ID(), status: http.StatusForbidden},
		{name: "past the session bound", token: "alice-token", status: http.StatusTooManyRequests},
		{name: "a batch", token: "alice-token", session: alice.ID(), batch: true, status: http.StatusBadRequest},
	} {
		for _, size := range []int{16 << 10, 200 << 10, 2 << 20} {
			t.Run(fmt.Sprintf("%s/%d KiB", tc.name, size>>10), func(t *testing.T) {
				body := []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t__echo","arguments":{"text":"` + strings.Repeat("x", size) + `"}}}`)
				if tc.batch {
					body = append(append([]byte("["), body...), ']')
				}
				const clients = 16
				errs := make(chan error, clients)
				for i := range clients {
					go func() {
						req, _ := http.NewRequest("POST", endpoint, bytes.NewReader(body))
						if tc.host != "" {
							req.Host = tc.host
						}
						req.Header.Set("Authorization", "Bearer "+tc.token)
						req.Header.Set("Content-Type", "application/json")
						req.Header.Set("Accept", "application/json, text/event-stream")
						if tc.session != "" {
							req.Header.Set("Mcp-Session-Id", tc.session)
							req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
						}
						// A connection of its own for each client; half
						// of them send Connection: close.
						hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: i%2 == 1}, Timeout: 20 * time.Second}
						resp, err := hc.Do(req)
						if err != nil {
							errs <- fmt.Errorf("no answer: %w", err)
							return
						}
						defer resp.Body.Close()
						b, err := io.ReadAll(resp.Body)
						switch {
						case err != nil:
							errs <- fmt.Errorf("status %d, then reading the answer: %w", resp.StatusCode, err)
						case resp.StatusCode != tc.status:
							errs <- fmt.Errorf("status %d %s, want %d", resp.StatusCode, clip(string(b), 200), tc.status)
						default:
							errs <- nil
						}
					}()
				}
				failed := 0
				for range clients {
					if err := <-errs; err != nil {
						failed++
						t.Log(err)
					}
				}
				if failed > 0 {
					t.Fatalf("%d of %d clients got no %d", failed, clients, tc.status)
				}
			})
		}
	}
}

// stdioServe is `serve --stdio` run by Serve from a real configuration
// file, with a go-sdk client as the agent that spawned it.
type stdioServe struct {
	dir    string // the configuration's directory (audit/ below it)
	cs     *mcp.ClientSession
	ctx    context.Context // the agent's (30 s)
	g      *gateway.Gateway
	in     io.Closer  // the agent's end of cmcp's stdin
	signal func()     // SIGTERM: ends Serve's context
	done   chan error // Serve's return
	logs   *lockedWriter
}

// serveStdio starts `serve --stdio` with one test-child upstream and the
// given server: section lines (and extra lines for its stdio: section),
// and connects an agent.
func serveStdio(t *testing.T, server string, stdio ...string) *stdioServe {
	t.Helper()
	return serveStdioMode(t, "server", server, stdio...)
}

// serveStdioMode is serveStdio with the test child in the given mode.
func serveStdioMode(t *testing.T, mode, server string, stdio ...string) *stdioServe {
	t.Helper()
	st, inW, outR := startServeStdio(t, mode, server, stdio...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	st.ctx = ctx
	c := mcp.NewClient(&mcp.Implementation{Name: "desktop", Version: "1"}, nil)
	var err error
	if st.cs, err = c.Connect(ctx, &mcp.IOTransport{Reader: outR, Writer: inW}, nil); err != nil {
		t.Fatalf("connect: %v\n%s", err, st.logs.String())
	}
	t.Cleanup(func() { st.cs.Close() })
	return st
}

// startServeStdio starts `serve --stdio` as serveStdioMode does, and
// returns the agent's ends of cmcp's stdin and stdout instead of a client.
func startServeStdio(t *testing.T, mode, server string, stdio ...string) (*stdioServe, *io.PipeWriter, *io.PipeReader) {
	t.Helper()
	exe, pin := selfDigest(t)
	st := &stdioServe{dir: t.TempDir(), done: make(chan error, 1), logs: &lockedWriter{}}
	path := filepath.Join(st.dir, "cmcp.yaml")
	yaml := fmt.Sprintf(`version: 1
server:
  tee: software
%saudit:
  dir: audit
upstreams:
  - name: t
    stdio:
      command: %s
      env: {%s: %s}
%s    pin:
      command: %s
`, server, exe, childEnv, mode, strings.Join(stdio, ""), pin)
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	st.in = inW
	sig, signal := context.WithCancel(context.Background())
	t.Cleanup(signal)
	st.signal = signal
	gw := make(chan *gateway.Gateway, 1)
	go func() {
		st.done <- Serve(sig, cfg, ServeOptions{Stdio: true, Stdin: inR, Stdout: outW, Environ: os.Environ(), Metrics: metrics.New(),
			Logger: slog.New(slog.NewTextHandler(st.logs, nil)), Started: func(_ string, g *gateway.Gateway, _ *auditlog.Writer) { gw <- g }})
	}()
	select {
	case st.g = <-gw:
	case err := <-st.done:
		t.Fatalf("Serve: %v\n%s", err, st.logs.String())
	}
	return st, inW, outR
}

// wait waits for Serve to return, and fails t unless it returned nil.
func (st *stdioServe) wait(t *testing.T) {
	t.Helper()
	select {
	case err := <-st.done:
		if err != nil {
			t.Fatalf("Serve: %v\n%s", err, st.logs.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("Serve did not return\n%s", st.logs.String())
	}
}

// TestServeStdioFromConfig: `serve --stdio` as Serve runs it from a real
// configuration file: the agent that spawned cmcp is server.stdio_identity
// in the call record, and when it closes its end Serve returns after
// stopping the children and sealing the log.
func TestServeStdioFromConfig(t *testing.T) {
	st := serveStdio(t, "  stdio_identity: desktop-user\n")
	res, err := st.cs.CallTool(st.ctx, &mcp.CallToolParams{Name: "t__echo", Arguments: map[string]any{"text": "over stdio"}})
	if err != nil || len(res.Content) == 0 || res.Content[0].(*mcp.TextContent).Text != "echo: over stdio" {
		t.Fatalf("call: %v %v", res, err)
	}
	st.cs.Close()
	st.in.Close()
	st.wait(t)
	rs := readRecords(t, filepath.Join(st.dir, "audit"))
	calls := kinds(rs, "call")
	if len(calls) != 1 || calls[0].Body["agent"] != "desktop-user" {
		t.Fatalf("call records: %v", calls)
	}
	if len(kinds(rs, "seal")) != 1 {
		t.Fatalf("no seal record: the log was not closed on disconnect")
	}
}

// TestServeStdioDrainsOnSignal: SIGTERM or SIGINT (Serve's context ending)
// during `serve --stdio` drains the call in flight, answering it over the
// agent's connection, refuses a new call with -32068 (recorded), and then
// stops the children and seals the log, as the HTTP front does.
func TestServeStdioDrainsOnSignal(t *testing.T) {
	st := serveStdio(t, "  shutdown_grace: 10s\n")
	cs, ctx := st.cs, st.ctx
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "t__echo", Arguments: map[string]any{"text": "warm"}}); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		res *mcp.CallToolResult
		err error
	}
	inflight := make(chan answer, 1)
	go func() {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "t__sleep", Arguments: map[string]any{"text": "1s"}})
		inflight <- answer{res, err}
	}()
	time.Sleep(300 * time.Millisecond)
	st.signal()
	eventually(t, 5*time.Second, func() string {
		if !st.g.Draining() {
			return "the gateway is not shutting down yet"
		}
		return ""
	})
	_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "t__echo", Arguments: map[string]any{"text": "late"}})
	if wireCode(err) != gateway.CodeShuttingDown {
		t.Fatalf("a call during the drain: %v, want %d", err, gateway.CodeShuttingDown)
	}
	a := <-inflight
	if a.err != nil || firstText(a.res) != "slept 1s" {
		t.Fatalf("the in-flight call was not drained: %q %v\n%s", firstText(a.res), a.err, st.logs.String())
	}
	st.wait(t)
	audit := filepath.Join(st.dir, "audit")
	rep, err := auditlog.Verify(audit, auditlog.VerifyOptions{})
	if err != nil || !rep.Epochs[0].Sealed {
		t.Fatalf("log after shutdown: %v (sealed: %v)", err, err == nil && rep.Epochs[0].Sealed)
	}
	rs := readRecords(t, audit)
	calls, results := kinds(rs, "call"), kinds(rs, "result")
	if len(calls) != 3 || calls[1].Body["tool"] != "t__sleep" || calls[2].Body["outcome"] != "refused" {
		t.Fatalf("call records: %v", calls)
	}
	if len(results) != 2 || results[1].Body["outcome"] != "ok" {
		t.Fatalf("result records: %v", results)
	}
}

// TestServeRefusesLogDamagedBeforeCheckpoint: a log damaged where recovery
// may not cut it (before its last signed checkpoint) stops serve with
// verify-chain's integrity exit code, and no new epoch is started on it.
func TestServeRefusesLogDamagedBeforeCheckpoint(t *testing.T) {
	dir := t.TempDir()
	auditDir := filepath.Join(dir, "audit")
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	w, err := auditlog.Open(auditDir, auditlog.Options{Key: key, Gateway: record.GatewayInfo{Version: "test", Platform: "software"}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := w.Append(context.Background(), &record.Session{ID: fmt.Sprint(i), Event: "start", Agent: "allowed-agent", Front: "http"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	segs, _ := filepath.Glob(filepath.Join(auditDir, "epoch-000001", "seg-*.jsonl"))
	b, err := os.ReadFile(segs[0])
	if err != nil || !bytes.Contains(b, []byte("allowed-agent")) {
		t.Fatalf("segment: %v", err)
	}
	os.WriteFile(segs[0], bytes.Replace(b, []byte("allowed-agent"), []byte("another-agent"), 1), 0o600)
	path := filepath.Join(dir, "cmcp.yaml")
	exe, pin := selfDigest(t)
	yaml := fmt.Sprintf("version: 1\nserver:\n  tee: software\naudit:\n  dir: audit\nupstreams:\n  - name: t\n    stdio:\n      command: %s\n      env: {%s: server}\n    pin:\n      command: %s\n", exe, childEnv, pin)
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	err = Serve(context.Background(), cfg, ServeOptions{Listen: "127.0.0.1:0", Environ: os.Environ(), Logger: slog.New(slog.DiscardHandler)})
	if code := exitcode.CodeOf(err); code != exitcode.ExitLogInteg || !strings.Contains(err.Error(), "checkpoint") {
		t.Fatalf("serve on a damaged log: exit %d, %v", code, err)
	}
	if eps, _ := filepath.Glob(filepath.Join(auditDir, "epoch-*")); len(eps) != 1 {
		t.Fatalf("a new epoch was started on a damaged log: %v", eps)
	}
}

// TestServeSealedUpstream: stdio.sealed in the configuration runs the
// child from a sealed memfd copy (its /proc/<pid>/exe is the memfd).
func TestServeSealedUpstream(t *testing.T) {
	st := serveStdio(t, "", "      sealed: true\n")
	res, err := st.cs.CallTool(st.ctx, &mcp.CallToolParams{Name: "t__pid"})
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	fmt.Sscan(firstText(res), &pid)
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil || !strings.HasPrefix(exe, "/memfd:cmcp:") {
		t.Fatalf("child %d runs %q (%v), want a sealed memfd", pid, exe, err)
	}
}

// loadConfigFile writes yaml to dir/cmcp.yaml and loads it.
func loadConfigFile(t *testing.T, dir, yaml string) (*config.Config, string) {
	t.Helper()
	path := filepath.Join(dir, "cmcp.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, path
}
