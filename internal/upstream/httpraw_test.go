package upstream

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// rawHTTPUpstream is a real go-sdk Streamable HTTP server behind a recorder
// that keeps every POST body it received and every response body it sent.
type rawHTTPUpstream struct {
	srv       *httptest.Server
	cancelled atomic.Int64 // block calls whose context ended

	mu      sync.Mutex
	posts   []string        // request bodies
	sent    []string        // response bodies of tools/call POSTs
	remotes map[string]bool // client addresses of tools/call POSTs: one per connection
}

// lastSent is the body of the last tools/call response, once its handler
// has recorded it: the client has the response before the handler returns.
func (u *rawHTTPUpstream) lastSent(t *testing.T) string {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		u.mu.Lock()
		n := len(u.sent)
		var last string
		if n > 0 {
			last = u.sent[n-1]
		}
		u.mu.Unlock()
		if n > 0 {
			return last
		}
		if time.Now().After(deadline) {
			t.Fatal("the upstream's handler never recorded the response it sent")
		}
	}
}

func (u *rawHTTPUpstream) received() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.posts...)
}

func newRawHTTPUpstream(t *testing.T, jsonResponse bool) *rawHTTPUpstream {
	t.Helper()
	u := &rawHTTPUpstream{}
	s := mcp.NewServer(&mcp.Implementation{Name: "raw-http-test", Version: "1"}, nil)
	obj := json.RawMessage(`{"type":"object"}`)
	text := func(s string) *mcp.CallToolResult {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
	}
	s.AddTool(&mcp.Tool{Name: "echo", InputSchema: obj}, func(_ context.Context, r *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return text(string(r.Params.Arguments)), nil
	})
	s.AddTool(&mcp.Tool{Name: "progress", InputSchema: obj}, func(ctx context.Context, r *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		for i := 1; i <= 3; i++ {
			if err := r.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: r.Params.GetProgressToken(), Progress: float64(i), Total: 3}); err != nil {
				return nil, err
			}
		}
		return text("done"), nil
	})
	s.AddTool(&mcp.Tool{Name: "ask", InputSchema: obj}, func(ctx context.Context, r *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		res, err := r.Session.Elicit(ctx, &mcp.ElicitParams{Message: "your name?",
			RequestedSchema: json.RawMessage(`{"type":"object","properties":{"name":{"type":"string"}}}`)})
		if err != nil {
			return nil, err
		}
		return text(fmt.Sprintf("%s %v", res.Action, res.Content["name"])), nil
	})
	s.AddTool(&mcp.Tool{Name: "block", InputSchema: obj}, func(ctx context.Context, _ *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		<-ctx.Done()
		u.cancelled.Add(1)
		return nil, ctx.Err()
	})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s },
		&mcp.StreamableHTTPOptions{SessionTimeout: time.Minute, JSONResponse: jsonResponse})
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			h.ServeHTTP(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		u.mu.Lock()
		u.posts = append(u.posts, string(body))
		u.mu.Unlock()
		if !bytes.Contains(body, []byte(`"tools/call"`)) {
			h.ServeHTTP(w, r)
			return
		}
		u.mu.Lock()
		if u.remotes == nil {
			u.remotes = map[string]bool{}
		}
		u.remotes[r.RemoteAddr] = true
		u.mu.Unlock()
		rec := &teeWriter{ResponseWriter: w}
		h.ServeHTTP(rec, r)
		u.mu.Lock()
		u.sent = append(u.sent, rec.buf.String())
		u.mu.Unlock()
	}))
	t.Cleanup(u.srv.Close)
	return u
}

type teeWriter struct {
	http.ResponseWriter
	buf bytes.Buffer
}

func (w *teeWriter) Write(b []byte) (int, error) {
	w.buf.Write(b)
	return w.ResponseWriter.Write(b)
}

