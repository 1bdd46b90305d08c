package upstream

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// answerServer is a hand-written Streamable HTTP upstream: it answers
// initialize and tools/list, and each other request with answer.
func answerServer(t *testing.T, answer func(w http.ResponseWriter, id json.RawMessage, method string)) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(answerHandler(answer))
	t.Cleanup(srv.Close)
	return srv
}

func answerHandler(answer func(w http.ResponseWriter, id json.RawMessage, method string)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.WriteHeader(http.StatusMethodNotAllowed)
			return
		}
		b, _ := io.ReadAll(r.Body)
		var m struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		json.Unmarshal(b, &m)
		switch {
		case m.Method == "initialize":
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Mcp-Session-Id", "s1")
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":%q,"capabilities":{"tools":{},"resources":{}},"serverInfo":{"name":"x","version":"1"}}}`, m.ID, ProtocolVersion)
		case m.Method == "tools/list":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"tools":[{"name":"echo","inputSchema":{"type":"object"}}]}}`, m.ID)
		case len(m.ID) == 0 || m.Method == "":
			w.WriteHeader(http.StatusAccepted) // a notification or a response
		default:
			answer(w, m.ID, m.Method)
		}
	})
}

// writeHuge writes a JSON-RPC response to id whose result holds mib MiB of
// text, and stops as soon as the client stops reading.
func writeHuge(w http.ResponseWriter, id json.RawMessage, mib int) {
	fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"contents":[{"uri":"a","text":"`, id)
	chunk := []byte(strings.Repeat("a", 1<<20))
	for range mib {
		if _, err := w.Write(chunk); err != nil {
			return
		}
	}
	io.WriteString(w, `"}]}}`)
}

// peakHeap samples the heap in use every few milliseconds until the
// returned function is called, which gives the peak above the heap in use
// at the start.
func peakHeap() (stop func() uint64) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapInuse
	var peak atomic.Uint64
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak.Load() {
				peak.Store(ms.HeapInuse)
			}
			select {
			case <-done:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	return func() uint64 {
		close(done)
		<-exited
		if p := peak.Load(); p > base {
			return p - base
		}
		return 0
	}
}

// TestHTTPAnswerOverTheLimit: an HTTP upstream's answer that is not an
// event stream is read up to the 16 MiB limit for one message and no
// further, on go-sdk's session (initialize, lists, resources/read,
// prompts/get, completion: go-sdk reads the body whole), for a refusal's
// body and on a raw call alike; the request fails naming the upstream and
// the limit, and the gateway's heap does not hold the answer.
func TestHTTPAnswerOverTheLimit(t *testing.T) {
	const huge = 512 // MiB
	for _, tc := range []struct {
		name   string
		answer func(w http.ResponseWriter, id json.RawMessage)
		call   func(ctx context.Context, conn *Conn) error
		want   string
		heap   uint64 // the most the call may add to the heap
	}{
		{
			name: "resources/read on the session",
			answer: func(w http.ResponseWriter, id json.RawMessage) {
				w.Header().Set("Content-Type", "application/json")
				writeHuge(w, id, huge)
			},
			call: func(ctx context.Context, conn *Conn) error {
				_, err := conn.Session.ReadResource(ctx, &mcp.ReadResourceParams{URI: "a"})
				return err
			},
			want: `upstream "big": its answer exceeded the limit of 16 MiB`,
			heap: 100 << 20,
		},
		{
			name: "a refusal's body on the session",
			answer: func(w http.ResponseWriter, id json.RawMessage) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusBadRequest)
				writeHuge(w, id, huge)
			},
			call: func(ctx context.Context, conn *Conn) error {
				_, err := conn.Session.ReadResource(ctx, &mcp.ReadResourceParams{URI: "a"})
				return err
			},
			want: "Bad Request",
			heap: 16 << 20, // a refusal's body is read for its JSON-RPC error only
		},
		{
			name: "raw call",
			answer: func(w http.ResponseWriter, id json.RawMessage) {
				w.Header().Set("Content-Type", "application/json")
				writeHuge(w, id, huge)
			},
			call: func(ctx context.Context, conn *Conn) error {
				_, err := conn.RawCall(ctx, "tools/call", callParams("echo", "{}"))
				return err
			},
			want: `upstream "big": its answer exceeded the limit of 16 MiB`,
			heap: 100 << 20,
		},
		{
			name: "a refusal's body on a raw call",
			answer: func(w http.ResponseWriter, id json.RawMessage) {
				w.Header().Set("Content-Type", "text/event-stream") // not a stream when refused
				w.WriteHeader(http.StatusBadRequest)
				writeHuge(w, id, huge)
			},
			call: func(ctx context.Context, conn *Conn) error {
				_, err := conn.RawCall(ctx, "tools/call", callParams("echo", "{}"))
				return err
			},
			want: `upstream "big": tools/call: the upstream answered HTTP 400 Bad Request`,
			heap: 16 << 20,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := answerServer(t, func(w http.ResponseWriter, id json.RawMessage, _ string) { tc.answer(w, id) })
			up, err := NewHTTP(HTTPOptions{Name: "big", URL: srv.URL})
			if err != nil {
				t.Fatal(err)
			}
			conn := connectRaw(t, up, ConnectOptions{})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			stop := peakHeap()
			start := time.Now()
			err = tc.call(ctx, conn)
			peak := stop()
			t.Logf("err = %v after %v, peak heap +%d MiB", err, time.Since(start), peak>>20)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one saying %q", err, tc.want)
			}
			if peak > tc.heap {
				t.Fatalf("a %d MiB answer took %d MiB of heap (want at most %d MiB)", huge, peak>>20, tc.heap>>20)
			}
			// Not the upstream's answer: the gateway takes the connection
			// for broken (session.upstreamError) and the next use reconnects.
			var we *jsonrpc.Error
			if errors.As(err, &we) {
				t.Fatalf("err = %#v, a JSON-RPC error as if the upstream had answered with it", err)
			}
		})
	}
}

