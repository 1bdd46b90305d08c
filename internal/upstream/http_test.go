package upstream

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/config"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// testCert is a freshly generated self-signed certificate for 127.0.0.1.
type testCert struct {
	tls  tls.Certificate
	leaf *x509.Certificate
	pem  []byte
}

func newTestCert(t *testing.T) testCert {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: "cmcp test upstream"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return testCert{
		tls:  tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf},
		leaf: leaf,
		pem:  pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
	}
}

// mcpServer is a real go-sdk Streamable HTTP MCP server with one tool, echo,
// that also reports the Authorization header it received.
func mcpServer(t *testing.T, wantAuth string) http.Handler {
	t.Helper()
	s := mcp.NewServer(&mcp.Implementation{Name: "upstream-under-test", Version: "1"}, nil)
	type in struct {
		Text string `json:"text"`
	}
	mcp.AddTool(s, &mcp.Tool{Name: "echo", Description: "echoes text"},
		func(ctx context.Context, req *mcp.CallToolRequest, a in) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "echo: " + a.Text}}}, nil, nil
		})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{SessionTimeout: time.Minute})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if wantAuth != "" && r.Header.Get("Authorization") != wantAuth {
			http.Error(w, "bad credentials", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

func startTLS(t *testing.T, h http.Handler, c testCert) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{c.tls}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

func newClient() *mcp.Client {
	return mcp.NewClient(&mcp.Implementation{Name: "cmcp-test", Version: "1"}, nil)
}

// callEcho connects, lists and calls echo; it returns the text or the error.
func callEcho(t *testing.T, up *HTTPUpstream) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := up.Connect(ctx, newClient(), ConnectOptions{})
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if conn.Class != up.Class() {
		t.Fatalf("connection class %q, upstream class %q", conn.Class, up.Class())
	}
	cs := conn.Session
	var names []string
	for tool, err := range cs.Tools(ctx, nil) {
		if err != nil {
			return "", err
		}
		names = append(names, tool.Name)
	}
	if len(names) != 1 || names[0] != "echo" {
		t.Fatalf("tools = %v, want [echo]", names)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "hi"}})
	if err != nil {
		return "", err
	}
	return res.Content[0].(*mcp.TextContent).Text, nil
}

func TestHTTPPinnedRightKey(t *testing.T) {
	c := newTestCert(t)
	srv := startTLS(t, mcpServer(t, ""), c)
	up, err := NewHTTP(HTTPOptions{Name: "pinned", URL: srv.URL + "/mcp", TLSPin: SPKIDigest(c.leaf).String()})
	if err != nil {
		t.Fatal(err)
	}
	if up.Class() != ClassTLSPinned {
		t.Fatalf("class = %q, want %q", up.Class(), ClassTLSPinned)
	}
	got, err := callEcho(t, up)
	if err != nil {
		t.Fatalf("call through the right pin failed: %v", err)
	}
	if got != "echo: hi" {
		t.Fatalf("echo = %q", got)
	}
	if !up.ObservedKey().Equal(SPKIDigest(c.leaf)) {
		t.Fatalf("observed key %s, want %s", up.ObservedKey(), SPKIDigest(c.leaf))
	}
}

func TestHTTPPinnedWrongKeyRefused(t *testing.T) {
	served := newTestCert(t)
	other := newTestCert(t) // the key the operator pinned; the server has another one
	var reached atomic.Int64
	h := mcpServer(t, "")
	srv := startTLS(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		h.ServeHTTP(w, r)
	}), served)
	want := SPKIDigest(other.leaf)
	up, err := NewHTTP(HTTPOptions{Name: "pinned", URL: srv.URL + "/mcp", TLSPin: want.String()})
	if err != nil {
		t.Fatal(err)
	}
	_, err = callEcho(t, up)
	var pm *PinMismatchError
	if !errors.As(err, &pm) {
		t.Fatalf("err = %v, want a *PinMismatchError", err)
	}
	if !pm.Want.Equal(want) || !pm.Got.Equal(SPKIDigest(served.leaf)) || pm.Upstream != "pinned" {
		t.Fatalf("mismatch error fields = %+v", pm)
	}
	msg := err.Error()
	t.Logf("refused as expected: %v", msg)
	for _, s := range []string{`upstream "pinned"`, want.String(), SPKIDigest(served.leaf).String(), "does not match tls_pin"} {
		if !strings.Contains(msg, s) {
			t.Errorf("error %q does not mention %q", msg, s)
		}
	}
	if n := reached.Load(); n != 0 {
		t.Fatalf("%d requests reached the server with the wrong key", n)
	}
}

