package gateway

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/spawnaudit"
	"github.com/confidential-mcp/cmcp/internal/upstream"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

//lint:file-ignore SA1019 go-sdk deprecates MCP logging, sampling and roots (SEP-2577) with no replacement; the gateway still relays them while clients use them

// resUp is one upstream of newResGateway: a "res" child on stdio, or with
// http newResServer over Streamable HTTP on 127.0.0.1.
type resUp struct {
	name    string
	http    bool
	shared  bool
	without string // capabilities the upstream lacks: "complete", "subscribe"
}

// resGateway is a gateway over several resUp upstreams (namespaced).
type resGateway struct {
	*harness
	seen string
	// https are the HTTP upstreams' servers, to take down and bring back.
	https map[string]*resHTTP
}

// resHTTP serves an HTTP upstream; down closes its listener and
// connections, up listens on the same address again with a new server (the
// old MCP sessions are unknown to it).
type resHTTP struct {
	t    *testing.T
	srv  *httptest.Server
	h    atomic.Pointer[http.Handler]
	mk   func() http.Handler
	addr string
}

func (r *resHTTP) down() {
	r.srv.Listener.Close()
	r.srv.CloseClientConnections()
}

func (r *resHTTP) up() {
	r.t.Helper()
	h := r.mk()
	r.h.Store(&h)
	ln, err := net.Listen("tcp", r.addr)
	if err != nil {
		r.t.Fatal(err)
	}
	hs := &http.Server{Handler: r.srv.Config.Handler}
	go hs.Serve(ln)
	r.t.Cleanup(func() { hs.Close() })
}

func newResGateway(t *testing.T, ups ...resUp) *resGateway {
	t.Helper()
	exe, pin := selfDigest(t)
	dir := t.TempDir()
	seen := filepath.Join(dir, "seen")
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	w, err := auditlog.Open(filepath.Join(dir, "audit"), auditlog.Options{Key: key, Durability: record.DurabilityGroup, Gateway: record.GatewayInfo{Version: "test"}})
	if err != nil {
		t.Fatal(err)
	}
	logs := &lockedWriter{}
	logger := slog.New(slog.NewTextHandler(logs, nil))
	rg := &resGateway{seen: seen, https: map[string]*resHTTP{}}
	var uos []UpstreamOptions
	for _, u := range ups {
		uo := UpstreamOptions{Namespaced: true, Shared: u.shared}
		if u.http {
			rh := &resHTTP{t: t, mk: func() http.Handler {
				s := newResServer(u.name, seen, u.without)
				return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)
			}}
			h := rh.mk()
			rh.h.Store(&h)
			rh.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { (*rh.h.Load()).ServeHTTP(w, r) }))
			rh.addr = rh.srv.Listener.Addr().String()
			t.Cleanup(rh.srv.Close)
			rg.https[u.name] = rh
			hu, err := upstream.NewHTTP(upstream.HTTPOptions{Name: u.name, URL: rh.srv.URL})
			if err != nil {
				t.Fatal(err)
			}
			uo.Upstream, uo.Transport, uo.Class = hu, "http", hu.Class()
		} else {
			share := "per-session"
			if u.shared {
				share = "shared"
			}
			env := map[string]string{childEnv: "res", "CMCP_TEST_ID": u.name, "CMCP_TEST_SEEN": seen, "CMCP_TEST_WITHOUT": u.without}
			spec := upstream.StdioSpec{Name: u.name, Command: exe, Pin: pin, Env: env}
			uo.Upstream, uo.Class = &upstream.Stdio{Spec: spec, Environ: os.Environ(), Hooks: spawnaudit.Hooks(w, logger, nil), Share: share}, upstream.ClassSpawnMeasured
		}
		uos = append(uos, uo)
	}
	g, err := New(Options{Version: "test", Log: w, Logger: logger, Upstreams: uos})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", g.HTTPHandler(HTTPOptions{MaxRequestBytes: 1 << 20}))
	srv := httptest.NewServer(mux)
	rg.harness = &harness{t: t, dir: filepath.Join(dir, "audit"), w: w, g: g, srv: srv, url: srv.URL + "/mcp", logs: logs}
	t.Cleanup(func() {
		srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		g.Shutdown(ctx)
		w.Close()
		if t.Failed() {
			t.Logf("gateway log:\n%s", clip(logs.String(), 4000))
			b, _ := os.ReadFile(seen)
			t.Logf("the upstreams were asked:\n%s", b)
		}
	})
	return rg
}