func (w *teeWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *teeWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// connectRaw connects to url with opts; the client declares elicitation
// but fails the test if a request reaches its own handler.
func connectRaw(t *testing.T, up *HTTPUpstream, opts ConnectOptions) *Conn {
	t.Helper()
	client := mcp.NewClient(&mcp.Implementation{Name: "cmcp-test", Version: "1"}, &mcp.ClientOptions{
		ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			t.Error("the elicitation reached the client session, not ServerRequest")
			return nil, errors.New("unexpected")
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := up.Connect(ctx, client, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if !conn.CanRawCall() {
		t.Fatal("an HTTP connection must support raw calls")
	}
	return conn
}

func plainUpstream(t *testing.T, url string) *HTTPUpstream {
	t.Helper()
	up, err := NewHTTP(HTTPOptions{Name: "raw-http", URL: url})
	if err != nil {
		t.Fatal(err)
	}
	return up
}

func rawCallCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// wireResult is the "result" member of the response to id, exactly as it
// was on the wire, found in a response body (JSON or SSE).
func wireResult(t *testing.T, body, id string) string {
	t.Helper()
	for _, line := range strings.Split(body, "\n") {
		line = strings.TrimPrefix(strings.TrimSpace(line), "data: ")
		if !strings.Contains(line, `"id":"`+id+`"`) || !strings.Contains(line, `"result":`) {
			continue
		}
		_, rest, _ := strings.Cut(line, `"result":`)
		// The result object ends where the message does.
		return strings.TrimSuffix(rest, "}")
	}
	t.Fatalf("no response to %s in %q", id, body)
	return ""
}

func TestHTTPRawCallExactBytes(t *testing.T) {
	for _, tc := range []struct {
		name string
		json bool
	}{{"sse", false}, {"json", true}} {
		t.Run(tc.name, func(t *testing.T) {
			u := newRawHTTPUpstream(t, tc.json)
			conn := connectRaw(t, plainUpstream(t, u.srv.URL), ConnectOptions{})
			args := `{"text":"héllo \u003c\u003e","n":[1, 2.50]}`
			res, err := conn.RawCall(rawCallCtx(t), "tools/call", callParams("echo", args))
			if err != nil {
				t.Fatal(err)
			}
			sent := u.lastSent(t)
			if want := wireResult(t, sent, "cmcp-1"); string(res) != want {
				t.Fatalf("result bytes\n got %s\nwant %s (as sent)", res, want)
			}
			var r mcp.CallToolResult
			if err := json.Unmarshal(res, &r); err != nil {
				t.Fatal(err)
			}
			if got := r.Content[0].(*mcp.TextContent).Text; got != args {
				t.Fatalf("the upstream received arguments %s, want %s", got, args)
			}
			posts := u.received()
			if last := posts[len(posts)-1]; !strings.Contains(last, `"id":"cmcp-1"`) {
				t.Fatalf("the call was sent as %s, want a cmcp- string id", last)
			}
		})
	}
}

func TestHTTPRawCallProgressInOrder(t *testing.T) {
	u := newRawHTTPUpstream(t, false)
	var mu sync.Mutex
	var seen []float64
	conn := connectRaw(t, plainUpstream(t, u.srv.URL), ConnectOptions{Intercept: func(msg jsonrpc.Message) bool {
		req, ok := msg.(*jsonrpc.Request)
		if !ok || req.Method != "notifications/progress" {
			return false
		}
		var p mcp.ProgressNotificationParams
		if err := json.Unmarshal(req.Params, &p); err != nil || p.ProgressToken != "tok-7" {
			t.Errorf("progress %s: %v", req.Params, err)
		}
		mu.Lock()
		seen = append(seen, p.Progress)
		mu.Unlock()
		return true
	}})
	res, err := conn.RawCall(rawCallCtx(t), "tools/call", json.RawMessage(`{"_meta":{"progressToken":"tok-7"},"name":"progress","arguments":{}}`))
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	got := fmt.Sprint(seen)
	mu.Unlock()
	if got != "[1 2 3]" {
		t.Fatalf("progress seen before the response: %s, want [1 2 3] (result %s)", got, res)
	}
}

func TestHTTPRawCallElicitation(t *testing.T) {
	u := newRawHTTPUpstream(t, false)
	var asked atomic.Value
	conn := connectRaw(t, plainUpstream(t, u.srv.URL), ConnectOptions{
		ServerRequest: func(ctx context.Context, req *jsonrpc.Request) (json.RawMessage, error) {
			var p mcp.ElicitParams
			if err := json.Unmarshal(req.Params, &p); err != nil {
				return nil, err
			}
			asked.Store(req.Method + ": " + p.Message)
			return json.RawMessage(`{"action":"accept","content":{"name":"ann"}}`), nil
		},
	})
	res, err := conn.RawCall(rawCallCtx(t), "tools/call", callParams("ask", "{}"))
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := asked.Load().(string); got != "elicitation/create: your name?" {
		t.Fatalf("ServerRequest saw %q", got)
	}
	if !strings.Contains(string(res), `"text":"accept ann"`) {
		t.Fatalf("result %s, want the answer to reach the tool", res)
	}
}

func TestHTTPRawCallCancel(t *testing.T) {
	u := newRawHTTPUpstream(t, false)
	conn := connectRaw(t, plainUpstream(t, u.srv.URL), ConnectOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := conn.RawCall(ctx, "tools/call", callParams("block", "{}"))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the context's deadline", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for u.cancelled.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the upstream's handler was never cancelled")
		}
		time.Sleep(10 * time.Millisecond)
	}
	var found bool
	for _, p := range u.received() {
		found = found || strings.Contains(p, `"notifications/cancelled"`) && strings.Contains(p, `"requestId":"cmcp-1"`)
	}
	if !found {
		t.Fatalf("no notifications/cancelled for cmcp-1 among %q", u.received())
	}
}

func TestHTTPRawCallErrors(t *testing.T) {
	u := newRawHTTPUpstream(t, false)
	conn := connectRaw(t, plainUpstream(t, u.srv.URL), ConnectOptions{})
	ctx := rawCallCtx(t)

	t.Run("jsonrpc error passes through", func(t *testing.T) {
		_, err := conn.RawCall(ctx, "tools/call", callParams("no-such-tool", "{}"))
		var we *jsonrpc.Error
		if !errors.As(err, &we) || !strings.Contains(we.Message, "no-such-tool") {
			t.Fatalf("err = %#v, want the upstream's JSON-RPC error", err)
		}
	})
	t.Run("session gone", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodDelete, u.srv.URL, nil)
		req.Header.Set("Mcp-Session-Id", conn.Session.ID())
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		_, err = conn.RawCall(ctx, "tools/call", callParams("echo", "{}"))
		var we *jsonrpc.Error
		if !errors.Is(err, mcp.ErrSessionMissing) || errors.As(err, &we) || !strings.Contains(err.Error(), `upstream "raw-http"`) {
			t.Fatalf("err = %v, want a session-missing error naming the upstream", err)
		}
	})
}

func TestHTTPRawCallStatusWithoutJSONRPC(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "upstream overloaded", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	c := &httpRaw{up: plainUpstream(t, srv.URL), session: "s1", version: ProtocolVersion}
	_, err := c.call(rawCallCtx(t), "tools/call", callParams("echo", "{}"))
	if err == nil || !strings.Contains(err.Error(), `upstream "raw-http"`) || !strings.Contains(err.Error(), "503") {
		t.Fatalf("err = %v, want one naming the upstream and the status", err)
	}
}

// A server whose key changes after the session started is refused on the
// raw call's new connection, with the typed pin error.
func TestHTTPRawCallPinMismatch(t *testing.T) {
	good, bad := newTestCert(t), newTestCert(t)
	var useBad atomic.Bool
	u := newRawHTTPUpstream(t, false)
	u.srv.Close()
	srv := httptest.NewUnstartedServer(u.srv.Config.Handler)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{good.tls}, GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
		if useBad.Load() {
			return &tls.Config{Certificates: []tls.Certificate{bad.tls}}, nil
		}
		return nil, nil
	}}
	srv.StartTLS()
	defer srv.Close()
	up, err := NewHTTP(HTTPOptions{Name: "pinned", URL: srv.URL, TLSPin: SPKIDigest(good.leaf).String()})
	if err != nil {
		t.Fatal(err)
	}
	conn := connectRaw(t, up, ConnectOptions{})
	if _, err := conn.RawCall(rawCallCtx(t), "tools/call", callParams("echo", "{}")); err != nil {
		t.Fatalf("call through the right key: %v", err)
	}
	useBad.Store(true)
	srv.CloseClientConnections()
	// A pooled connection may be handed out before the client notices that
	// the server closed it (the call then fails with EOF): try again.
	var pm *PinMismatchError
	for i := 0; i < 50; i++ {
		up.HTTPClient().CloseIdleConnections()
		_, err = conn.RawCall(rawCallCtx(t), "tools/call", callParams("echo", "{}"))
		if err == nil || errors.As(err, &pm) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if pm == nil || !pm.Got.Equal(SPKIDigest(bad.leaf)) {
		t.Fatalf("err = %v, want *PinMismatchError for the new key", err)
	}
}

