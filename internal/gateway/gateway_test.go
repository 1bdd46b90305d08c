package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/gwtest"
	"github.com/confidential-mcp/cmcp/internal/upstream"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

//lint:file-ignore SA1019 go-sdk deprecates MCP logging, sampling and roots (SEP-2577) with no replacement; the gateway still relays them while clients use them

func TestCallThroughGateway(t *testing.T) {
	h := newHarness(t, hconf{})
	cs := h.connect("", nil)
	ctx := context.Background()

	if got := cs.InitializeResult().Instructions; got != "Use echo to test." {
		t.Fatalf("upstream instructions not passed on: %q", got)
	}
	lt, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range lt.Tools {
		names = append(names, tl.Name)
	}
	for _, want := range []string{"t__echo", "t__fail", "t__hang"} {
		if !slices.Contains(names, want) {
			t.Fatalf("tools/list = %v, missing %s", names, want)
		}
	}

	res, err := call(t, cs, "t__echo", map[string]any{"text": "hi"})
	if err != nil {
		t.Fatal(err)
	}
	if got := firstText(res); got != "echo: hi" {
		t.Fatalf("echo = %q", got)
	}
	if sc, _ := json.Marshal(res.StructuredContent); string(sc) != `{"echoed":"hi"}` {
		t.Fatalf("structuredContent = %s", sc)
	}
	if res.Meta["child"] != "meta" {
		t.Fatalf("_meta not forwarded: %v", res.Meta)
	}

	res, err = call(t, cs, "t__fail", nil)
	if err != nil || !res.IsError || firstText(res) != "it failed as asked" {
		t.Fatalf("fail: res=%+v err=%v", res, err)
	}

	_, err = call(t, cs, "t__rpcerr", nil)
	if wireCode(err) != 4242 || !strings.Contains(err.Error(), "custom upstream error") {
		t.Fatalf("upstream error not forwarded as sent: %v", err)
	}

	rs := h.records()
	calls, results := kinds(rs, "call"), kinds(rs, "result")
	if len(calls) != 3 || len(results) != 3 {
		t.Fatalf("want 3 call and 3 result records, got %d and %d", len(calls), len(results))
	}
	c0 := calls[0].Body
	if c0["tool"] != "t__echo" || c0["upstream"] != "t" || c0["upstream_tool"] != "echo" || c0["decision"] != "allow" ||
		c0["policy_mode"] != "none" || c0["outcome"] != "forwarded" || c0["evidence_class"] != "spawn-measured" || c0["agent"] != AnonymousIdentity {
		t.Fatalf("call record: %v", c0)
	}
	if c0["args"] == nil {
		t.Fatalf("call record lacks the argument commitment: %v", c0)
	}
	// Each result names its call record, and says how that call ended.
	// Results are matched to calls by the call they name, not by their
	// place in the log: a result record is appended once the answer is
	// on its way (in a goroutine of its own), so a call's result may
	// follow the next call's.
	outcomeOf := map[any]any{}
	for _, r := range results {
		if _, twice := outcomeOf[r.Body["call"]]; twice {
			t.Fatalf("two result records name call %v: %v", r.Body["call"], results)
		}
		outcomeOf[r.Body["call"]] = r.Body["outcome"]
	}
	var outcomes []any
	for i, c := range calls {
		o, ok := outcomeOf[c.Seq]
		if !ok {
			t.Fatalf("no result record names call %d (record %v): %v", i, c.Seq, results)
		}
		outcomes = append(outcomes, o)
	}
	if !slices.Equal(outcomes, []any{"ok", "is_error", "upstream_error"}) {
		t.Fatalf("result outcomes of the calls in order = %v", outcomes)
	}
	spawns := kinds(rs, "spawn")
	if len(spawns) < 2 || spawns[0].Body["outcome"] != "started" || spawns[0].Body["evidence_class"] != "spawn-measured" {
		t.Fatalf("spawn records: %v", spawns)
	}
	if len(kinds(rs, "session")) < 1 {
		t.Fatal("no session record")
	}
}

func TestUnknownTool(t *testing.T) {
	h := newHarness(t, hconf{})
	cs := h.connect("", nil)
	for _, name := range []string{"t__nope", "nope", "other__echo"} {
		_, err := call(t, cs, name, nil)
		if wireCode(err) != CodeUnknownTool || !strings.Contains(err.Error(), "tools/list") {
			t.Fatalf("%s: %v", name, err)
		}
	}
	calls := kinds(h.records(), "call")
	if len(calls) != 3 || calls[0].Body["outcome"] != "refused" || len(kinds(h.records(), "result")) != 0 {
		t.Fatalf("unknown tools must be recorded as refused: %v", calls)
	}
}

