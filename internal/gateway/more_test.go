package gateway

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/upstream"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// TestBusySessionIsNotReaped: calls answered by the fast path (which go-sdk
// never sees) keep a session alive past its idle timeout.
func TestBusySessionIsNotReaped(t *testing.T) {
	h := newHarness(t, hconf{idle: 500 * time.Millisecond})
	cs := h.connect("", nil)
	pid := pidOf(t, cs, "t__pid")
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); {
		if got := pidOf(t, cs, "t__pid"); got != pid {
			t.Fatalf("the session's child changed from %d to %d: the busy session was reaped", pid, got)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if h.g.fastPath.Load() == 0 {
		t.Fatal("no call went through the fast path")
	}
}

func TestIdleSessionIsReaped(t *testing.T) {
	h := newHarness(t, hconf{idle: time.Second})
	cs := h.connect("", nil)
	pid := pidOf(t, cs, "t__pid")
	// The agent goes away without DELETE: the session times out and its
	// child is stopped.
	eventually(t, 10*time.Second, func() string {
		if pidAlive(pid) {
			return "the idle session's child is still running"
		}
		return ""
	})
	eventually(t, 5*time.Second, func() string {
		for _, r := range kinds(h.records(), "session") {
			if r.Body["event"] == "end" {
				return ""
			}
		}
		return "no session end record"
	})
	if h.g.Sessions() != 0 {
		t.Fatalf("%d sessions still live", h.g.Sessions())
	}
}

func TestUpstreamListChanged(t *testing.T) {
	for _, kind := range []string{"stdio", "http"} {
		t.Run(kind, func(t *testing.T) { testUpstreamListChanged(t, hconf{http: kind == "http"}) })
	}
}

// testUpstreamListChanged: an upstream whose tool call changes its tools
// and prompts (t__mutate) sends list_changed, on whatever stream its
// transport uses; the gateway re-checks the pins, records the drift and
// tells the agent.
func testUpstreamListChanged(t *testing.T, hc hconf) {
	h := newHarness(t, hc)
	var changed, prompts atomic.Int32
	cs := h.connect("", &mcp.ClientOptions{
		ToolListChangedHandler:   func(context.Context, *mcp.ToolListChangedRequest) { changed.Add(1) },
		PromptListChangedHandler: func(context.Context, *mcp.PromptListChangedRequest) { prompts.Add(1) },
	})
	if _, err := call(t, cs, "t__mutate", nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() string {
		if changed.Load() == 0 {
			return "the agent got no tools/list_changed"
		}
		if prompts.Load() == 0 {
			return "the agent got no prompts/list_changed"
		}
		return ""
	})
	lt, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range lt.Tools {
		names = append(names, tl.Name)
	}
	if slices.Contains(names, "t__fail") || slices.Contains(names, "t__sneaky") {
		t.Fatalf("after list_changed the agent sees %v", names)
	}
	pl, err := cs.ListPrompts(context.Background(), nil)
	if err != nil || len(pl.Prompts) != 3 { // greet, stuck, and the new one
		t.Fatalf("prompts after list_changed: %v %v", pl, err)
	}
	// An added tool is not in the catalog (unknown); a removed one is
	// refused as drifted.
	if _, err := call(t, cs, "t__sneaky", nil); wireCode(err) != CodeUnknownTool {
		t.Fatalf("an added, unpinned tool: %v, want %d", err, CodeUnknownTool)
	}
	if _, err := call(t, cs, "t__fail", nil); wireCode(err) != CodeToolDrifted {
		t.Fatalf("a removed tool: %v, want %d", err, CodeToolDrifted)
	}
	got := map[string]string{}
	for _, r := range kinds(h.records(), "drift") {
		got[r.Body["tool"].(string)] = r.Body["change"].(string) + "/" + r.Body["action"].(string)
	}
	if got["fail"] != "removed/refused" || got["sneaky"] != "new/refused" {
		t.Fatalf("drift records: %v", got)
	}
}

func TestMutualTLSIdentity(t *testing.T) {
	h := newHarness(t, hconf{})
	ca, serverCert, clientCert, _ := certs(t)
	srv := httptest.NewUnstartedServer(h.g.HTTPHandler(HTTPOptions{ClientCerts: true}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{serverCert}, ClientCAs: ca, ClientAuth: tls.VerifyClientCertIfGiven}
	srv.StartTLS()
	defer srv.Close()

	connect := func(withCert bool) (*mcp.ClientSession, error) {
		tc := &tls.Config{RootCAs: ca}
		if withCert {
			tc.Certificates = []tls.Certificate{clientCert}
		}
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tc}}
		c := mcp.NewClient(&mcp.Implementation{Name: "mtls-agent", Version: "1"}, nil)
		return c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: srv.URL, HTTPClient: hc, MaxRetries: -1}, nil)
	}
	if _, err := connect(false); err == nil {
		t.Fatal("connected without a client certificate or token")
	}
	cs, err := connect(true)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if _, err := call(t, cs, "t__echo", map[string]any{"text": "x"}); err != nil {
		t.Fatal(err)
	}
	calls := kinds(h.records(), "call")
	if agent := calls[len(calls)-1].Body["agent"].(string); !strings.HasPrefix(agent, "cert:") || !strings.Contains(agent, "CN=agent-7") {
		t.Fatalf("agent identity %q, want the certificate subject", agent)
	}
}