func TestHTTPCAVerified(t *testing.T) {
	c := newTestCert(t)
	srv := startTLS(t, mcpServer(t, ""), c)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, c.pem, 0o600); err != nil {
		t.Fatal(err)
	}
	up, err := NewHTTP(HTTPOptions{Name: "ca", URL: srv.URL + "/mcp", CAFile: caFile})
	if err != nil {
		t.Fatal(err)
	}
	if up.Class() != ClassTLSCA {
		t.Fatalf("class = %q, want %q", up.Class(), ClassTLSCA)
	}
	if got, err := callEcho(t, up); err != nil || got != "echo: hi" {
		t.Fatalf("call with ca_file: %q, %v", got, err)
	}

	// The same server against the system roots: its self-signed
	// certificate is not trusted, and the error says what to do.
	up, err = NewHTTP(HTTPOptions{Name: "ca", URL: srv.URL + "/mcp"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = callEcho(t, up)
	if err == nil || !strings.Contains(err.Error(), "tls_pin") || !strings.Contains(err.Error(), `upstream "ca"`) {
		t.Fatalf("untrusted CA: err = %v, want a certificate error naming the upstream and tls_pin", err)
	}
}

func TestHTTPPlaintextLoopbackAndCredentials(t *testing.T) {
	const token = "s3cret-upstream-token"
	srv := httptest.NewServer(mcpServer(t, "Bearer "+token))
	t.Cleanup(srv.Close)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	headerFile := filepath.Join(t.TempDir(), "auth-header")
	if err := os.WriteFile(headerFile, []byte("Bearer "+token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"UPSTREAM_TOKEN": token}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }

	for _, tc := range []struct {
		name string
		opt  HTTPOptions
	}{
		{"env", HTTPOptions{BearerTokenEnv: "UPSTREAM_TOKEN"}},
		{"file", HTTPOptions{BearerTokenFile: tokenFile}},
		{"header-env", HTTPOptions{HeadersFromEnv: map[string]string{"Authorization": "UPSTREAM_TOKEN"}}},
		{"header-file", HTTPOptions{HeadersFromFile: map[string]string{"Authorization": headerFile}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.opt
			o.Name, o.URL, o.LookupEnv = "plain", srv.URL+"/mcp", lookup
			if tc.name == "header-env" {
				env["UPSTREAM_TOKEN_HDR"] = "Bearer " + token
				o.HeadersFromEnv = map[string]string{"Authorization": "UPSTREAM_TOKEN_HDR"}
			}
			up, err := NewHTTP(o)
			if err != nil {
				t.Fatal(err)
			}
			if up.Class() != ClassPlaintext {
				t.Fatalf("class = %q, want plaintext", up.Class())
			}
			if got, err := callEcho(t, up); err != nil || got != "echo: hi" {
				t.Fatalf("call: %q, %v", got, err)
			}
		})
	}

	// Without the credential the server refuses, and the error names the upstream.
	up, err := NewHTTP(HTTPOptions{Name: "plain", URL: srv.URL + "/mcp"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := callEcho(t, up); err == nil || !strings.Contains(err.Error(), `upstream "plain"`) {
		t.Fatalf("no credential: err = %v", err)
	}
}

func TestHTTPRedirectRefused(t *testing.T) {
	target := httptest.NewServer(mcpServer(t, ""))
	t.Cleanup(target.Close)
	redir := httptest.NewServer(http.RedirectHandler(target.URL+"/mcp", http.StatusTemporaryRedirect))
	t.Cleanup(redir.Close)
	up, err := NewHTTP(HTTPOptions{Name: "redir", URL: redir.URL + "/mcp"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = callEcho(t, up)
	if err == nil || !strings.Contains(err.Error(), "redirected") {
		t.Fatalf("err = %v, want a refused redirect", err)
	}
}

// TestHTTPRedirectKeepsTheQuerySecret: a server that redirects keeping
// the query (Starlette's redirect_slashes, Werkzeug's strict_slashes:
// /mcp to /mcp/) is refused with an error that does not quote it.
func TestHTTPRedirectKeepsTheQuerySecret(t *testing.T) {
	const secret = "SUPERSECRET"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/mcp/?"+r.URL.RawQuery, http.StatusTemporaryRedirect)
	}))
	defer srv.Close()
	up, err := NewHTTP(HTTPOptions{Name: "q", URL: srv.URL + "/mcp?api_key=" + secret})
	if err != nil {
		t.Fatal(err)
	}
	_, err = up.Connect(context.Background(), mcp.NewClient(&mcp.Implementation{Name: "c", Version: "1"}, nil), ConnectOptions{})
	if err == nil || strings.Contains(err.Error(), secret) || !strings.Contains(err.Error(), "redirected") {
		t.Fatalf("err = %v, want a refused redirect without the url's query", err)
	}
}

func TestHTTPOptionsErrors(t *testing.T) {
	pin := digest.Bytes([]byte("k")).String()
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	noEnv := func(string) (string, bool) { return "", false }
	for _, tc := range []struct {
		name string
		opt  HTTPOptions
		want string
	}{
		{"remote plaintext", HTTPOptions{URL: "http://192.0.2.10:8080/mcp"}, "not a loopback address"},
		{"remote plaintext name", HTTPOptions{URL: "http://mcp.example.com/mcp"}, "allow_remote_plaintext"},
		{"pin on http", HTTPOptions{URL: "http://127.0.0.1:1/mcp", TLSPin: pin}, "use https://"},
		{"bad pin", HTTPOptions{URL: "https://127.0.0.1:1/mcp", TLSPin: "sha256:ABC"}, "tls_pin"},
		{"pin and ca", HTTPOptions{URL: "https://127.0.0.1:1/mcp", TLSPin: pin, CAFile: notPEM}, "remove ca_file"},
		{"ca not pem", HTTPOptions{URL: "https://127.0.0.1:1/mcp", CAFile: notPEM}, "no PEM certificate"},
		{"ca missing", HTTPOptions{URL: "https://127.0.0.1:1/mcp", CAFile: filepath.Join(dir, "nope")}, "ca_file"},
		{"scheme", HTTPOptions{URL: "ftp://127.0.0.1/mcp"}, "not supported"},
		{"no host", HTTPOptions{URL: "https:///mcp"}, "no host"},
		{"user info", HTTPOptions{URL: "https://u:pw@127.0.0.1/mcp"}, "user info"},
		{"env missing", HTTPOptions{URL: "http://127.0.0.1:1/mcp", BearerTokenEnv: "NOPE"}, "NOPE is not set"},
		{"file empty", HTTPOptions{URL: "http://127.0.0.1:1/mcp", BearerTokenFile: empty}, "is empty"},
		{"both bearer", HTTPOptions{URL: "http://127.0.0.1:1/mcp", BearerTokenFile: empty, BearerTokenEnv: "X"}, "keep one"},
		{"bad header name", HTTPOptions{URL: "http://127.0.0.1:1/mcp", HeadersFromEnv: map[string]string{"Bad Header": "X"}}, `"Bad Header" is not a valid HTTP header name`},
		{"protocol header", HTTPOptions{URL: "http://127.0.0.1:1/mcp", HeadersFromEnv: map[string]string{"mcp-protocol-version": "X"}}, "header mcp-protocol-version is part of the HTTP or MCP protocol"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.opt
			o.Name, o.LookupEnv = "bad", noEnv
			_, err := NewHTTP(o)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), `upstream "bad"`) {
				t.Fatalf("err = %v, want it to name the upstream and contain %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "pw") {
				t.Fatalf("error leaks the password: %v", err)
			}
		})
	}
	// Remote plaintext is possible when explicitly allowed.
	up, err := NewHTTP(HTTPOptions{Name: "lan", URL: "http://192.0.2.10:8080/mcp", AllowRemotePlaintext: true})
	if err != nil || up.Class() != ClassPlaintext {
		t.Fatalf("allowed remote plaintext: %v", err)
	}
}