// TestHTTPEventStreamNotCutByTheAnswerLimit: the limit is per message on an
// event stream, not for the stream in all: a call whose stream carries
// 1 MiB notifications, one MiB more in all than the limit (17 MiB), before
// its response succeeds, on go-sdk's session and on a raw call.
func TestHTTPEventStreamNotCutByTheAnswerLimit(t *testing.T) {
	srv := answerServer(t, func(w http.ResponseWriter, id json.RawMessage, _ string) {
		w.Header().Set("Content-Type", "text/event-stream")
		note := strings.Repeat("n", 1<<20)
		for range maxFrame>>20 + 1 {
			fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"level\":\"info\",\"data\":%q}}\n\n", note)
		}
		fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"done\"}]}}\n\n", id)
	})
	conn := connectRaw(t, plainUpstream(t, srv.URL), ConnectOptions{})
	// A bound, not a delay: 17 MiB through go-sdk under -race on a loaded
	// machine took more than rawCallCtx's 20 s.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := conn.Session.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{}}); err != nil {
		t.Fatalf("session: %v", err)
	}
	res, err := conn.RawCall(ctx, "tools/call", callParams("echo", "{}"))
	if err != nil || !strings.Contains(string(res), "done") {
		t.Fatalf("raw call: %s, %v", res, err)
	}
}

// TestHTTPRecordedKeyIsAnAcceptedOne: the key a tls-pinned connection is
// recorded with (Conn.Ref, the audit log's "connected" endpoint) and
// ObservedKey are keys the pin accepted, never one it refused in another
// handshake meanwhile, and an error that is not a pin mismatch is not
// reported as one because another handshake was refused.
func TestHTTPRecordedKeyIsAnAcceptedOne(t *testing.T) {
	good, bad := newTestCert(t), newTestCert(t)
	ks := newKeySwitchServer(t, good, bad) // once switched, a machine in the middle answers new connections
	srv := ks.srv
	up, err := NewHTTP(HTTPOptions{Name: "pinned", URL: srv.URL, TLSPin: SPKIDigest(good.leaf).String()})
	if err != nil {
		t.Fatal(err)
	}
	hold := func(n int) (release func() []error) { return ks.hold(t, up, n) }
	if errs := hold(4)(); len(errs) > 0 { // four good connections in the pool
		t.Fatal(errs)
	}
	ks.switched.Store(true)
	release := hold(4) // the four, busy
	_, err = up.HTTPClient().Get(srv.URL + "/hold")
	var pm *PinMismatchError
	if !errors.As(err, &pm) || !pm.Got.Equal(SPKIDigest(bad.leaf)) {
		t.Fatalf("a new connection: err = %v, want the pin refusing the other key", err)
	}
	release()
	if k := up.ObservedKey(); !k.Equal(SPKIDigest(good.leaf)) {
		t.Fatalf("ObservedKey = %s after a refused handshake, want the accepted %s", k, SPKIDigest(good.leaf))
	}
	if err := up.explain("tools/call", io.ErrUnexpectedEOF); errors.As(err, &pm) {
		t.Fatalf("an unexpected EOF after another handshake was refused is reported as %v", err)
	}

	conn := connectRaw(t, up, ConnectOptions{}) // over the pooled, accepted connections
	if _, err := conn.RawCall(rawCallCtx(t), "tools/call", callParams("echo", "{}")); err != nil {
		t.Fatal(err)
	}
	if want := up.URL() + " key " + SPKIDigest(good.leaf).String(); conn.Ref != want {
		t.Fatalf("Conn.Ref = %q, want %q: the key of the handshakes this session's requests went over", conn.Ref, want)
	}
}