func TestAuthentication(t *testing.T) {
	h := newHarness(t, hconf{tokens: []Token{{Digest: TokenDigest("s3cret-a"), Identity: "agent-a"}, {Digest: TokenDigest("s3cret-b"), Identity: "agent-b"}}})
	for _, tc := range []struct{ name, tok string }{{"missing", ""}, {"wrong", "nope"}} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest("POST", h.url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			if tc.tok != "" {
				req.Header.Set("Authorization", "Bearer "+tc.tok)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized || !bytes.Contains(body, []byte("cmcp:")) {
				t.Fatalf("status %d body %s", resp.StatusCode, body)
			}
			if _, err := h.tryConnect(tc.tok, nil); err == nil {
				t.Fatal("client connected without a valid token")
			}
		})
	}
	cs := h.connect("s3cret-a", nil)
	if _, err := call(t, cs, "t__echo", map[string]any{"text": "x"}); err != nil {
		t.Fatal(err)
	}
	calls := kinds(h.records(), "call")
	if calls[len(calls)-1].Body["agent"] != "agent-a" {
		t.Fatalf("identity not recorded: %v", calls[len(calls)-1].Body)
	}
	// Another identity cannot use agent-a's session.
	req, _ := http.NewRequest("POST", h.url, strings.NewReader(`{"jsonrpc":"2.0","id":9,"method":"ping"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer s3cret-b")
	req.Header.Set("Mcp-Session-Id", cs.ID())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("session hijack: status %d", resp.StatusCode)
	}
}

func TestBadInput(t *testing.T) {
	h := newHarness(t, hconf{})
	cs := h.connect("", nil)
	sid := cs.ID()
	cases := []struct {
		name string
		body []byte
		code int
	}{
		{"malformed JSON", []byte(`{"jsonrpc":"2.0","id":1,"method":`), http.StatusBadRequest},
		{"non-object", []byte(`"hello"`), http.StatusBadRequest},
		{"batch", []byte(`[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":2,"method":"ping"}]`), http.StatusBadRequest},
		{"huge", append(append([]byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t__echo","arguments":{"text":"`), bytes.Repeat([]byte("a"), 2<<20)...), []byte(`"}}}`)...), http.StatusRequestEntityTooLarge},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, body := rawPost(t, h.url, sid, tc.body)
			if code != tc.code {
				t.Fatalf("status %d, want %d; body %s", code, tc.code, clip(body, 300))
			}
			if strings.TrimSpace(body) == "" {
				t.Fatal("empty error body: the agent gets no reason")
			}
		})
	}
	// The session still works and nothing reached the upstream.
	if _, err := call(t, cs, "t__echo", map[string]any{"text": "after"}); err != nil {
		t.Fatal(err)
	}
	if n := len(kinds(h.records(), "call")); n != 1 {
		t.Fatalf("%d call records, want 1", n)
	}
}

// A batch is refused before any session exists, also from a client that
// sends no protocol version (go-sdk alone would treat it as 2025-03-26 and
// run every request in it).
func TestBatchRefusedWithoutSession(t *testing.T) {
	h := newHarness(t, hconf{})
	batch := []byte(` [{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"x","version":"1"}}},` +
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"t__echo","arguments":{"text":"smuggled"}}}]`)
	code, body := rawPost(t, h.url, "", batch)
	if code != http.StatusBadRequest || !strings.Contains(body, "batches are refused") || !strings.Contains(body, `"code":-32600`) {
		t.Fatalf("status %d body %s; want 400 with a JSON-RPC error", code, clip(body, 300))
	}
	if n := len(kinds(h.records(), "call")); n != 0 {
		t.Fatalf("%d call records for a refused batch, want 0", n)
	}
	if n := len(kinds(h.records(), "session")); n != 0 {
		t.Fatalf("%d session records for a refused batch, want 0", n)
	}
	// A single request with leading white space still works.
	cs := h.connect("", nil)
	if _, err := call(t, cs, "t__echo", map[string]any{"text": "ok"}); err != nil {
		t.Fatal(err)
	}
}

// TestRequestBodyLimits: max_request_bytes counts the whole body, leading
// white space included, on the fast path (an initialised session) and on a
// POST that opens a session: the white space the batch check skips is not
// free. Nothing over the limit reaches the upstream.
func TestRequestBodyLimits(t *testing.T) {
	h := newHarness(t, hconf{})
	cs := h.connect("", nil)
	const limit = 1 << 20 // the harness's MaxRequestBytes
	toolCall := []byte(`{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"t__echo","arguments":{"text":"padded"}}}`)
	initialize := []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`)
	pad := func(n int, msg []byte) []byte { return append(bytes.Repeat([]byte(" \n\t\r"), n/4), msg...) }
	cases := []struct {
		name string
		sid  string
		body []byte
	}{
		{"white space over the limit, initialised session", cs.ID(), pad(2*limit, toolCall)},
		{"white space over the limit, new session", "", pad(2*limit, initialize)},
		{"white space under the limit, message over it, initialised session", cs.ID(), pad(limit-16, toolCall)},
		{"white space under the limit, message over it, new session", "", pad(limit-16, initialize)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, body := rawPost(t, h.url, tc.sid, tc.body)
			if code != http.StatusRequestEntityTooLarge {
				t.Fatalf("%d-byte body: status %d, want 413; body %s", len(tc.body), code, clip(body, 300))
			}
			if strings.TrimSpace(body) == "" {
				t.Fatal("empty error body: the agent gets no reason")
			}
		})
	}
	if n := len(kinds(h.records(), "call")); n != 0 {
		t.Fatalf("%d call records for bodies over the limit, want 0", n)
	}
	if n := len(kinds(h.records(), "session")); n != 1 {
		t.Fatalf("%d session records, want 1: a POST over the limit opened a session", n)
	}
	// White space within the limit is still accepted.
	if code, body := rawPost(t, h.url, cs.ID(), pad(1024, toolCall)); code != http.StatusOK || !strings.Contains(body, "echo: padded") {
		t.Fatalf("padded call within the limit: status %d %s", code, clip(body, 300))
	}
}