func TestMeasureTargetCheckedBeforeEverySpawn(t *testing.T) {
	tree := t.TempDir()
	os.WriteFile(filepath.Join(tree, "server.js"), []byte("console.log('v1')\n"), 0o644)
	os.MkdirAll(filepath.Join(tree, "node_modules", "dep"), 0o755)
	os.WriteFile(filepath.Join(tree, "node_modules", "dep", "index.js"), []byte("module.exports = 1\n"), 0o644)
	pin, err := digest.Tree(context.Background(), tree, digest.TreeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, hconf{measure: tree, measurePin: pin})
	a := h.connect("", nil)
	if _, err := call(t, a, "t__echo", map[string]any{"text": "ok"}); err != nil {
		t.Fatalf("matching tree: %v", err)
	}
	// A file deep in the package changes: the next spawn is refused.
	os.WriteFile(filepath.Join(tree, "node_modules", "dep", "index.js"), []byte("module.exports = 'evil'\n"), 0o644)
	b := h.connect("", nil)
	_, err = call(t, b, "t__echo", map[string]any{"text": "no"})
	if wireCode(err) != CodeUpstreamUnavailable || !strings.Contains(err.Error(), "measure target") || !strings.Contains(err.Error(), pin.String()) {
		t.Fatalf("changed tree: %v", err)
	}
	refused := false
	for _, s := range kinds(h.records(), "spawn") {
		refused = refused || (s.Body["outcome"] == "refused" && s.Body["measure_target"] == tree)
	}
	if !refused {
		t.Fatal("the refused spawn is not recorded with its measure target")
	}
}

func TestStdioBadInput(t *testing.T) {
	h := newHarness(t, hconf{})
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- h.g.ServeStdio(context.Background(), inR, outW, "local") }()
	replies := bufio.NewScanner(outR)
	send := func(line string) map[string]any {
		t.Helper()
		if _, err := io.WriteString(inW, line+"\n"); err != nil {
			t.Fatal(err)
		}
		if !replies.Scan() {
			t.Fatalf("no reply to %q", line)
		}
		var m map[string]any
		if err := json.Unmarshal(replies.Bytes(), &m); err != nil {
			t.Fatalf("reply %q: %v", replies.Text(), err)
		}
		return m
	}
	errCode := func(m map[string]any) float64 {
		e, _ := m["error"].(map[string]any)
		c, _ := e["code"].(float64)
		return c
	}
	send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	io.WriteString(inW, `{"jsonrpc":"2.0","method":"notifications/initialized"}`+"\n")
	for _, tc := range []struct {
		line string
		code float64
	}{
		{`{"jsonrpc":"2.0","id":2,"method":`, -32700},
		{`"just a string"`, -32600},
		{`[{"jsonrpc":"2.0","id":3,"method":"ping"}]`, -32600},
		{`{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"nope__x","arguments":{}}}`, CodeUnknownTool},
	} {
		if m := send(tc.line); errCode(m) != tc.code {
			t.Fatalf("%s: reply %v, want code %v", tc.line, m, tc.code)
		}
	}
	// The session survived the bad lines.
	m := send(`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"t__echo","arguments":{"text":"still here"}}}`)
	if r, _ := m["result"].(map[string]any); r == nil {
		t.Fatalf("echo after bad input: %v", m)
	}
	inW.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("ServeStdio did not return at EOF")
	}
}