// asked returns what upstream name was asked, as "<method> <uri>" lines.
func (rg *resGateway) asked(name string) []string {
	b, _ := os.ReadFile(rg.seen)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, name+" "); ok {
			out = append(out, rest)
		}
	}
	return out
}

// TestResourceReadRoutesToItsOwner: resources/read goes to the upstream
// that serves the URI: the one that listed it, or whose listed template
// matches it. A URI the session knows nothing of (read from a
// resource_link, a template filled in, a fresh session) is asked of every
// upstream with resources until one has it: go-sdk's "Resource not found"
// (-32602 since v1.7) from another upstream does not end the search. If
// none has it, the agent gets the gateway's -32002 quoting each answer;
// the owner's own errors reach the agent as it sent them.
func TestResourceReadRoutesToItsOwner(t *testing.T) {
	for _, front := range fronts {
		t.Run(front, func(t *testing.T) {
			rg := newResGateway(t, resUp{name: "a"}, resUp{name: "b"})
			cs := rg.connectVia(front, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			read := func(uri string) (string, error) {
				t.Helper()
				r, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
				if err != nil {
					return "", err
				}
				return r.Contents[0].Text, nil
			}
			// Nothing listed: a says "Resource not found", b has them.
			for uri, want := range map[string]string{"b://static/1": "b static", "b://tmpl/7": "b template b://tmpl/7"} {
				if got, err := read(uri); err != nil || got != want {
					t.Fatalf("read %s in a fresh session: %q, %v; want %q", uri, got, err, want)
				}
			}
			_, err := read("c://nowhere")
			if wireCode(err) != CodeResourceNotFound || !strings.Contains(err.Error(), "a: -32602 Resource not found") || !strings.Contains(err.Error(), "b: -32602 Resource not found") {
				t.Fatalf("read of a URI no upstream has: %v; want %d quoting both answers", err, CodeResourceNotFound)
			}
			// Nothing listed, b's answer is an error of its own: it is
			// quoted, not lost.
			if _, err := read("b://bad/1"); wireCode(err) != CodeResourceNotFound || !strings.Contains(err.Error(), "b: -32602 bad n") {
				t.Fatalf("read of b://bad/1 in a fresh session: %v; want %d quoting b's \"bad n\"", err, CodeResourceNotFound)
			}
			// Once the templates are listed, b's template URIs go to b
			// alone, and b's error reaches the agent as b sent it.
			if _, err := cs.ListResourceTemplates(ctx, nil); err != nil {
				t.Fatal(err)
			}
			if got, err := read("b://tmpl/8"); err != nil || got != "b template b://tmpl/8" {
				t.Fatalf("read b://tmpl/8: %q, %v", got, err)
			}
			var we *jsonrpc.Error
			if _, err := read("b://bad/2"); !errors.As(err, &we) || we.Code != jsonrpc.CodeInvalidParams || we.Message != "bad n" {
				t.Fatalf("read b://bad/2 after the templates were listed: %v; want b's -32602 \"bad n\" as sent", err)
			}
			for _, l := range rg.asked("a") {
				if strings.HasSuffix(l, "b://tmpl/8") || strings.HasSuffix(l, "b://bad/2") {
					t.Fatalf("upstream a was asked %q, a URI of b's listed template", l)
				}
			}
		})
	}
}

// TestResourceRequestsGoToTheOwner: completion/complete for a resource
// template, resources/subscribe and unsubscribe go to the upstream that
// serves the template or URI, and only if it offers them (else -32602
// saying so: go-sdk rewrites the message of any -32601). While the session
// does not know which upstream that is, the gateway refuses (-32602, saying
// how it can learn) instead of picking the first upstream with resources.
func TestResourceRequestsGoToTheOwner(t *testing.T) {
	for _, front := range fronts {
		t.Run(front, func(t *testing.T) {
			rg := newResGateway(t, resUp{name: "a"}, resUp{name: "b"}, resUp{name: "c", without: "complete,subscribe"})
			cs := rg.connectVia(front, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			complete := func(ref *mcp.CompleteReference) ([]string, error) {
				r, err := cs.Complete(ctx, &mcp.CompleteParams{Ref: ref, Argument: mcp.CompleteParamsArgument{Name: "n", Value: "4"}})
				if err != nil {
					return nil, err
				}
				return r.Completion.Values, nil
			}
			tmpl := &mcp.CompleteReference{Type: "ref/resource", URI: "b://tmpl/{n}"}

			// Nothing learned yet.
			if v, err := complete(tmpl); wireCode(err) != jsonrpc.CodeInvalidParams || !strings.Contains(err.Error(), "resources/templates/list") {
				t.Fatalf("complete b://tmpl/{n} before the templates were listed: %v, %v; want -32602 saying to list them", v, err)
			}
			if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "b://static/1"}); wireCode(err) != jsonrpc.CodeInvalidParams {
				t.Fatalf("subscribe b://static/1 before it was listed or read: %v; want -32602", err)
			}
			for _, name := range []string{"a", "b", "c"} {
				if asked := rg.asked(name); len(asked) != 0 {
					t.Fatalf("upstream %s was asked %q although the gateway did not know whose the URI is", name, asked)
				}
			}
			// A read teaches the gateway whose a URI is.
			if _, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "b://static/1"}); err != nil {
				t.Fatal(err)
			}
			if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "b://static/1"}); err != nil {
				t.Fatalf("subscribe b://static/1 after reading it: %v", err)
			}
			// Listing the templates teaches it whose a template is.
			if _, err := cs.ListResourceTemplates(ctx, nil); err != nil {
				t.Fatal(err)
			}
			if v, err := complete(tmpl); err != nil || len(v) != 1 || v[0] != "b:4" {
				t.Fatalf("complete b://tmpl/{n}: %v, %v; want b's [b:4]", v, err)
			}
			if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "b://tmpl/5"}); err != nil {
				t.Fatal(err)
			}
			if err := cs.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: "b://tmpl/5"}); err != nil {
				t.Fatal(err)
			}
			// c serves c://tmpl/{n} and its prompt but offers neither
			// completion nor subscriptions.
			_, errTmpl := complete(&mcp.CompleteReference{Type: "ref/resource", URI: "c://tmpl/{n}"})
			_, errPrompt := complete(&mcp.CompleteReference{Type: "ref/prompt", Name: "c__hello"})
			for what, err := range map[string]error{
				"complete c://tmpl/{n}": errTmpl,
				"complete c__hello":     errPrompt,
				"subscribe c://tmpl/1":  cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "c://tmpl/1"}),
			} {
				if wireCode(err) != jsonrpc.CodeInvalidParams || !strings.Contains(err.Error(), `upstream "c"`) || !strings.Contains(err.Error(), "does not support it") {
					t.Fatalf("%s: %v; want -32602 saying upstream \"c\" does not support it", what, err)
				}
			}
			want := []string{"resources/read b://static/1", "resources/subscribe b://static/1", "completion/complete b://tmpl/{n}", "resources/subscribe b://tmpl/5", "resources/unsubscribe b://tmpl/5"}
			if got := rg.asked("b"); !slices.Equal(got, want) {
				t.Fatalf("upstream b was asked %q, want %q", got, want)
			}
			if got := rg.asked("a"); !slices.Equal(got, []string{"resources/read b://static/1"}) {
				t.Fatalf("upstream a was asked %q, want only the read that found b://static/1 was not a's", got)
			}
			if got := rg.asked("c"); len(got) != 0 {
				t.Fatalf("upstream c was asked %q", got)
			}
		})
	}
}