// TestSlowRequestBodyCutOff: a POST body that keeps arriving (here white
// space, a byte at a time) is cut off after the body timeout instead of
// holding the session busy, and so unreapable, for ever; a call that takes
// longer than the body timeout after its body arrived is not cut off.
func TestSlowRequestBodyCutOff(t *testing.T) {
	h := newHarness(t, hconf{bodyTimeout: 500 * time.Millisecond})
	cs := h.connect("", nil)
	if res, err := call(t, cs, "t__sleep", map[string]any{"text": "1s"}); err != nil || firstText(res) != "slept 1s" {
		t.Fatalf("a call longer than the body timeout: %v %v", firstText(res), err)
	}
	s := h.g.sessionByID(cs.ID())
	if s == nil {
		t.Fatal("no session")
	}
	pr, pw := io.Pipe()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		defer pw.Close()
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if _, err := pw.Write([]byte(" ")); err != nil {
				return
			}
		}
	}()
	req, _ := http.NewRequest("POST", h.url, pr)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", cs.ID())
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	start := time.Now()
	hc := &http.Client{Timeout: 15 * time.Second}
	resp, err := hc.Do(req)
	if err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestTimeout {
			t.Fatalf("endless body: status %d %s, want 408", resp.StatusCode, clip(string(b), 300))
		}
	} else if time.Since(start) > 10*time.Second {
		t.Fatalf("endless body was not cut off: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("endless body cut off after %v, want about the 500 ms body timeout", d)
	}
	eventually(t, 5*time.Second, func() string {
		if n := s.http.posts.Load(); n != 0 {
			return fmt.Sprintf("the session still counts %d POSTs in progress", n)
		}
		return ""
	})
}

func TestDigestMismatch(t *testing.T) {
	bad := digest.Bytes([]byte("not the binary"))
	h := newHarness(t, hconf{pin: &bad})
	cs := h.connect("", nil)
	_, err := call(t, cs, "t__echo", nil)
	if wireCode(err) != CodeUpstreamUnavailable || !strings.Contains(err.Error(), `upstream "t"`) || !strings.Contains(err.Error(), bad.String()) {
		t.Fatalf("want upstream-unavailable naming the upstream and pin, got %v", err)
	}
	rs := h.records()
	var refused int
	for _, s := range kinds(rs, "spawn") {
		if s.Body["outcome"] == "refused" {
			refused++
		}
		if s.Body["outcome"] == "started" {
			t.Fatal("a mismatched binary was started")
		}
	}
	if refused < 2 { // at Start and again (re-measured) at the call
		t.Fatalf("refused spawn records: %d", refused)
	}
	if c := kinds(rs, "call"); len(c) != 1 || c[0].Body["outcome"] != "refused" {
		t.Fatalf("call records: %v", c)
	}
}