// TestHTTPRawCallReusesConnections: back-to-back raw calls go over kept-alive
// connections, over an SSE answer as over a JSON one, not one new TCP
// connection per call.
func TestHTTPRawCallReusesConnections(t *testing.T) {
	for _, tc := range []struct {
		name string
		json bool
	}{{"sse", false}, {"json", true}} {
		t.Run(tc.name, func(t *testing.T) {
			u := newRawHTTPUpstream(t, tc.json)
			conn := connectRaw(t, plainUpstream(t, u.srv.URL), ConnectOptions{})
			for i := range 200 {
				if _, err := conn.RawCall(rawCallCtx(t), "tools/call", callParams("echo", fmt.Sprintf(`{"i":%d}`, i))); err != nil {
					t.Fatal(err)
				}
			}
			u.mu.Lock()
			n := len(u.remotes)
			u.mu.Unlock()
			t.Logf("200 sequential calls used %d connections", n)
			if n > 10 {
				t.Fatalf("200 sequential calls used %d connections", n)
			}
		})
	}
}

// cutWriter passes a response through until its first event is complete,
// then closes the connection under it: a stream broken in the middle of
// a call, as a proxy's idle timeout would break it.
type cutWriter struct {
	http.ResponseWriter
	seen []byte
	cut  bool
}