// TestUpstreamTransportFailureIsAGatewayFault: an HTTP upstream that goes
// away is reported on every request go-sdk carries (resources, prompts,
// completion, subscriptions, lists) as the gateway's -32067 naming the
// upstream, never as go-sdk's own -32005 "rejected by transport", and the
// connection is dropped: while the upstream is down the next request says
// it cannot be reached (-32062), and once it is back the next request
// reconnects and works. The upstream's own JSON-RPC errors still reach the
// agent as it sent them.
func TestUpstreamTransportFailureIsAGatewayFault(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var subs atomic.Int32
	requests := []struct {
		name string
		do   func(cs *mcp.ClientSession) error
	}{
		{"resources/read", func(cs *mcp.ClientSession) error {
			_, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "b://static/1"})
			return err
		}},
		{"resources/list", func(cs *mcp.ClientSession) error { _, err := cs.ListResources(ctx, nil); return err }},
		{"resources/templates/list", func(cs *mcp.ClientSession) error { _, err := cs.ListResourceTemplates(ctx, nil); return err }},
		{"prompts/list", func(cs *mcp.ClientSession) error { _, err := cs.ListPrompts(ctx, nil); return err }},
		{"prompts/get", func(cs *mcp.ClientSession) error {
			_, err := cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: "b__hello"})
			return err
		}},
		{"completion/complete", func(cs *mcp.ClientSession) error {
			_, err := cs.Complete(ctx, &mcp.CompleteParams{Ref: &mcp.CompleteReference{Type: "ref/prompt", Name: "b__hello"}, Argument: mcp.CompleteParamsArgument{Name: "x", Value: "1"}})
			return err
		}},
		{"resources/subscribe", func(cs *mcp.ClientSession) error {
			// A URI of its own each time: on a shared connection a
			// session's second subscription to a URI stays in the gateway.
			return cs.Subscribe(ctx, &mcp.SubscribeParams{URI: fmt.Sprintf("b://tmpl/%d", subs.Add(1))})
		}},
	}
	for _, shared := range []bool{false, true} {
		for _, rq := range requests {
			t.Run(fmt.Sprintf("%s/shared=%v", rq.name, shared), func(t *testing.T) {
				rg := newResGateway(t, resUp{name: "a"}, resUp{name: "b", http: true, shared: shared})
				cs := rg.connect("", nil)
				// b's connection is up; b://static/1 and b://tmpl/{n} are b's.
				if _, err := cs.ListResources(ctx, nil); err != nil {
					t.Fatal(err)
				}
				if _, err := cs.ListResourceTemplates(ctx, nil); err != nil {
					t.Fatal(err)
				}
				if err := rq.do(cs); err != nil {
					t.Fatalf("with b up: %v", err)
				}
				rg.https["b"].down()
				err := rq.do(cs)
				if wireCode(err) != CodeUpstreamFailed || !strings.Contains(err.Error(), `upstream "b"`) {
					t.Fatalf("with b gone: %v (code %d); want %d naming upstream \"b\"", err, wireCode(err), CodeUpstreamFailed)
				}
				err = rq.do(cs)
				if wireCode(err) != CodeUpstreamUnavailable || !strings.Contains(err.Error(), `upstream "b"`) {
					t.Fatalf("again with b gone: %v (code %d); want %d naming upstream \"b\": the broken connection was not dropped", err, wireCode(err), CodeUpstreamUnavailable)
				}
				rg.https["b"].up()
				if err := rq.do(cs); err != nil {
					t.Fatalf("with b back: %v", err)
				}
			})
		}
	}
	t.Run("upstream errors pass through", func(t *testing.T) {
		rg := newResGateway(t, resUp{name: "b", http: true})
		cs := rg.connect("", nil)
		_, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "b://bad/1"})
		var we *jsonrpc.Error
		if !errors.As(err, &we) || we.Code != jsonrpc.CodeInvalidParams || we.Message != "bad n" {
			t.Fatalf("b's own error: %v, want -32602 \"bad n\" as b sent it", err)
		}
	})
}