func TestUnpinned(t *testing.T) {
	var zero digest.Digest
	t.Run("refused", func(t *testing.T) {
		h := newHarness(t, hconf{pin: &zero})
		cs := h.connect("", nil)
		_, err := call(t, cs, "t__echo", nil)
		if wireCode(err) != CodeUpstreamUnavailable || !strings.Contains(err.Error(), "no pin") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("allow_unmeasured", func(t *testing.T) {
		h := newHarness(t, hconf{pin: &zero, unmeasured: true})
		cs := h.connect("", nil)
		if _, err := call(t, cs, "t__echo", nil); err != nil {
			t.Fatal(err)
		}
		c := kinds(h.records(), "call")
		if c[0].Body["evidence_class"] != "spawn-unmeasured" {
			t.Fatalf("class %v", c[0].Body["evidence_class"])
		}
	})
}

func TestChildExitsAtStart(t *testing.T) {
	h := newHarness(t, hconf{mode: "exit"})
	cs := h.connect("", nil)
	_, err := call(t, cs, "t__echo", nil)
	if wireCode(err) != CodeUpstreamUnavailable || !strings.Contains(err.Error(), `upstream "t"`) {
		t.Fatalf("got %v", err)
	}
	if !strings.Contains(err.Error(), "exit status 3") && !strings.Contains(err.Error(), "closed") {
		t.Fatalf("error does not say the child exited: %v", err)
	}
}

func TestChildDiesMidCall(t *testing.T) {
	h := newHarness(t, hconf{})
	cs := h.connect("", nil)
	pid1 := pidOf(t, cs, "t__pid")
	_, err := call(t, cs, "t__crash", nil)
	if wireCode(err) != CodeUpstreamFailed || !strings.Contains(err.Error(), `upstream "t"`) {
		t.Fatalf("got %v", err)
	}
	pid2 := pidOf(t, cs, "t__pid")
	if pid2 == pid1 {
		t.Fatal("the dead child was not replaced")
	}
	// Result records are written as calls end, not in call order: the
	// crash's is the one naming the second call record.
	h.g.results.Wait()
	rs := h.records()
	crash := kinds(rs, "call")[1].Seq
	var res rec
	for _, r := range kinds(rs, "result") {
		if fmt.Sprint(r.Body["call"]) == crash {
			res = r
		}
	}
	if res.Body["outcome"] != "upstream_error" {
		t.Fatalf("crash result: %v", res.Body)
	}
	started := 0
	for _, s := range kinds(rs, "spawn") {
		if s.Body["outcome"] == "started" {
			started++
		}
	}
	if started != 3 { // probe, first session child, respawn
		t.Fatalf("started spawns = %d, want 3", started)
	}
}

func TestGarbageOnStdout(t *testing.T) {
	h := newHarness(t, hconf{})
	cs := h.connect("", nil)
	pid1 := pidOf(t, cs, "t__pid")
	_, err := call(t, cs, "t__garbage", nil)
	if wireCode(err) != CodeUpstreamFailed || !strings.Contains(err.Error(), "not a JSON-RPC message") || !strings.Contains(err.Error(), "this is not") {
		t.Fatalf("got %v", err)
	}
	eventually(t, 10*time.Second, func() string {
		if pidAlive(pid1) {
			return "desynchronised child still alive"
		}
		return ""
	})
	if pid2 := pidOf(t, cs, "t__pid"); pid2 == pid1 {
		t.Fatal("not respawned")
	}
	found := false
	for _, s := range kinds(h.records(), "spawn") {
		if r, _ := s.Body["reason"].(string); s.Body["outcome"] == "exited" && strings.Contains(r, "not a JSON-RPC message") {
			found = true
		}
	}
	if !found {
		t.Fatal("the desync is not recorded")
	}
}

func TestStderrFlood(t *testing.T) {
	h := newHarness(t, hconf{})
	cs := h.connect("", nil)
	start := time.Now()
	res, err := call(t, cs, "t__flood", nil)
	if err != nil || firstText(res) != "flooded" {
		t.Fatalf("flood: %v %v", res, err)
	}
	if _, err := call(t, cs, "t__echo", map[string]any{"text": "still"}); err != nil {
		t.Fatal(err)
	}
	t.Logf("32 MiB of stderr took %s", time.Since(start))
	cs.Close()
	eventually(t, 10*time.Second, func() string {
		for _, r := range kinds(h.records(), "stderr") {
			b, _ := strconv.ParseInt(r.Body["bytes"].(string), 10, 64)
			if b >= 32<<20 {
				if r.Body["dropped"] == nil {
					return "no dropped count"
				}
				return ""
			}
		}
		return "no stderr record with the byte count"
	})
	if n := strings.Count(h.logs.String(), "upstream stderr"); n > 2000 {
		t.Fatalf("the gateway log got %d stderr lines: not bounded", n)
	}
}

func TestChildIgnoresSIGTERM(t *testing.T) {
	h := newHarness(t, hconf{mode: "ignoreterm", grace: 300 * time.Millisecond})
	cs := h.connect("", nil)
	pid := pidOf(t, cs, "t__pid")
	cs.Close()
	eventually(t, 10*time.Second, func() string {
		if pidAlive(pid) {
			return "child ignoring SIGTERM is still alive"
		}
		return ""
	})
	eventually(t, 5*time.Second, func() string {
		for _, s := range kinds(h.records(), "spawn") {
			if s.Body["outcome"] == "exited" && s.Body["pid"] == strconv.Itoa(pid) {
				if s.Body["signal"] != "killed" {
					return fmt.Sprintf("exit signal %v", s.Body["signal"])
				}
				return ""
			}
		}
		return "no exit record"
	})
}

func TestNoOrphanedGrandchildren(t *testing.T) {
	mark := filepath.Join(t.TempDir(), "gc.pid")
	h := newHarness(t, hconf{mode: "grandparent", env: map[string]string{"CMCP_TEST_MARK": mark}})
	cs := h.connect("", nil)
	pidOf(t, cs, "t__pid")
	b, err := os.ReadFile(mark)
	if err != nil {
		t.Fatal(err)
	}
	gc, _ := strconv.Atoi(string(b))
	if !pidAlive(gc) {
		t.Fatal("grandchild not running")
	}
	cs.Close()
	eventually(t, 10*time.Second, func() string {
		if pidAlive(gc) {
			return "grandchild orphaned"
		}
		return ""
	})
}

func TestHungUpstream(t *testing.T) {
	for _, front := range fronts {
		t.Run(front, func(t *testing.T) {
			mark := filepath.Join(t.TempDir(), "cancelled")
			h := newHarness(t, hconf{callTimeout: 2 * time.Second, env: map[string]string{"CMCP_TEST_MARK": mark}})
			cs := h.connectVia(front, nil)
			_, err := call(t, cs, "t__hang", nil)
			if wireCode(err) != CodeUpstreamTimeout {
				t.Fatalf("got %v", err)
			}
			eventually(t, 5*time.Second, func() string {
				if b, _ := os.ReadFile(mark); string(b) != "cancelled" {
					return "the upstream was not told to cancel"
				}
				return ""
			})
			// Agent-side cancellation is passed on as well.
			// Agent-side cancellation, once the upstream is working on the call.
			os.Remove(mark)
			os.Remove(mark + ".started")
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			go func() {
				_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "t__hang", Arguments: map[string]any{}})
				errc <- err
			}()
			eventually(t, 10*time.Second, func() string {
				if _, err := os.Stat(mark + ".started"); err != nil {
					return "the upstream has not started the call"
				}
				return ""
			})
			cancel()
			if err := <-errc; err == nil {
				t.Fatal("cancelled call returned no error")
			}
			eventually(t, 5*time.Second, func() string {
				if b, _ := os.ReadFile(mark); string(b) != "cancelled" {
					return "agent cancellation not passed on"
				}
				return ""
			})
			eventually(t, 5*time.Second, func() string {
				res := kinds(h.records(), "result")
				if len(res) != 2 || res[0].Body["outcome"] != "gateway_fault" || res[1].Body["outcome"] != "cancelled" {
					return "results: " + strconv.Itoa(len(res))
				}
				return ""
			})
		})
	}
}