func FuzzParsePin(f *testing.F) {
	f.Add("sha256:" + strings.Repeat("0", 64))
	f.Add(digest.Bytes([]byte("spki")).String())
	f.Add("sha256:")
	f.Add("SHA256:" + strings.Repeat("a", 64))
	f.Add("sha512:" + strings.Repeat("a", 128))
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParsePin(s)
		if err != nil {
			return
		}
		if d.String() != s {
			t.Fatalf("ParsePin(%q) round-trips to %q", s, d.String())
		}
	})
}

// TestHTTPFromConfig goes from a cmcp.yaml `http:` section (loaded by the
// real config loader) to a working pinned connection with a credential read
// from a file named relative to the config.
func TestHTTPFromConfig(t *testing.T) {
	c := newTestCert(t)
	const token = "file-token"
	srv := startTLS(t, mcpServer(t, "Bearer "+token), c)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "upstream.token"), []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	yaml := "version: 1\nupstreams:\n  - name: remote\n    http:\n      url: " + srv.URL + "/mcp\n" +
		"      tls_pin: " + SPKIDigest(c.leaf).String() + "\n      bearer_token_file: upstream.token\n      connect_timeout: 5s\n"
	path := filepath.Join(dir, "cmcp.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	u := cfg.Upstream("remote")
	up, err := NewHTTP(HTTPOptionsFromConfig(u.Name, u.HTTP, nil))
	if err != nil {
		t.Fatal(err)
	}
	if up.Class() != ClassTLSPinned {
		t.Fatalf("class = %q", up.Class())
	}
	if got, err := callEcho(t, up); err != nil || got != "echo: hi" {
		t.Fatalf("call: %q, %v", got, err)
	}
}