// TestUpstreamAnswerIsOnlyWhatTheUpstreamSent: of the errors go-sdk's
// client returns (wrapped as it wraps them, mcp/transport.go and
// mcp/streamable.go), only a JSON-RPC error response from the upstream is
// passed on as the upstream's answer; its transport's ErrRejected is not.
func TestUpstreamAnswerIsOnlyWhatTheUpstreamSent(t *testing.T) {
	rejected := &jsonrpc.Error{Code: -32005, Message: "rejected by transport"} // go-sdk's jsonrpc2.ErrRejected
	answer := &jsonrpc.Error{Code: 4242, Message: "custom upstream error"}
	for _, tc := range []struct {
		name string
		err  error
		want *jsonrpc.Error
	}{
		{"an error response", fmt.Errorf("calling %q: %w", "resources/read", answer), answer},
		{"an error response in a non-2xx HTTP body", fmt.Errorf("calling %q: %w", "resources/read", fmt.Errorf("%s: %w: %w: %v", "POST", answer, rejected, "Bad Request")), answer},
		{"a request that failed", fmt.Errorf("calling %q: %w", "resources/read", fmt.Errorf("sending %q: %w", "resources/read", fmt.Errorf("%w: %v", rejected, "dial tcp: connection refused"))), nil},
		{"a transient HTTP status", fmt.Errorf("calling %q: %w", "resources/read", fmt.Errorf("%w: %s: %v", rejected, "POST", "Service Unavailable")), nil},
		{"a closed connection", fmt.Errorf("%w: calling %q: %v", mcp.ErrConnectionClosed, "resources/read", "client is closing"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := upstreamAnswer(tc.err); got != tc.want {
				t.Fatalf("upstreamAnswer(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

// TestRootsListChangedReachesUpstreams: the agent's
// notifications/roots/list_changed reaches the session's upstream
// connections, on stdio and over HTTP, and the roots they ask for next are
// the new ones. A shared upstream, whose connection declares no roots
// capability (it is not one agent's), is not sent it.
func TestRootsListChangedReachesUpstreams(t *testing.T) {
	for _, front := range fronts {
		t.Run(front, func(t *testing.T) {
			rg := newResGateway(t, resUp{name: "a"}, resUp{name: "b", http: true}, resUp{name: "c", shared: true})
			agent := mcp.NewClient(&mcp.Implementation{Name: "test-agent", Version: "1"}, nil)
			agent.AddRoots(&mcp.Root{URI: "file:///one"})
			cs := rg.connectClientVia(front, agent)
			if _, err := cs.ListResources(context.Background(), nil); err != nil { // every upstream's connection is up
				t.Fatal(err)
			}
			roots := func(up string) string {
				t.Helper()
				r, err := call(t, cs, up+"__roots", nil)
				if err != nil {
					t.Fatal(err)
				}
				return firstText(r)
			}
			for _, up := range []string{"a", "b"} {
				if got := roots(up); got != "file:///one" {
					t.Fatalf("upstream %s sees the roots %q, want file:///one", up, got)
				}
			}
			agent.AddRoots(&mcp.Root{URI: "file:///two"})
			eventually(t, 10*time.Second, func() string {
				for _, up := range []string{"a", "b"} {
					if !slices.Contains(rg.asked(up), "notifications/roots/list_changed") {
						return fmt.Sprintf("upstream %s was not sent notifications/roots/list_changed", up)
					}
				}
				return ""
			})
			for _, up := range []string{"a", "b"} {
				if got := roots(up); got != "file:///one,file:///two" {
					t.Fatalf("upstream %s sees the roots %q after they changed, want file:///one,file:///two", up, got)
				}
			}
			if slices.Contains(rg.asked("c"), "notifications/roots/list_changed") {
				t.Fatal("the shared upstream c, which declared no roots capability, was sent notifications/roots/list_changed")
			}
		})
	}
}