func TestAuditFailureRefusesCalls(t *testing.T) {
	// The child writes down every call it receives.
	seen := filepath.Join(t.TempDir(), "seen")
	h := newHarness(t, hconf{env: map[string]string{"CMCP_TEST_SEEN": seen}})
	cs := h.connect("", nil)
	if _, err := call(t, cs, "t__record", map[string]any{"text": "before"}); err != nil {
		t.Fatal(err)
	}
	before := len(kinds(h.records(), "call"))
	// The log becomes unwritable: the writer is closed under the gateway.
	if err := h.w.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := call(t, cs, "t__record", map[string]any{"text": "must not run"})
	if wireCode(err) != CodeAuditUnavailable || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("got %v", err)
	}
	if after := len(kinds(h.records(), "call")); after != before {
		t.Fatalf("call records %d -> %d", before, after)
	}
	// Never forwarded: the upstream saw only the call before the failure.
	if b, _ := os.ReadFile(seen); string(b) != "before\n" {
		t.Fatalf("the upstream received %q, want only the call before the failure", b)
	}
}

func TestToolDrift(t *testing.T) {
	// Pins taken from the honest server.
	h0 := newHarness(t, hconf{})
	pins := map[string]digest.Digest{}
	h0.g.ups["t"].mu.Lock()
	for k, v := range h0.g.ups["t"].baseline {
		pins[k] = v
	}
	h0.g.ups["t"].mu.Unlock()

	t.Run("refuse", func(t *testing.T) {
		h := newHarness(t, hconf{mode: "drift", toolPins: pins})
		cs := h.connect("", nil)
		lt, _ := cs.ListTools(context.Background(), nil)
		for _, tl := range lt.Tools {
			if tl.Name == "t__echo" {
				t.Fatal("drifted tool listed")
			}
		}
		_, err := call(t, cs, "t__echo", nil)
		// Drifted before the gateway started: not in the catalog at all.
		if wireCode(err) != CodeUnknownTool {
			t.Fatalf("got %v", err)
		}
		if _, err := call(t, cs, "t__fail", nil); err != nil {
			t.Fatalf("undrifted tool: %v", err)
		}
		var d []rec
		for _, r := range kinds(h.records(), "drift") {
			if r.Body["tool"] == "echo" {
				d = append(d, r)
			}
		}
		if len(d) == 0 || d[0].Body["change"] != "changed" || d[0].Body["action"] != "refused" {
			t.Fatalf("drift records: %v", d)
		}
	})
	t.Run("warn", func(t *testing.T) {
		h := newHarness(t, hconf{mode: "drift", toolPins: pins, driftWarn: true})
		cs := h.connect("", nil)
		if _, err := call(t, cs, "t__echo", nil); err != nil {
			t.Fatal(err)
		}
		found := false
		for _, r := range kinds(h.records(), "drift") {
			found = found || (r.Body["tool"] == "echo" && r.Body["action"] == "flagged")
		}
		if !found {
			t.Fatal("no flagged drift record")
		}
	})
}

func TestConcurrentFirstUseStartsOneChild(t *testing.T) {
	h := newHarness(t, hconf{})
	cs := h.connect("", nil)
	var wg sync.WaitGroup
	pids := make([]int, 8)
	for i := range pids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pids[i] = pidOf(t, cs, "t__pid")
		}()
	}
	wg.Wait()
	for _, p := range pids {
		if p != pids[0] {
			t.Fatalf("concurrent first calls used different children: %v", pids)
		}
	}
}

func TestSharedLifecycle(t *testing.T) {
	h := newHarness(t, hconf{shared: true})
	a, b := h.connect("", nil), h.connect("", nil)
	if pa, pb := pidOf(t, a, "t__pid"), pidOf(t, b, "t__pid"); pa != pb {
		t.Fatalf("shared upstream: %d vs %d", pa, pb)
	}
	for _, s := range kinds(h.records(), "spawn") {
		if s.Body["outcome"] == "started" && s.Body["shared"] != true {
			t.Fatalf("shared spawn not recorded as shared: %v", s.Body)
		}
	}
}

func TestChildEnvironmentHasNoSecrets(t *testing.T) {
	environ := append(os.Environ(), "CMCP_ADMIN_TOKEN=top-secret", "AWS_SECRET_ACCESS_KEY=also-secret")
	h := newHarness(t, hconf{environ: environ, env: map[string]string{"CONFIGURED": "yes"}})
	cs := h.connect("", nil)
	res, err := call(t, cs, "t__env", nil)
	if err != nil {
		t.Fatal(err)
	}
	env := firstText(res)
	if strings.Contains(env, "secret") {
		t.Fatalf("a gateway secret reached the child:\n%s", env)
	}
	if !strings.Contains(env, "CONFIGURED=yes") || !strings.Contains(env, "PATH=") {
		t.Fatalf("configured or allowlisted variables missing:\n%s", env)
	}
}

