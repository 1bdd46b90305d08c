package gateway

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/gwtest"
	"github.com/confidential-mcp/cmcp/internal/oauth"
	"github.com/confidential-mcp/cmcp/internal/policy"
	"github.com/confidential-mcp/cmcp/internal/spawnaudit"
	"github.com/confidential-mcp/cmcp/internal/upstream"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		runChild(mode)
		return
	}
	cleanup := gwtest.BuildChild()
	code := m.Run()
	cleanup()
	os.Exit(code)
}

type hconf struct {
	mode        string
	name        string
	pin         *digest.Digest // nil: the right pin
	unmeasured  bool
	shared      bool
	flat        bool
	toolPins    map[string]digest.Digest
	driftWarn   bool
	tokens      []Token
	callTimeout time.Duration
	grace       time.Duration
	env         map[string]string
	environ     []string
	decider     Decider
	noStart     bool
	policy      *policy.Engine
	recipients  []string // age recipients: commitments can be opened, payloads kept in the vault
	idle        time.Duration
	bodyTimeout time.Duration // HTTPOptions.BodyTimeout
	stall       time.Duration // HTTPOptions.WriteStallTimeout
	// sndbuf, if set, is the send buffer of every connection the HTTP
	// front accepts (SO_SNDBUF, which ends the kernel's autotuning).
	sndbuf      int
	durability  string
	connTimeout time.Duration
	measure     string // measure target (file or directory) and its pin
	measurePin  digest.Digest
	listRecheck time.Duration
	// http serves the test upstream (newChildServer) over Streamable HTTP
	// on 127.0.0.1 instead of spawning it.
	http bool
	// upstreamBodies, with http, gets every request body the upstream
	// receives, one a line.
	upstreamBodies *lockedWriter
	// metrics, if set, is the gateway's Options.Metrics.
	metrics Metrics
	// tokenSet, if set, is the HTTP front's HTTPOptions.TokenSet.
	tokenSet *TokenSet
	// maxSessions and maxPerAgent are the HTTP front's session bounds
	// (0: the defaults).
	maxSessions, maxPerAgent int
	// warmSpares is the upstream's UpstreamOptions.WarmSpares; command,
	// if set, is the file spawned instead of the test binary (a copy of
	// it, which a test may replace).
	warmSpares int
	command    string
	// oauth, if set, makes the HTTP front's OAuth verifier for the
	// resource (the endpoint's URL) and serves its metadata.
	oauth func(resource string) *oauth.Verifier
}

type harness struct {
	t    testing.TB
	dir  string
	w    *auditlog.Writer
	g    *Gateway
	srv  *httptest.Server
	url  string
	exe  string
	logs *lockedWriter
	key  ed25519.PrivateKey
}

func newHarness(t testing.TB, c hconf) *harness {
	t.Helper()
	if c.mode == "" {
		c.mode = "server"
	}
	if c.name == "" {
		c.name = "t"
	}
	exe, d := selfDigest(t)
	pin := d
	if c.pin != nil {
		pin = *c.pin
	}
	dir := t.TempDir()
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	aopts := auditlog.Options{Key: key, Durability: record.DurabilityGroup, Gateway: record.GatewayInfo{Version: "test", Platform: "software"}}
	if c.policy != nil {
		aopts.PolicyDigest, aopts.PolicyMode = c.policy.Bundle().Digest(), string(c.policy.Mode())
	}
	if c.recipients != nil {
		aopts.Recipients, aopts.Vault = c.recipients, true
	}
	if c.durability != "" {
		aopts.Durability = c.durability
	}
	w, err := auditlog.Open(dir, aopts)
	if err != nil {
		t.Fatal(err)
	}
	logs := &lockedWriter{}
	logger := slog.New(slog.NewTextHandler(logs, nil))
	env := map[string]string{childEnv: c.mode}
	for k, v := range c.env {
		env[k] = v
	}
	command := exe
	if c.command != "" {
		command = c.command
	}
	spec := upstream.StdioSpec{Name: c.name, Command: command, Pin: pin, AllowUnmeasured: c.unmeasured, Env: env, StopGrace: c.grace, MeasurePath: c.measure, MeasurePin: c.measurePin}
	share := "per-session"
	if c.shared {
		share = "shared"
	}
	environ := c.environ
	if environ == nil {
		environ = os.Environ()
	}
	uo := UpstreamOptions{Upstream: &upstream.Stdio{Spec: spec, Environ: environ, Hooks: spawnaudit.Hooks(w, logger, nil), Share: share},
		Namespaced: !c.flat, Shared: c.shared, ToolPins: c.toolPins, DriftWarn: c.driftWarn, Class: upstream.ClassSpawnMeasured, WarmSpares: c.warmSpares}
	if c.http {
		cs := newChildServer(c.mode)
		var hh http.Handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return cs }, nil)
		if bodies := c.upstreamBodies; bodies != nil {
			next := hh
			hh = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				bodies.Write(append(b, '\n'))
				r.Body = io.NopCloser(bytes.NewReader(b))
				next.ServeHTTP(w, r)
			})
		}
		up := httptest.NewServer(hh)
		t.Cleanup(up.Close)
		hu, err := upstream.NewHTTP(upstream.HTTPOptions{Name: c.name, URL: up.URL})
		if err != nil {
			t.Fatal(err)
		}
		uo.Upstream, uo.Transport, uo.Class = hu, "http", hu.Class()
	}
	g, err := New(Options{Version: "test", Log: w, Logger: logger, CallTimeout: c.callTimeout, ConnectTimeout: c.connTimeout, Decider: c.decider, Policy: c.policy, ListRecheck: c.listRecheck,
		Metrics: c.metrics, Upstreams: []UpstreamOptions{uo}})
	if err != nil {
		t.Fatal(err)
	}
	if !c.noStart {
		if err := g.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	mux := http.NewServeMux()
	srv := httptest.NewUnstartedServer(mux)
	var ov *oauth.Verifier
	if c.oauth != nil {
		// The resource is the endpoint as agents reach it, so the
		// verifier is made once the address is known.
		ov = c.oauth("http://" + srv.Listener.Addr().String() + "/mcp")
		for _, p := range ov.MetadataPaths() {
			mux.Handle(p, ov.MetadataHandler())
		}
	}
	mux.Handle("/mcp", g.HTTPHandler(HTTPOptions{Tokens: c.tokens, TokenSet: c.tokenSet, OAuth: ov, MaxRequestBytes: 1 << 20, SessionTimeout: c.idle, BodyTimeout: c.bodyTimeout, WriteStallTimeout: c.stall,
		MaxSessions: c.maxSessions, MaxSessionsPerAgent: c.maxPerAgent}))
	srv.Listener = LowWatermarkListener(srv.Listener) // as Serve's
	if c.sndbuf > 0 {
		srv.Listener = sndbufListener{srv.Listener, c.sndbuf}
	}
	srv.Start()
	h := &harness{t: t, dir: dir, w: w, g: g, srv: srv, url: srv.URL + "/mcp", exe: exe, logs: logs, key: key}
	t.Cleanup(func() {
		srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		g.Shutdown(ctx)
		w.Close()
		if t.Failed() {
			t.Logf("gateway log:\n%s", clip(logs.String(), 4000))
		}
	})
	return h
}