// A shared child's elicitation cannot be tied to a call: it reaches an agent
// only while a single session has calls in flight, never a guessed one; with
// several, the child is answered -32070, which says what to do instead.
func TestSharedUpstreamNeverMisroutes(t *testing.T) {
	h := newHarness(t, hconf{shared: true})
	var aAsked atomic.Int32
	a := h.connect("", &mcp.ClientOptions{ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		aAsked.Add(1)
		return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"name": "from-a"}}, nil
	}})
	b := h.connect("", &mcp.ClientOptions{ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"name": "from-b"}}, nil
	}})
	// Alone, b's elicitation reaches b.
	if res, err := call(t, b, "t__elicit", nil); err != nil || firstText(res) != "elicited: accept from-b" {
		t.Fatalf("single session: %v %v", firstText(res), err)
	}
	// With a's call in flight on the same child, b's elicitation is refused.
	done := make(chan error, 1)
	go func() { _, err := call(t, a, "t__sleep", map[string]any{"text": "2s"}); done <- err }()
	eventually(t, 10*time.Second, func() string {
		st := h.g.ups["t"]
		st.mu.Lock()
		lv := st.shared
		st.mu.Unlock()
		if lv == nil {
			return "no shared connection"
		}
		if lv.rl.InFlight() == 0 {
			return "a's call is not in flight yet"
		}
		return ""
	})
	res, err := call(t, b, "t__elicit", nil)
	if err == nil && !res.IsError {
		t.Fatalf("elicitation routed with two sessions in flight: %v", firstText(res))
	}
	// Refused with its own code, saying what to do (the upstream is
	// healthy: not -32062 "upstream unavailable").
	if wireCode(err) != CodeNotRoutable || !strings.Contains(err.Error(), "use lifecycle: per-session or an HTTP upstream") {
		t.Errorf("refusal: code %d, %v", wireCode(err), err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if aAsked.Load() != 0 {
		t.Fatal("session a was asked to answer b's elicitation")
	}
}

func TestUpstreamThatNeverAnswers(t *testing.T) {
	h := newHarness(t, hconf{mode: "mute", connTimeout: 500 * time.Millisecond, grace: 200 * time.Millisecond})
	cs := h.connect("", nil)
	start := time.Now()
	_, err := call(t, cs, "t__echo", nil)
	if wireCode(err) != CodeUpstreamUnavailable || !strings.Contains(err.Error(), "did not complete the MCP handshake") {
		t.Fatalf("got %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("the call waited %s", d)
	}
	// The mute children (start-up probe and this call) are stopped.
	eventually(t, 10*time.Second, func() string {
		started, exited := 0, 0
		for _, s := range kinds(h.records(), "spawn") {
			switch s.Body["outcome"] {
			case "started":
				started++
			case "exited":
				exited++
			}
		}
		if started == 0 || exited != started {
			return fmt.Sprintf("%d started, %d exited", started, exited)
		}
		return ""
	})
}

// An HTTP upstream that restarts forgets the gateway's (shared) session: the call
// that finds out fails with the reason, and the next one reconnects.
func TestHTTPUpstreamRestart(t *testing.T) {
	serve := func(ln net.Listener) *http.Server {
		s := mcp.NewServer(&mcp.Implementation{Name: "http-up", Version: "1"}, nil)
		s.AddTool(&mcp.Tool{Name: "echo", InputSchema: json.RawMessage(`{"type":"object"}`)}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "pong"}}}, nil
		})
		hs := &http.Server{Handler: mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)}
		go hs.Serve(ln)
		return hs
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	first := serve(ln)

	w, _ := openTestLog(t)
	up, err := upstream.NewHTTP(upstream.HTTPOptions{Name: "web", URL: "http://" + addr + "/"})
	if err != nil {
		t.Fatal(err)
	}
	g, err := New(Options{Log: w, Upstreams: []UpstreamOptions{{Upstream: up, Namespaced: true, Shared: true, Transport: "http", Class: up.Class()}}})
	if err != nil {
		t.Fatal(err)
	}
	cs := startAndConnect(t, g)
	if res, err := call(t, cs, "web__echo", nil); err != nil || firstText(res) != "pong" {
		t.Fatalf("before restart: %v %v", firstText(res), err)
	}
	first.Close()
	ln2, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen on %s again: %v", addr, err)
	}
	second := serve(ln2)
	defer second.Close()
	var last error
	for range 2 {
		res, err := call(t, cs, "web__echo", nil)
		if err == nil && firstText(res) == "pong" {
			return
		}
		last = err
	}
	t.Fatalf("the gateway did not reconnect to the restarted upstream: %v", last)
}