func TestForwarding(t *testing.T) {
	for _, tc := range []struct {
		name, front string
		http        bool
	}{{"http", "http", false}, {"stdio", "stdio", false}, {"http front, http upstream", "http", true}, {"stdio front, http upstream", "stdio", true}} {
		front := tc.front
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, hconf{http: tc.http})
			var mu sync.Mutex
			var progress []float64
			var logs []string
			opts := &mcp.ClientOptions{
				ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
					mu.Lock()
					defer mu.Unlock()
					if r.Params.ProgressToken != "tok-1" {
						logs = append(logs, "bad token")
					}
					progress = append(progress, r.Params.Progress)
				},
				LoggingMessageHandler: func(_ context.Context, r *mcp.LoggingMessageRequest) {
					mu.Lock()
					defer mu.Unlock()
					logs = append(logs, r.Params.Data.(string))
				},
				CreateMessageHandler: func(_ context.Context, r *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
					return &mcp.CreateMessageResult{Model: "m", Role: "assistant", Content: &mcp.TextContent{Text: "sampled " + r.Params.Messages[0].Content.(*mcp.TextContent).Text}}, nil
				},
				ElicitationHandler: func(_ context.Context, r *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
					return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"name": "ada"}}, nil
				},
			}
			cs := h.connectVia(front, opts)
			ctx := context.Background()
			if err := cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: "debug"}); err != nil {
				t.Fatal(err)
			}
			p := &mcp.CallToolParams{Name: "t__progress", Arguments: map[string]any{}}
			p.SetProgressToken("tok-1")
			if _, err := cs.CallTool(ctx, p); err != nil {
				t.Fatal(err)
			}
			eventually(t, 5*time.Second, func() string {
				mu.Lock()
				defer mu.Unlock()
				if len(progress) != 3 || !slices.Contains(logs, "progress done") || slices.Contains(logs, "bad token") {
					return "progress/logs: " + strings.Join(logs, ",")
				}
				return ""
			})
			if res, err := call(t, cs, "t__sample", map[string]any{"text": "q"}); err != nil || firstText(res) != "sampled: sampled q" {
				t.Fatalf("sampling: %v %v", firstText(res), err)
			}
			if res, err := call(t, cs, "t__elicit", nil); err != nil || firstText(res) != "elicited: accept ada" {
				t.Fatalf("elicitation: %v %v", firstText(res), err)
			}
			// The three calls above went through the front's fast path, with
			// their progress, logs, sampling and elicitation on the call's
			// own stream.
			if n := h.g.fastPath.Load(); n != 3 {
				t.Fatalf("the %s front answered %d calls itself, want 3", front, n)
			}

			rl, err := cs.ListResources(ctx, nil)
			if err != nil || len(rl.Resources) != 1 || rl.Resources[0].URI != "test://static" {
				t.Fatalf("resources/list: %v %v", rl, err)
			}
			rr, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "test://static"})
			if err != nil || rr.Contents[0].Text != "static text" {
				t.Fatalf("resources/read: %v %v", rr, err)
			}
			tl, err := cs.ListResourceTemplates(ctx, nil)
			if err != nil || len(tl.ResourceTemplates) != 1 {
				t.Fatalf("templates: %v %v", tl, err)
			}
			rr, err = cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "test://item/7"})
			if err != nil || rr.Contents[0].Text != "item test://item/7" {
				t.Fatalf("template read: %v %v", rr, err)
			}
			pl, err := cs.ListPrompts(ctx, nil)
			if err != nil || len(pl.Prompts) != 2 || !slices.ContainsFunc(pl.Prompts, func(p *mcp.Prompt) bool { return p.Name == "t__greet" }) {
				t.Fatalf("prompts/list: %v %v", pl, err)
			}
			gp, err := cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: "t__greet", Arguments: map[string]string{"who": "bob"}})
			if err != nil || gp.Messages[0].Content.(*mcp.TextContent).Text != "hello bob" {
				t.Fatalf("prompts/get: %v %v", gp, err)
			}
			cr, err := cs.Complete(ctx, &mcp.CompleteParams{Ref: &mcp.CompleteReference{Type: "ref/prompt", Name: "t__greet"}, Argument: mcp.CompleteParamsArgument{Name: "who", Value: "bo"}})
			if err != nil || len(cr.Completion.Values) != 1 || cr.Completion.Values[0] != "bo-done" {
				t.Fatalf("complete: %v %v", cr, err)
			}
		})
	}
}

func TestStdioFront(t *testing.T) {
	h := newHarness(t, hconf{})
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- h.g.ServeStdio(context.Background(), inR, outW, "local-user") }()
	c := mcp.NewClient(&mcp.Implementation{Name: "stdio-agent", Version: "1"}, nil)
	cs, err := c.Connect(context.Background(), &mcp.IOTransport{Reader: outR, Writer: inW}, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := call(t, cs, "t__echo", map[string]any{"text": "via stdio"})
	if err != nil || firstText(res) != "echo: via stdio" {
		t.Fatalf("%v %v", firstText(res), err)
	}
	if h.g.fastPath.Load() != 1 {
		t.Fatalf("the stdio front answered %d calls itself, want 1 (its fast path is not in use)", h.g.fastPath.Load())
	}
	cs.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("ServeStdio: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("ServeStdio did not return after the agent disconnected")
	}
	calls := kinds(h.records(), "call")
	if calls[0].Body["agent"] != "local-user" || !strings.HasPrefix(calls[0].Body["session"].(string), "stdio-") {
		t.Fatalf("call record: %v", calls[0].Body)
	}
	ended := false
	for _, s := range kinds(h.records(), "session") {
		ended = ended || s.Body["event"] == "end"
	}
	if !ended {
		t.Fatal("no session end record")
	}
}

type denyTool struct{ tool string }

func (d denyTool) Decide(_ context.Context, r DecisionRequest) (Decision, error) {
	if r.Tool == d.tool {
		return Decision{Effect: "deny", Mode: ModeEnforcing, PolicyIDs: []string{"p1"}, Reason: "not today"}, nil
	}
	return Decision{Effect: "allow", Mode: ModeEnforcing, PolicyIDs: []string{"p0"}}, nil
}

func TestDeciderSeam(t *testing.T) {
	h := newHarness(t, hconf{decider: denyTool{"t__echo"}})
	cs := h.connect("", nil)
	_, err := call(t, cs, "t__echo", nil)
	if wireCode(err) != CodeDenied || !strings.Contains(err.Error(), "not today") {
		t.Fatalf("got %v", err)
	}
	if _, err := call(t, cs, "t__fail", nil); err != nil {
		t.Fatal(err)
	}
	calls := kinds(h.records(), "call")
	if calls[0].Body["decision"] != "deny" || calls[0].Body["outcome"] != "refused" || calls[0].Body["policy_mode"] != "enforcing" {
		t.Fatalf("deny record: %v", calls[0].Body)
	}
	if len(kinds(h.records(), "result")) != 1 {
		t.Fatal("a refused call got a result record")
	}
}