// TestHTTPRecordedKeyIsThisSessionsKey: without a pin (tls-ca), a session
// is recorded with the key of the connection its initialize went over, not
// with the key the last handshake of any connection to the upstream saw
// (a server whose key was rotated, or one of two behind a balancer).
func TestHTTPRecordedKeyIsThisSessionsKey(t *testing.T) {
	older, newer := newTestCert(t), newTestCert(t)
	ks := newKeySwitchServer(t, older, newer) // once switched, new connections get the newer key
	srv := ks.srv
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, append(append([]byte{}, older.pem...), newer.pem...), 0o600); err != nil {
		t.Fatal(err)
	}
	up, err := NewHTTP(HTTPOptions{Name: "ca", URL: srv.URL, CAFile: ca})
	if err != nil {
		t.Fatal(err)
	}
	hold := func(n int) (release func()) {
		r := ks.hold(t, up, n)
		return func() {
			if errs := r(); len(errs) > 0 {
				t.Fatal(errs)
			}
		}
	}
	hold(4)() // four connections with the older key, idle
	ks.switched.Store(true)
	release := hold(4)                                // the four, busy
	resp, err := up.HTTPClient().Get(srv.URL + "/ok") // a new connection, with the newer key
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	release() // idle again after the new one
	if k := up.ObservedKey(); !k.Equal(SPKIDigest(newer.leaf)) {
		t.Fatalf("ObservedKey = %s, want the last handshake's key %s", k, SPKIDigest(newer.leaf))
	}
	// The pool gives the most recently used connection first: one with
	// the older key.
	conn := connectRaw(t, up, ConnectOptions{})
	if want := up.URL() + " key " + SPKIDigest(older.leaf).String(); conn.Ref != want {
		t.Fatalf("Conn.Ref = %q, want %q: the key of the connection that carried this session's initialize", conn.Ref, want)
	}
}

// TestHTTPRecordedKeyIsTheInitializesKey: a session is recorded with the
// key of the handshake that carried its initialize, not with the key of a
// later answer of its own (initialized, the event stream) that came over
// another connection with another key the CA also vouches for.
func TestHTTPRecordedKeyIsTheInitializesKey(t *testing.T) {
	first, later := newTestCert(t), newTestCert(t)
	u := newRawHTTPUpstream(t, false)
	u.srv.Close()
	srv := httptest.NewUnstartedServer(u.srv.Config.Handler)
	srv.Config.SetKeepAlivesEnabled(false) // every request a new handshake
	var handshakes atomic.Int64
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{first.tls}, GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
		if handshakes.Add(1) > 1 {
			return &tls.Config{Certificates: []tls.Certificate{later.tls}}, nil
		}
		return nil, nil
	}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, append(append([]byte{}, first.pem...), later.pem...), 0o600); err != nil {
		t.Fatal(err)
	}
	up, err := NewHTTP(HTTPOptions{Name: "ca", URL: srv.URL, CAFile: ca})
	if err != nil {
		t.Fatal(err)
	}
	conn := connectRaw(t, up, ConnectOptions{})
	if handshakes.Load() < 2 {
		t.Fatalf("%d handshakes: the session's later requests did not go over new connections", handshakes.Load())
	}
	if want := up.URL() + " key " + SPKIDigest(first.leaf).String(); conn.Ref != want {
		t.Fatalf("Conn.Ref = %q, want %q: the key of the handshake that carried initialize", conn.Ref, want)
	}
}