// startAndConnect starts g, serves its HTTP front on 127.0.0.1 and
// connects an agent; the test's cleanup undoes all three.
func startAndConnect(t *testing.T, g *Gateway) *mcp.ClientSession {
	t.Helper()
	g.Start(context.Background())
	t.Cleanup(func() { g.Shutdown(context.Background()) })
	front := httptest.NewServer(g.HTTPHandler(HTTPOptions{}))
	t.Cleanup(front.Close)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "a", Version: "1"}, nil).Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: front.URL, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// openTestLog opens an audit log in a fresh directory (returned) with a
// throwaway key; the test's cleanup closes it.
func openTestLog(t *testing.T) (*auditlog.Writer, string) {
	t.Helper()
	dir := t.TempDir()
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	w, err := auditlog.Open(dir, auditlog.Options{Key: key, Gateway: record.GatewayInfo{Version: "test", Platform: "software"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w, dir
}

// TestSANOnlyClientCertificatesRefused: the subject DN is the identity, so
// verified client certificates with an empty subject (SAN-only, as SPIFFE
// and service meshes issue them) are refused 401 with the reason, and the
// operator is told which certificate it was; before, every one of them
// was the identity "cert:", and mallory's certificate used alice's session.
func TestSANOnlyClientCertificatesRefused(t *testing.T) {
	h := newHarness(t, hconf{})
	_, serverCert, _, _ := certs(t)
	ca := newClientCA(t)
	srv := httptest.NewUnstartedServer(h.g.HTTPHandler(HTTPOptions{ClientCerts: true}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{serverCert}, ClientCAs: ca.pool, ClientAuth: tls.VerifyClientCertIfGiven}
	srv.StartTLS()
	defer srv.Close()
	post := func(c tls.Certificate, sid, body string) (*http.Response, string) {
		t.Helper()
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{c}}}}
		req, _ := http.NewRequest("POST", srv.URL, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if sid != "" {
			req.Header.Set("Mcp-Session-Id", sid)
			req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	const initReq = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"a","version":"1"}}}`
	named := ca.leaf(t, pkix.Name{CommonName: "alice"}, "spiffe://example.org/agent/alice")
	resp, _ := post(named, "", initReq)
	sid := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || sid == "" {
		t.Fatalf("a certificate with a subject: %s, session %q", resp.Status, sid)
	}
	for _, tc := range []struct {
		name    string
		subject pkix.Name
	}{
		{"no subject", pkix.Name{}},
		{"empty CN", pkix.Name{CommonName: ""}},
		{"only empty values", pkix.Name{ExtraNames: []pkix.AttributeTypeAndValue{{Type: []int{2, 5, 4, 3}, Value: ""}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, who := range []string{"alice", "mallory"} {
				c := ca.leaf(t, tc.subject, "spiffe://example.org/agent/"+who)
				for _, try := range []struct{ sid, body string }{
					{"", initReq},
					{sid, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"t__echo","arguments":{"text":"from ` + who + `"}}}`},
				} {
					resp, body := post(c, try.sid, try.body)
					if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(body, "subject is empty") || !strings.Contains(body, "SAN-only") {
						t.Fatalf("%s's SAN-only certificate (session %q): %s %s, want 401 saying the subject is empty", who, try.sid, resp.Status, body)
					}
				}
			}
		})
	}
	if calls := kinds(h.records(), "call"); len(calls) != 0 {
		t.Fatalf("a SAN-only certificate made a call: %v", calls)
	}
	if logs := h.logs.String(); !strings.Contains(logs, "refused a verified client certificate") || !strings.Contains(logs, "spiffe://example.org/agent/alice") {
		t.Fatalf("the refusal is not logged with the certificate's names:\n%s", clip(logs, 2000))
	}
}

type clientCA struct {
	pool *x509.CertPool
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// newClientCA makes a CA that issues client certificates with any subject
// and URI SANs.
func newClientCA(t *testing.T) *clientCA {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "client CA"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	p := x509.NewCertPool()
	p.AddCert(c)
	return &clientCA{pool: p, cert: c, key: k}
}

func (ca *clientCA) leaf(t *testing.T, subject pkix.Name, uris ...string) tls.Certificate {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: subject, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	for _, s := range uris {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, u)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &k.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: k}
}