// TestResourceSubscribe: resources/subscribe and unsubscribe pass through to
// the upstream that has the resource, the upstream's
// notifications/resources/updated reaches the subscribed agent and no other
// session; with a stdio and with an HTTP upstream (which sends it on its
// standalone stream).
func TestResourceSubscribe(t *testing.T) {
	for _, kind := range []string{"stdio", "http"} {
		t.Run(kind, func(t *testing.T) { testResourceSubscribe(t, hconf{http: kind == "http"}) })
	}
}

func testResourceSubscribe(t *testing.T, hc hconf) {
	h := newHarness(t, hc)
	updated := make(chan string, 4)
	opts := &mcp.ClientOptions{ResourceUpdatedHandler: func(_ context.Context, r *mcp.ResourceUpdatedNotificationRequest) {
		updated <- r.Params.URI
	}}
	other := make(chan string, 4)
	bystander := h.connect("", &mcp.ClientOptions{ResourceUpdatedHandler: func(_ context.Context, r *mcp.ResourceUpdatedNotificationRequest) {
		other <- r.Params.URI
	}})
	if _, err := bystander.ListResources(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	cs := h.connect("", opts)
	if cs.InitializeResult().Capabilities.Resources == nil || !cs.InitializeResult().Capabilities.Resources.Subscribe {
		t.Fatalf("gateway does not advertise resources.subscribe: %+v", cs.InitializeResult().Capabilities.Resources)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "test://static"}); err != nil {
		t.Fatalf("resources/subscribe: %v", err)
	}
	select {
	case uri := <-updated:
		if uri != "test://static" {
			t.Fatalf("updated %q, want test://static", uri)
		}
	case <-ctx.Done():
		t.Fatal("the upstream's notifications/resources/updated did not reach the subscribed agent")
	}
	if err := cs.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: "test://static"}); err != nil {
		t.Fatalf("resources/unsubscribe: %v", err)
	}
	select {
	case uri := <-other:
		t.Fatalf("a session that did not subscribe got resources/updated for %q", uri)
	case <-time.After(200 * time.Millisecond):
	}
}