// floodRequests is how many roots/list requests the flooding upstreams
// send during one tools/call.
const floodRequests = 2000

// floodTestServer is a stdio server that answers tools/call by sending
// floodRequests roots/list requests at once, then, once every one is
// answered, the call's result: "answered N refused M" (M refused with
// CodeTooManyServerRequests).
func floodTestServer() {
	in := bufio.NewReader(os.Stdin)
	out := bufio.NewWriter(os.Stdout)
	var call json.RawMessage
	answered, refused := 0, 0
	for {
		line, err := in.ReadBytes('\n')
		if err != nil {
			os.Exit(0)
		}
		var m struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Error  *struct {
				Code int `json:"code"`
			} `json:"error"`
		}
		json.Unmarshal(line, &m)
		switch {
		case m.Method == "initialize":
			fmt.Fprintf(out, `{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":%q,"capabilities":{"tools":{}},"serverInfo":{"name":"flood","version":"1"}}}`+"\n", m.ID, ProtocolVersion)
		case m.Method == "tools/list":
			fmt.Fprintf(out, `{"jsonrpc":"2.0","id":%s,"result":{"tools":[{"name":"flood","inputSchema":{"type":"object"}}]}}`+"\n", m.ID)
		case m.Method == "tools/call":
			call = m.ID
			for i := range floodRequests {
				fmt.Fprintf(out, `{"jsonrpc":"2.0","id":"roots-%d","method":"roots/list"}`+"\n", i)
			}
		case m.Method == "" && strings.HasPrefix(string(m.ID), `"roots-`):
			if m.Error != nil && m.Error.Code == CodeTooManyServerRequests {
				refused++
			} else {
				answered++
			}
			if answered+refused == floodRequests {
				fmt.Fprintf(out, `{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"answered %d refused %d"}]}}`+"\n", call, answered, refused)
			}
		}
		out.Flush()
	}
}

// slowAgent stands for an agent that takes hold to answer each request an
// upstream sends it; it counts the requests it is answering at once.
type slowAgent struct {
	hold                  time.Duration
	inflight, peak, total atomic.Int64
	goroutines            atomic.Int64 // the most there were while it answered
}

func (a *slowAgent) answer(ctx context.Context) {
	v := a.inflight.Add(1)
	defer a.inflight.Add(-1)
	a.total.Add(1)
	for p := a.peak.Load(); v > p && !a.peak.CompareAndSwap(p, v); p = a.peak.Load() {
	}
	for g, p := int64(runtime.NumGoroutine()), a.goroutines.Load(); g > p && !a.goroutines.CompareAndSwap(p, g); p = a.goroutines.Load() {
	}
	select {
	case <-ctx.Done():
	case <-time.After(a.hold):
	}
}