func (w *cutWriter) Write(b []byte) (int, error) {
	if w.cut {
		return 0, errors.New("cut")
	}
	n, err := w.ResponseWriter.Write(b)
	w.seen = append(w.seen, b...)
	if bytes.Contains(w.seen, []byte("\n\n")) {
		w.cut = true
		http.NewResponseController(w.ResponseWriter).Flush()
		if conn, _, herr := http.NewResponseController(w.ResponseWriter).Hijack(); herr == nil {
			conn.Close()
		}
	}
	return n, err
}

func (w *cutWriter) Flush() {
	if !w.cut {
		http.NewResponseController(w.ResponseWriter).Flush()
	}
}

// TestHTTPRawCallResumesABrokenStream: a call's event stream that breaks
// after its first event is resumed with Last-Event-ID, and the call gets
// its result and the progress in between; a server that does not number
// its events cannot be resumed and the call fails saying so.
func TestHTTPRawCallResumesABrokenStream(t *testing.T) {
	for _, resumable := range []bool{true, false} {
		t.Run(fmt.Sprint("resumable=", resumable), func(t *testing.T) {
			s := mcp.NewServer(&mcp.Implementation{Name: "resume-test", Version: "1"}, nil)
			s.AddTool(&mcp.Tool{Name: "slow", InputSchema: json.RawMessage(`{"type":"object"}`)}, func(ctx context.Context, r *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				for i := 1; i <= 2; i++ {
					if err := r.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: r.Params.GetProgressToken(), Progress: float64(i), Total: 2}); err != nil {
						return nil, err
					}
					time.Sleep(100 * time.Millisecond)
				}
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "finished"}}}, nil
			})
			opts := &mcp.StreamableHTTPOptions{SessionTimeout: time.Minute}
			if resumable {
				opts.EventStore = mcp.NewMemoryEventStore(nil)
			}
			h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, opts)
			var cuts, resumes atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodGet && r.Header.Get("Last-Event-ID") != "" {
					resumes.Add(1)
				}
				if r.Method == http.MethodPost {
					body, _ := io.ReadAll(r.Body)
					r.Body = io.NopCloser(bytes.NewReader(body))
					if bytes.Contains(body, []byte(`"tools/call"`)) && cuts.Add(1) == 1 {
						h.ServeHTTP(&cutWriter{ResponseWriter: w}, r)
						return
					}
				}
				h.ServeHTTP(w, r)
			}))
			t.Cleanup(srv.Close)
			var progress atomic.Int32
			conn := connectRaw(t, plainUpstream(t, srv.URL), ConnectOptions{Intercept: func(m jsonrpc.Message) bool {
				if r, ok := m.(*jsonrpc.Request); ok && r.Method == "notifications/progress" {
					progress.Add(1)
					return true
				}
				return false
			}})
			res, err := conn.RawCall(rawCallCtx(t), "tools/call", json.RawMessage(`{"_meta":{"progressToken":"p"},"name":"slow","arguments":{}}`))
			if !resumable {
				if err == nil || !strings.Contains(err.Error(), "read the response stream") {
					t.Fatalf("a stream that cannot be resumed: got %s, %v", res, err)
				}
				if resumes.Load() != 0 {
					t.Fatal("resumed a stream whose events have no ids")
				}
				return
			}
			if err != nil {
				t.Fatalf("the broken stream was not resumed: %v", err)
			}
			if !strings.Contains(string(res), "finished") || resumes.Load() == 0 || progress.Load() != 2 {
				t.Fatalf("result %s after %d resumptions, %d progress notifications (want 2)", res, resumes.Load(), progress.Load())
			}
		})
	}
}