// TestDNSRebindingRefused: on a loopback listener, a request whose Host is
// not a loopback name (a web page that rebound its DNS name to 127.0.0.1) is
// refused with 403, whether it opens a session or uses one, and reaches no
// upstream.
func TestDNSRebindingRefused(t *testing.T) {
	h := newHarness(t, hconf{})
	cs := h.connect("", nil)
	post := func(sid, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("POST", h.url, strings.NewReader(body))
		req.Host = "attacker.example:80"
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if sid != "" {
			req.Header.Set("Mcp-Session-Id", sid)
			req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := post("", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"page","version":"1"}}}`)
	if code != http.StatusForbidden || !strings.Contains(body, "Host") {
		t.Fatalf("initialize with a foreign Host: status %d, body %q; want 403 naming the Host header", code, clip(body, 200))
	}
	code, body = post(cs.ID(), `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"t__echo","arguments":{"text":"rebound"}}}`)
	if code != http.StatusForbidden {
		t.Fatalf("tools/call with a foreign Host: status %d, body %q; want 403", code, clip(body, 200))
	}
	if _, err := call(t, cs, "t__echo", map[string]any{"text": "after"}); err != nil {
		t.Fatal(err)
	}
	rs := h.records()
	if n := len(kinds(rs, "call")); n != 1 {
		t.Fatalf("%d call records, want 1 (the rebound call must not be recorded as made)", n)
	}
	for _, s := range kinds(rs, "session") {
		if s.Body["client_name"] == "page" {
			t.Fatalf("the rebound initialize opened a session: %v", s.Body)
		}
	}
}

// TestEveryContentTypePassesThrough: image, audio, resource link and embedded
// text and blob resources, with their annotations and _meta, reach the agent
// exactly as the upstream sent them.
func TestEveryContentTypePassesThrough(t *testing.T) {
	for _, front := range fronts {
		t.Run(front, func(t *testing.T) {
			h := newHarness(t, hconf{})
			cs := h.connectVia(front, nil)
			res, err := call(t, cs, "t__media", nil)
			if err != nil {
				t.Fatal(err)
			}
			got, err := json.Marshal(res.Content)
			if err != nil {
				t.Fatal(err)
			}
			want := `[{"type":"image","mimeType":"image/png","data":"iVBORwABAg==","annotations":{"audience":["user"],"priority":0.5}},` +
				`{"type":"audio","mimeType":"audio/wav","data":"UklGRgB3YXY=","_meta":{"k":"audio"}},` +
				`{"type":"resource_link","mimeType":"text/plain","uri":"test://static","name":"static","title":"Static"},` +
				`{"type":"resource","resource":{"uri":"test://item/1","mimeType":"text/plain","text":"item one"}},` +
				`{"type":"resource","resource":{"uri":"test://item/2","mimeType":"application/octet-stream","blob":"AP8Q"}}]`
			if string(got) != want {
				t.Fatalf("content through cmcp:\n got %s\nwant %s", got, want)
			}
			if c := kinds(h.records(), "result"); len(c) != 1 || c[0].Body["outcome"] != "ok" {
				t.Fatalf("result records: %v", c)
			}
		})
	}
}

// TestUpstreamProtocolVersion: the gateway initializes its upstreams at
// upstream.ProtocolVersion (2025-11-25, the version that keeps logging,
// sampling and elicitation working through it).
func TestUpstreamProtocolVersion(t *testing.T) {
	if upstream.ProtocolVersion != "2025-11-25" {
		t.Fatalf("upstream.ProtocolVersion = %q, want 2025-11-25", upstream.ProtocolVersion)
	}
	h := newHarness(t, hconf{})
	cs := h.connect("", nil)
	res, err := call(t, cs, "t__proto", nil)
	if err != nil || firstText(res) != upstream.ProtocolVersion {
		t.Fatalf("the child was initialized at %q (%v), want %s", firstText(res), err, upstream.ProtocolVersion)
	}
}

// TestFastPathResponseShapes: over HTTP, a call with nothing to say before
// its result is answered with one application/json body; a call whose
// upstream reports progress gets an SSE stream with the progress first.
// Wrong headers still get go-sdk's refusals, and a duplicate in-flight id
// is refused.
func TestFastPathResponseShapes(t *testing.T) {
	h := newHarness(t, hconf{})
	cs := h.connect("", nil)
	post := func(body string, hdr map[string]string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest("POST", h.url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Session-Id", cs.ID())
		req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	before := h.g.fastPath.Load()
	resp, body := post(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"t__echo","arguments":{"text":"plain"}}}`, nil)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" || !strings.HasPrefix(body, `{"jsonrpc":"2.0","id":7,"result":{`) || !strings.Contains(body, "echo: plain") {
		t.Fatalf("plain call: %d %q %q", resp.StatusCode, resp.Header.Get("Content-Type"), clip(body, 300))
	}
	resp, body = post(`{"jsonrpc":"2.0","id":"p","method":"tools/call","params":{"_meta":{"progressToken":"pt"},"name":"t__progress","arguments":{}}}`, nil)
	events := strings.Split(strings.TrimSpace(body), "\n\n")
	if resp.Header.Get("Content-Type") != "text/event-stream" || len(events) < 2 ||
		!strings.Contains(events[0], `"method":"notifications/progress"`) || !strings.Contains(events[0], `"progressToken":"pt"`) ||
		!strings.Contains(events[len(events)-1], `"id":"p","result"`) {
		t.Fatalf("progress call: %q %q", resp.Header.Get("Content-Type"), clip(body, 600))
	}
	if got := h.g.fastPath.Load() - before; got != 2 {
		t.Fatalf("%d calls took the fast path, want 2", got)
	}
	// go-sdk still answers what the fast path does not take.
	if resp, _ := post(`{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"t__echo","arguments":{}}}`, map[string]string{"Mcp-Protocol-Version": "1999-01-01"}); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("unsupported protocol version header: status %d", resp.StatusCode)
	}
	if resp, _ := post(`{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"t__echo","arguments":{}}}`, map[string]string{"Accept": "application/json"}); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("Accept without text/event-stream: status %d", resp.StatusCode)
	}
	if resp, _ := post(`{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":"t__echo","arguments":{}}}`, map[string]string{"Content-Type": "text/plain"}); resp.StatusCode < 400 {
		t.Fatalf("Content-Type text/plain: status %d", resp.StatusCode)
	}
	if resp, _ := post(`{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"t__echo","arguments":{}}}`, map[string]string{"Mcp-Session-Id": "no-such-session"}); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("unknown session: status %d", resp.StatusCode)
	}
	if got := h.g.fastPath.Load() - before; got != 2 {
		t.Fatalf("requests go-sdk must refuse took the fast path (%d)", got)
	}
	// A second call with the id of one in flight is refused.
	done := make(chan struct{})
	go func() {
		defer close(done)
		post(`{"jsonrpc":"2.0","id":"dup","method":"tools/call","params":{"name":"t__sleep","arguments":{"text":"1500ms"}}}`, nil)
	}()
	dup, _ := jsonrpc.MakeID("dup")
	eventually(t, 10*time.Second, func() string {
		s := h.g.sessionByID(cs.ID())
		s.fast.mu.Lock()
		defer s.fast.mu.Unlock()
		if s.fast.m[dup] == nil {
			return "the first call with id \"dup\" is not in flight yet"
		}
		return ""
	})
	resp, body = post(`{"jsonrpc":"2.0","id":"dup","method":"tools/call","params":{"name":"t__echo","arguments":{"text":"x"}}}`, nil)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "duplicate in-flight request ID") {
		t.Fatalf("duplicate id: %d %q", resp.StatusCode, clip(body, 300))
	}
	<-done
}

// TestStdioReadsWhileACallWaits: over stdio, the agent's next messages are
// read and answered while a call waits for its upstream to start (the
// call runs in a worker while the reader goes on): a ping
// is answered while the call's child is held at its start, and the call
// only after the child is let go.
func TestStdioReadsWhileACallWaits(t *testing.T) {
	gate := gwtest.NewSlowStart(t)
	k, v := gate.Env()
	h := newHarness(t, hconf{env: map[string]string{k: v}})
	cs := h.connectVia("stdio", nil)
	gate.Hold(t) // the session's own child starts when the test says so
	ctx := context.Background()
	errc := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "t__echo", Arguments: map[string]any{"text": "x"}})
		errc <- err
	}()
	gate.WaitStarted(t) // the call is waiting for its child
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := cs.Ping(pctx, nil); err != nil {
		t.Fatalf("ping while a call waits for its child: %v: the agent's messages were not read while the call waited", err)
	}
	select {
	case err := <-errc:
		t.Fatalf("the call was answered (%v) before its child could start", err)
	default:
	}
	gate.Release()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}