// TestServerRequestsBounded: an upstream that sends thousands of requests
// (here roots/list) during one call has at most maxServerRequests of them
// waiting for the agent at once; the others are answered at once with
// CodeTooManyServerRequests, never waiting for the agent, and the call
// goes on to its result. On an HTTP upstream's call stream (raw call) no
// goroutine is started for them; from a stdio child (through its MCP
// client session) go-sdk dispatches each request on a goroutine of its
// own, which the bound ends at once: they come and go as the child writes
// and do not pile up (unbounded, all 2000 would wait out the agent's hold
// together), but a loaded machine sees a few hundred at a time.
func TestServerRequestsBounded(t *testing.T) {
	const hold = 300 * time.Millisecond
	check := func(t *testing.T, a *slowAgent, base int, res json.RawMessage, err error, maxGoroutines int64) {
		t.Helper()
		t.Logf("result %s, err %v; %d requests reached the agent, at most %d at once; at most %d goroutines more", res, err, a.total.Load(), a.peak.Load(), a.goroutines.Load()-int64(base))
		if err != nil {
			t.Fatalf("the call failed: %v", err)
		}
		var answered, refused int
		var r struct {
			Content []struct{ Text string } `json:"content"`
		}
		if json.Unmarshal(res, &r) != nil || len(r.Content) != 1 {
			t.Fatalf("result %s", res)
		}
		fmt.Sscanf(r.Content[0].Text, "answered %d refused %d", &answered, &refused)
		if a.peak.Load() > maxServerRequests {
			t.Fatalf("%d of the upstream's requests waited for the agent at once, want at most %d", a.peak.Load(), maxServerRequests)
		}
		if refused == 0 || answered+refused != floodRequests || int64(answered) != a.total.Load() {
			t.Fatalf("the upstream had %d answers and %d refusals of its %d requests, the agent %d", answered, refused, floodRequests, a.total.Load())
		}
		if g := a.goroutines.Load() - int64(base); g > maxGoroutines {
			t.Fatalf("%d goroutines more while %d requests came at once", g, floodRequests)
		}
	}

	t.Run("http call stream", func(t *testing.T) {
		var answers, refusals atomic.Int64
		done := make(chan struct{})
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			var m struct {
				ID     json.RawMessage `json:"id"`
				Method string          `json:"method"`
				Error  *struct {
					Code int `json:"code"`
				} `json:"error"`
			}
			json.Unmarshal(b, &m)
			switch {
			case m.Method == "initialize":
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("Mcp-Session-Id", "s1")
				fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":%q,"capabilities":{"tools":{}},"serverInfo":{"name":"flood","version":"1"}}}`, m.ID, ProtocolVersion)
			case m.Method == "tools/call":
				w.Header().Set("Content-Type", "text/event-stream")
				for i := range floodRequests {
					fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"id\":%d,\"method\":\"roots/list\"}\n\n", i)
				}
				w.(http.Flusher).Flush()
				select {
				case <-done:
				case <-r.Context().Done():
					return
				}
				fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"answered %d refused %d\"}]}}\n\n", m.ID, answers.Load(), refusals.Load())
			case m.Method == "" && len(m.ID) > 0:
				if m.Error != nil && m.Error.Code == CodeTooManyServerRequests {
					refusals.Add(1)
				} else {
					answers.Add(1)
				}
				if answers.Load()+refusals.Load() == floodRequests {
					close(done)
				}
				w.WriteHeader(http.StatusAccepted)
			case r.Method == http.MethodGet:
				w.WriteHeader(http.StatusMethodNotAllowed)
			default:
				w.WriteHeader(http.StatusAccepted)
			}
		}))
		t.Cleanup(srv.Close)
		a := &slowAgent{hold: hold}
		conn := connectRaw(t, plainUpstream(t, srv.URL), ConnectOptions{ServerRequest: func(ctx context.Context, _ *jsonrpc.Request) (json.RawMessage, error) {
			a.answer(ctx)
			return json.RawMessage(`{"roots":[]}`), nil
		}})
		base := runtime.NumGoroutine()
		res, err := conn.RawCall(rawCallCtx(t), "tools/call", callParams("flood", "{}"))
		check(t, a, base, res, err, 200)
	})

	t.Run("stdio child", func(t *testing.T) {
		exe, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		a := &slowAgent{hold: hold}
		client := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil)
		client.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler { // as the gateway forwards them
			return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
				if method == "roots/list" {
					a.answer(ctx)
				}
				return next(ctx, method, req)
			}
		})
		up := &Stdio{Spec: StdioSpec{Name: "flood", Command: exe, AllowUnmeasured: true, Env: map[string]string{rawChildEnv: "flood"}, StopGrace: time.Second}, Share: "per-session"}
		conn, err := up.Connect(rawCallCtx(t), client, ConnectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		base := runtime.NumGoroutine()
		res, err := conn.RawCall(rawCallCtx(t), "tools/call", callParams("flood", "{}"))
		check(t, a, base, res, err, floodRequests/2)
	})
}