// TestHTTPURLQueryNeverInErrors: the query of an upstream's url may hold a
// secret; NewHTTP's errors, URL and the client's errors never have it, and
// an error from below the client that does is scrubbed.
func TestHTTPURLQueryNeverInErrors(t *testing.T) {
	const secret = "SUPERSECRET"
	for _, tc := range []struct {
		name string
		opt  HTTPOptions
	}{
		{"unparsable", HTTPOptions{URL: "http://127.0.0.1:port/mcp?api_key=" + secret}},
		{"pin on http", HTTPOptions{URL: "http://127.0.0.1:1/mcp?api_key=" + secret, TLSPin: digest.Bytes([]byte("k")).String()}},
		{"no host", HTTPOptions{URL: "https:///mcp?api_key=" + secret}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.opt
			o.Name = "q"
			_, err := NewHTTP(o)
			if err == nil || strings.Contains(err.Error(), secret) {
				t.Fatalf("err = %v, want an error without the query", err)
			}
		})
	}

	up, err := NewHTTP(HTTPOptions{Name: "q", URL: "http://127.0.0.1:1/mcp?api_key=" + secret})
	if err != nil {
		t.Fatal(err)
	}
	if up.URL() != "http://127.0.0.1:1/mcp" {
		t.Errorf("URL() = %q", up.URL())
	}
	// http.Client's own error (*url.Error) repeats the request's url.
	resp, err := up.HTTPClient().Get(up.URL())
	if err == nil {
		resp.Body.Close()
		t.Fatal("connected to 127.0.0.1:1")
	}
	if strings.Contains(err.Error(), secret) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("client error %v: want connection refused, without the query", err)
	}

	// Below the client.
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		return nil, fmt.Errorf("cannot reach %s: %w", r.URL, os.ErrDeadlineExceeded)
	})
	ct := up.HTTPClient().Transport.(*credentialTransport)
	tr := &credentialTransport{upstream: ct.upstream, base: base, endpoint: ct.endpoint, query: ct.query}
	tr.header.Store(ct.header.Load())
	req, _ := http.NewRequest(http.MethodGet, up.URL(), nil)
	_, err = tr.RoundTrip(req)
	if err == nil || strings.Contains(err.Error(), secret) || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("transport error %v: want it scrubbed, and still a deadline error", err)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