// TestHTTPRawCallResumesAfterServerClose: a server that closes a call's
// stream on purpose (SEP-1699, with a retry field) before anything else is
// sent is reconnected to after the time it asked for, and the call gets
// its result.
func TestHTTPRawCallResumesAfterServerClose(t *testing.T) {
	const retry = 150 * time.Millisecond
	s := mcp.NewServer(&mcp.Implementation{Name: "close-test", Version: "1"}, nil)
	s.AddTool(&mcp.Tool{Name: "later", InputSchema: json.RawMessage(`{"type":"object"}`)}, func(ctx context.Context, r *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if r.Extra == nil || r.Extra.CloseSSEStream == nil {
			return nil, errors.New("the server cannot close the stream")
		}
		r.Extra.CloseSSEStream(mcp.CloseSSEStreamArgs{RetryAfter: retry})
		time.Sleep(50 * time.Millisecond)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "later"}}}, nil
	})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s },
		&mcp.StreamableHTTPOptions{SessionTimeout: time.Minute, EventStore: mcp.NewMemoryEventStore(nil)})
	var resumedAt atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.Header.Get("Last-Event-ID") != "" {
			resumedAt.CompareAndSwap(0, time.Now().UnixNano())
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	conn := connectRaw(t, plainUpstream(t, srv.URL), ConnectOptions{})
	start := time.Now()
	res, err := conn.RawCall(rawCallCtx(t), "tools/call", json.RawMessage(`{"name":"later","arguments":{}}`))
	if err != nil || !strings.Contains(string(res), `"later"`) {
		t.Fatalf("got %s, %v", res, err)
	}
	if at := resumedAt.Load(); at == 0 || time.Duration(at-start.UnixNano()) < retry {
		t.Fatalf("resumed %v after the call started, before the %v the server asked for", time.Duration(at-start.UnixNano()), retry)
	}
}

// TestHTTPRawCallResumesFromTheLastDispatchedEvent: a stream cut in the
// middle of the response event (after its id line) is resumed from the last
// event that was dispatched, not from the id of the half-read one: the
// server replays only the events after Last-Event-ID.
func TestHTTPRawCallResumesFromTheLastDispatchedEvent(t *testing.T) {
	const resp = `{"jsonrpc":"2.0","id":"cmcp-1","result":{"content":[{"type":"text","text":"big"}]}}`
	var mu sync.Mutex
	var lastIDs []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		switch r.Method {
		case http.MethodPost:
			// event 1 complete, event 2 (the response) cut mid-data.
			fmt.Fprintf(w, "id: 1\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":\"p\",\"progress\":1}}\n\n")
			fmt.Fprintf(w, "id: 2\ndata: %s", resp[:30])
		case http.MethodGet:
			mu.Lock()
			lastIDs = append(lastIDs, r.Header.Get("Last-Event-ID"))
			mu.Unlock()
			if r.Header.Get("Last-Event-ID") == "1" {
				fmt.Fprintf(w, "id: 2\ndata: %s\n\n", resp)
			}
			// after "2": nothing more to replay
		}
	}))
	defer srv.Close()
	c := &httpRaw{up: plainUpstream(t, srv.URL), session: "s1", version: ProtocolVersion}
	res, err := c.call(rawCallCtx(t), "tools/call", callParams("echo", "{}"))
	mu.Lock()
	defer mu.Unlock()
	if err != nil || !strings.Contains(string(res), "big") {
		t.Fatalf("got %s, %v; resumed with Last-Event-ID %q (want \"1\": event 2 was never dispatched)", res, err, lastIDs)
	}
}

// TestHTTPRawSessionGone404WithJSONRPCBody: a 404 whose body is a JSON-RPC
// error is reported as the session being gone, whatever the body's id: null
// (the TypeScript SDK) or one of the server's own (older python-sdk).
func TestHTTPRawSessionGone404WithJSONRPCBody(t *testing.T) {
	for _, reply := range []string{
		`{"jsonrpc":"2.0","error":{"code":-32001,"message":"Session not found"},"id":null}`,
		`{"jsonrpc":"2.0","id":"server-error","error":{"code":-32600,"message":"Not Found: Session has been terminated"}}`,
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, reply)
		}))
		c := &httpRaw{up: plainUpstream(t, srv.URL), session: "s1", version: ProtocolVersion}
		_, err := c.call(rawCallCtx(t), "tools/call", callParams("echo", "{}"))
		srv.Close()
		var we *jsonrpc.Error
		if !errors.Is(err, mcp.ErrSessionMissing) || errors.As(err, &we) {
			t.Fatalf("%s: err = %v, want ErrSessionMissing and not a *jsonrpc.Error (the gateway keeps the connection for those)", reply, err)
		}
	}
}