// TestHTTPReloadCredentials: ReloadCredentials reads the credential files
// again and the next request, on the open connection, carries what they
// hold now; an unchanged file reports no change, one that holds no
// credential changes nothing, and an upstream whose credentials come from
// the environment has nothing to re-read.
func TestHTTPReloadCredentials(t *testing.T) {
	var mu sync.Mutex
	var got []string
	inner := answerHandler(func(w http.ResponseWriter, id json.RawMessage, _ string) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{}}`, id)
	})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Get("Authorization")+" "+r.Header.Get("X-Api-Key"))
		mu.Unlock()
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	tokFile, keyFile := filepath.Join(dir, "token"), filepath.Join(dir, "key")
	write := func(path, v string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(tokFile, "one\n")
	write(keyFile, "k1")
	up, err := NewHTTP(HTTPOptions{Name: "files", URL: srv.URL, BearerTokenFile: tokFile, HeadersFromFile: map[string]string{"X-Api-Key": keyFile}})
	if err != nil {
		t.Fatal(err)
	}
	conn := connectRaw(t, up, ConnectOptions{})
	last := func() string {
		t.Helper()
		if _, err := conn.RawCall(rawCallCtx(t), "tools/call", callParams("echo", "{}")); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		return got[len(got)-1]
	}
	if g := last(); g != "Bearer one k1" {
		t.Fatalf("before: %q", g)
	}
	if changed, err := up.ReloadCredentials(); changed || err != nil {
		t.Fatalf("unchanged files: changed %v, err %v", changed, err)
	}
	write(tokFile, "two\n")
	write(keyFile, "k2")
	if changed, err := up.ReloadCredentials(); !changed || err != nil {
		t.Fatalf("rotated files: changed %v, err %v", changed, err)
	}
	if g := last(); g != "Bearer two k2" {
		t.Fatalf("after the reload: %q, want the rotated credentials", g)
	}
	write(keyFile, "")
	if changed, err := up.ReloadCredentials(); changed || err == nil || !strings.Contains(err.Error(), `upstream "files"`) || !strings.Contains(err.Error(), "is empty") {
		t.Fatalf("an empty file: changed %v, err %v", changed, err)
	}
	if g := last(); g != "Bearer two k2" {
		t.Fatalf("after a failed reload: %q, want the credentials in force", g)
	}
	if up.CredentialsFromEnvironment() {
		t.Error("credentials from files reported as from the environment")
	}

	env, err := NewHTTP(HTTPOptions{Name: "env", URL: srv.URL, BearerTokenEnv: "T", LookupEnv: func(string) (string, bool) { return "t", true }})
	if err != nil {
		t.Fatal(err)
	}
	if changed, err := env.ReloadCredentials(); changed || err != nil || !env.CredentialsFromEnvironment() {
		t.Fatalf("environment: changed %v, err %v, from the environment %v", changed, err, env.CredentialsFromEnvironment())
	}
}

// keySwitchServer is the raw test upstream behind a TLS server that
// answers new connections with its first certificate, or with its second
// once switched; its /hold requests wait until released.
type keySwitchServer struct {
	srv      *httptest.Server
	switched atomic.Bool
	inside   atomic.Int64
	gate     chan struct{}
}

func newKeySwitchServer(t *testing.T, first, second testCert) *keySwitchServer {
	t.Helper()
	u := newRawHTTPUpstream(t, false)
	u.srv.Close()
	inner := u.srv.Config.Handler
	k := &keySwitchServer{gate: make(chan struct{})}
	k.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			k.inside.Add(1)
			<-k.gate
			return
		}
		inner.ServeHTTP(w, r)
	}))
	k.srv.TLS = &tls.Config{Certificates: []tls.Certificate{first.tls}, GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
		if k.switched.Load() {
			return &tls.Config{Certificates: []tls.Certificate{second.tls}}, nil
		}
		return nil, nil
	}}
	k.srv.StartTLS()
	t.Cleanup(k.srv.Close) // after the connections' close (cleanups run last first)
	return k
}

// hold makes n requests through up's client that wait on the server until
// release, which returns their errors: n connections busy, then idle in
// the pool.
func (k *keySwitchServer) hold(t *testing.T, up *HTTPUpstream, n int) (release func() []error) {
	t.Helper()
	k.inside.Store(0)
	k.gate = make(chan struct{})
	errs := make(chan error, n)
	for range n {
		go func() {
			resp, err := up.HTTPClient().Get(k.srv.URL + "/hold")
			if err == nil {
				resp.Body.Close()
			}
			errs <- err
		}()
	}
	for deadline := time.Now().Add(10 * time.Second); k.inside.Load() < int64(n); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d requests reached the server", k.inside.Load(), n)
		}
	}
	return func() []error {
		close(k.gate)
		var out []error
		for range n {
			if err := <-errs; err != nil {
				out = append(out, err)
			}
		}
		return out
	}
}