// sndbufListener sets the send buffer of every connection it accepts.
type sndbufListener struct {
	net.Listener
	size int
}

func (l sndbufListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetWriteBuffer(l.size)
	}
	return c, err
}

// connect opens an agent session with a go-sdk client.
func (h *harness) connect(token string, opts *mcp.ClientOptions) *mcp.ClientSession {
	h.t.Helper()
	cs, err := h.tryConnect(token, opts)
	if err != nil {
		h.t.Fatalf("connect: %v", err)
	}
	h.t.Cleanup(func() { cs.Close() })
	return cs
}

func (h *harness) tryConnect(token string, opts *mcp.ClientOptions) (*mcp.ClientSession, error) {
	return h.tryConnectClient(token, mcp.NewClient(&mcp.Implementation{Name: "test-agent", Version: "1"}, opts))
}

func (h *harness) tryConnectClient(token string, c *mcp.Client) (*mcp.ClientSession, error) {
	hc := gwtest.AgentClient(token)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: h.url, HTTPClient: hc, MaxRetries: -1}, nil)
}

// fronts are the agent-facing front ends tests run through.
var fronts = []string{"http", "stdio"}

// connectVia connects an agent through the given front end: Streamable
// HTTP, or a `serve --stdio` session over pipes (the session ends when the
// test does).
func (h *harness) connectVia(front string, opts *mcp.ClientOptions) *mcp.ClientSession {
	h.t.Helper()
	return h.connectClientVia(front, mcp.NewClient(&mcp.Implementation{Name: "test-agent", Version: "1"}, opts))
}

// connectClientVia is connectVia with the agent's client c (whose roots a
// test can change, say).
func (h *harness) connectClientVia(front string, c *mcp.Client) *mcp.ClientSession {
	h.t.Helper()
	if front == "http" {
		cs, err := h.tryConnectClient("", c)
		if err != nil {
			h.t.Fatalf("connect: %v", err)
		}
		h.t.Cleanup(func() { cs.Close() })
		return cs
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- h.g.ServeStdio(context.Background(), inR, outW, "local-user") }()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cs, err := c.Connect(ctx, &mcp.IOTransport{Reader: outR, Writer: inW}, nil)
	if err != nil {
		h.t.Fatalf("connect over stdio: %v", err)
	}
	h.t.Cleanup(func() {
		cs.Close()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			h.t.Error("ServeStdio did not return after the agent disconnected")
		}
	})
	return cs
}

// records reads every record the gateway wrote so far.
func (h *harness) records() []rec {
	h.t.Helper()
	h.g.results.Wait() // result records are appended after the response
	return readRecords(h.t, h.dir)
}

// rawSender opens an initialised session with h over front ("http" or
// "stdio") without an SDK client and returns a function that sends one
// JSON-RPC request line and returns its response.
func rawSender(t *testing.T, h *harness, front string) func(line string) string {
	t.Helper()
	const initReq = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`
	const initialized = `{"jsonrpc":"2.0","method":"notifications/initialized"}`
	if front == "stdio" {
		inR, inW := io.Pipe()
		outR, outW := io.Pipe()
		go h.g.ServeStdio(context.Background(), inR, outW, "local")
		t.Cleanup(func() { inW.Close() })
		replies := bufio.NewScanner(outR)
		replies.Buffer(make([]byte, 1<<20), 1<<20)
		send := func(line string) string {
			t.Helper()
			if _, err := io.WriteString(inW, line+"\n"); err != nil {
				t.Fatal(err)
			}
			if !replies.Scan() {
				t.Fatalf("no reply to %q", line)
			}
			return replies.Text()
		}
		send(initReq)
		io.WriteString(inW, initialized+"\n")
		return send
	}
	var session string
	post := func(line string) string {
		t.Helper()
		resp, b := rawPostResp(t, h.url, session, []byte(line))
		if session == "" {
			session = resp.Header.Get("Mcp-Session-Id")
		}
		if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			// The response is the stream's event with an id.
			for _, l := range strings.Split(string(b), "\n") {
				if d, ok := strings.CutPrefix(l, "data: "); ok && strings.Contains(d, `"id":`) {
					return d
				}
			}
		}
		return string(b)
	}
	post(initReq)
	post(initialized)
	return post
}
