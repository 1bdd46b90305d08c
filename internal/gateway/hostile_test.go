package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestAgentTextThatIsNotUTF8IsRefused: arguments or _meta holding a lone
// surrogate escape or bytes that are not UTF-8 are refused with -32602 and
// a call record saying why, and never reach the upstream: a shared child
// that echoes them back (Python's json.dumps does) would write a line the
// gateway cannot read, and be stopped under every other agent's calls. A
// valid pair goes through.
func TestAgentTextThatIsNotUTF8IsRefused(t *testing.T) {
	for _, front := range fronts {
		t.Run(front, func(t *testing.T) {
			seen := t.TempDir() + "/seen"
			h := newHarness(t, hconf{mode: "hostile", shared: true, env: map[string]string{"CMCP_TEST_SEEN": seen}, callTimeout: 10 * time.Second})
			other := h.connect("", nil)
			pid := pidOf(t, other, "t__pid")
			bad := []struct{ name, params, why string }{
				{"lone high surrogate", `"name":"t__echo","arguments":{"text":"\ud800"}`, `lone surrogate`},
				{"lone low surrogate", `"name":"t__echo","arguments":{"text":"a\udc00"}`, `lone surrogate`},
				{"bytes not UTF-8", "\"name\":\"t__echo\",\"arguments\":{\"text\":\"\xff\xfe\"}", `not UTF-8`},
				{"in a member name", `"name":"t__echo","arguments":{"\udfff":1}`, `lone surrogate`},
				{"in _meta", `"_meta":{"k":"\ud800"},"name":"t__echo","arguments":{"text":"x"}`, `lone surrogate`},
			}
			for _, c := range bad {
				got := rawExchange(t, h, front, `{"jsonrpc":"2.0","id":"x","method":"tools/call","params":{`+c.params+`}}`)
				last := got[len(got)-1]
				var resp struct {
					Error *struct {
						Code    int64  `json:"code"`
						Message string `json:"message"`
					} `json:"error"`
				}
				if json.Unmarshal([]byte(last), &resp) != nil || resp.Error == nil || resp.Error.Code != -32602 || !strings.Contains(resp.Error.Message, c.why) {
					t.Errorf("%s: answer %s, want -32602 saying %q", c.name, last, c.why)
				}
			}
			ok := rawExchange(t, h, front, `{"jsonrpc":"2.0","id":"x","method":"tools/call","params":{"name":"t__echo","arguments":{"text":"\ud83d\ude00"}}}`)
			if last := ok[len(ok)-1]; !strings.Contains(last, `"result"`) || !strings.Contains(last, `\ud83d\ude00`) {
				t.Errorf("a valid surrogate pair: %s", last)
			}
			if got := pidOf(t, other, "t__pid"); got != pid {
				t.Errorf("the shared child changed (pid %d, then %d): an agent's text got it stopped", pid, got)
			}
			b, _ := os.ReadFile(seen)
			if n := strings.Count(string(b), "\n"); n != 3 || strings.Contains(string(b), `\ud800`) || strings.Contains(string(b), "\xff") {
				t.Errorf("the child ran %d calls, want 3 (pid, the pair, pid):\n%s", n, b)
			}
			refused := 0
			for _, r := range kinds(h.records(), "call") {
				if r.Body["outcome"] == "refused" {
					refused++
					if why, _ := r.Body["reason"].(string); !strings.Contains(why, "not valid JSON text in UTF-8") {
						t.Errorf("refusal record says %q", why)
					}
				}
			}
			if refused != len(bad) {
				t.Errorf("%d refused call records, want %d", refused, len(bad))
			}
		})
	}
}

// TestAnAnswerThatIsNotUTF8FailsOnlyItsCall: a shared child that answers
// one call with a lone surrogate escape (a server that cut a string between
// the halves of a pair) fails that call with -32067 naming the upstream and
// why; the child is kept and another agent's call waiting on it at the same
// time is answered.
func TestAnAnswerThatIsNotUTF8FailsOnlyItsCall(t *testing.T) {
	h := newHarness(t, hconf{mode: "hostile", shared: true, env: map[string]string{"CMCP_TEST_SEEN": t.TempDir() + "/seen"}, callTimeout: 10 * time.Second})
	a, b := h.connect("", nil), h.connect("", nil)
	pid := pidOf(t, b, "t__pid")
	waited := make(chan error, 1)
	go func() {
		res, err := call(t, b, "t__wait", nil)
		if err == nil && firstText(res) != "waited" {
			err = fmt.Errorf("answer %q", firstText(res))
		}
		waited <- err
	}()
	waitForwarded(t, h.dir, "t__wait", 1)
	_, err := call(t, a, "t__cut", nil)
	if wireCode(err) != CodeUpstreamFailed || !strings.Contains(err.Error(), `upstream "t"`) || !strings.Contains(err.Error(), "lone surrogate") {
		t.Fatalf("the cut answer: %v", err)
	}
	if err := <-waited; err != nil {
		t.Fatalf("the other agent's call: %v", err)
	}
	if got := pidOf(t, a, "t__pid"); got != pid {
		t.Errorf("the shared child was replaced (pid %d, then %d)", pid, got)
	}
	for _, r := range kinds(h.records(), "result") {
		if r.Body["outcome"] == "upstream_error" && fmt.Sprint(r.Body["error_code"]) != "-32067" {
			t.Errorf("result record: %v", r.Body)
		}
	}
}

// TestNullIDFromAServerIsAnUpstreamFault: a server that answers a call
// with "id": null (an error or a result) broke the protocol: the agent is
// answered -32067 naming the upstream, and the result record says so, not
// -32600 "invalid request" as if the upstream had answered that.
func TestNullIDFromAServerIsAnUpstreamFault(t *testing.T) {
	for _, tool := range []string{"nullerror", "nullresult"} {
		t.Run(tool, func(t *testing.T) {
			h := newHarness(t, hconf{mode: "hostile", env: map[string]string{"CMCP_TEST_SEEN": t.TempDir() + "/seen"}, callTimeout: 10 * time.Second})
			cs := h.connect("", nil)
			_, err := call(t, cs, "t__"+tool, nil)
			if wireCode(err) != CodeUpstreamFailed || !strings.Contains(err.Error(), `upstream "t"`) || !strings.Contains(err.Error(), `"id": null`) {
				t.Fatalf("got %v (code %d), want -32067 naming the upstream and the null id", err, wireCode(err))
			}
			res := kinds(h.records(), "result")
			last := res[len(res)-1].Body
			if last["outcome"] != "upstream_error" || fmt.Sprint(last["error_code"]) != "-32067" {
				t.Errorf("result record: %v", last)
			}
		})
	}
}

// TestServerAnsweringBeforeAskedIsNamed: a server that writes an answer
// to id 1 before it has read anything has that line taken for its answer
// to the handshake. The gateway stops it, and the agent, the gateway log
// and the spawn record say why (the handshake's answer), not only that the
// child was killed by the gateway's own SIGTERM.
func TestServerAnsweringBeforeAskedIsNamed(t *testing.T) {
	h := newHarness(t, hconf{mode: "hostile", env: map[string]string{"CMCP_TEST_EARLY": "1", "CMCP_TEST_SEEN": t.TempDir() + "/seen"}, callTimeout: 10 * time.Second})
	cs := h.connect("", nil)
	_, err := call(t, cs, "t__echo", map[string]any{"text": "x"})
	t.Logf("the agent was told: %v", err)
	if err == nil || strings.Contains(err.Error(), "signal") || !strings.Contains(err.Error(), "initialize") {
		t.Errorf("the agent was told %v; want the handshake's fault, not the gateway's own signal", err)
	}
	if l := h.logs.String(); strings.Contains(l, "killed by signal 15") {
		t.Errorf("the gateway log blames a signal:\n%s", l)
	}
	for _, s := range kinds(h.records(), "spawn") {
		if r, _ := s.Body["reason"].(string); s.Body["outcome"] == "exited" && (strings.Contains(r, "signal 15") || !strings.Contains(r, "initialize")) {
			t.Errorf("spawn record: %v", s.Body)
		}
	}
}

// TestReusedIDIsNotInFlight: JSON-RPC asks only that ids be unique among
// the requests in flight. An agent that sends its next call with the id of
// the call just answered is not refused as "duplicate in-flight request
// ID": the id is out of the gateway's in-flight table before the answer
// is on its way (it was removed only after, so a quick agent's next
// request could find it there). Stress: 8 sessions on each front, each
// sending id 9 one call after another.
func TestReusedIDIsNotInFlight(t *testing.T) {
	h := newHarness(t, hconf{mode: "hostile", shared: true, env: map[string]string{"CMCP_TEST_SEEN": os.DevNull}, callTimeout: 10 * time.Second})
	const sessions, calls = 8, 60
	var wg sync.WaitGroup
	var mu sync.Mutex
	var bad []string
	for i := 0; i < sessions; i++ {
		for _, front := range fronts {
			send := rawSender(t, h, front)
			if front == "http" {
				send = freshConnSender(t, h)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := 0; j < calls; j++ {
					tool := "pid"
					if j%2 == 1 {
						tool = "cut" // answered -32067
					}
					got := send(`{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"t__` + tool + `","arguments":{}}}`)
					if strings.Contains(got, "duplicate") || !strings.Contains(got, `"id":9`) {
						mu.Lock()
						bad = append(bad, front+": "+got)
						mu.Unlock()
					}
				}
			}()
		}
	}
	wg.Wait()
	if len(bad) > 0 {
		t.Fatalf("%d of %d calls refused, the first: %s", len(bad), 2*sessions*calls, bad[0])
	}
}

// freshConnSender is rawSender's HTTP sender with a new connection for
// each request: the agent has the answer once it has read its
// Content-Length bytes and sends the next request at once, while the
// gateway's handler of the answered one may still be returning.
func freshConnSender(t *testing.T, h *harness) func(line string) string {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	var sid string
	post := func(line string) string {
		req, _ := http.NewRequest("POST", h.url, strings.NewReader(line))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if sid != "" {
			req.Header.Set("Mcp-Session-Id", sid)
			req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
		}
		resp, err := hc.Do(req)
		if err != nil {
			return "post: " + err.Error()
		}
		defer resp.Body.Close()
		if sid == "" {
			sid = resp.Header.Get("Mcp-Session-Id")
		}
		b, _ := io.ReadAll(resp.Body)
		for _, l := range strings.Split(string(b), "\n") {
			if d, ok := strings.CutPrefix(l, "data: "); ok && strings.Contains(d, `"id":`) {
				return d
			}
		}
		return string(b)
	}
	post(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	post(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	return post
}

// TestRequestWithoutSessionIsHTTP400: a POST without Mcp-Session-Id whose
// message is not initialize is answered HTTP 400 (the Streamable HTTP
// transport's answer) with a real JSON-RPC code, -32600, and the
// request's id; go-sdk answered HTTP 200 with code 0.
func TestRequestWithoutSessionIsHTTP400(t *testing.T) {
	h := newHarness(t, hconf{})
	for _, body := range []string{
		`{"jsonrpc":"2.0","id":7,"method":"tools/list"}`,
		`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"t__echo","arguments":{}}}`,
	} {
		resp, b := rawPostResp(t, h.url, "", []byte(body))
		var m struct {
			ID    any `json:"id"`
			Error *struct {
				Code int64 `json:"code"`
			} `json:"error"`
		}
		if resp.StatusCode != http.StatusBadRequest || json.Unmarshal(b, &m) != nil || m.Error == nil || m.Error.Code != -32600 || m.ID != float64(7) || !strings.Contains(string(b), "Mcp-Session-Id") {
			t.Errorf("%s: HTTP %d %s; want 400 with JSON-RPC -32600 and id 7", body, resp.StatusCode, b)
		}
	}
	// initialize still opens a session.
	if resp, b := rawPostResp(t, h.url, "", []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)); resp.StatusCode != 200 || resp.Header.Get("Mcp-Session-Id") == "" {
		t.Errorf("initialize: HTTP %d %s", resp.StatusCode, b)
	}
}

// TestAResultOnlyALenientReaderTakesIsRefused: a child's answer that only
// a lenient JSON reader would take (a member repeated, isError or one
// inside the content: readers disagree on which counts) is never
// forwarded, on either front (the line is refused as it is read, and the
// child stopped), though a result from a line the strict decoder took is
// not checked a second time (upstream.WithChecked); a call made after it
// is answered.
func TestAResultOnlyALenientReaderTakesIsRefused(t *testing.T) {
	for _, front := range fronts {
		t.Run(front, func(t *testing.T) {
			h := newHarness(t, hconf{mode: "hostile", env: map[string]string{"CMCP_TEST_SEEN": os.DevNull}, callTimeout: 10 * time.Second})
			cs := h.connectVia(front, nil)
			for _, tool := range []string{"t__twice", "t__twiceok"} {
				res, err := call(t, cs, tool, nil)
				if wireCode(err) != CodeUpstreamFailed || !strings.Contains(err.Error(), `upstream "t"`) {
					t.Fatalf("%s: %v %v (code %d), want %d naming the upstream", tool, res, err, wireCode(err), CodeUpstreamFailed)
				}
			}
			res, err := call(t, cs, "t__echo", map[string]any{"text": "fine"})
			if err != nil || firstText(res) != "fine" {
				t.Fatalf("echo after them: %v %v", res, err)
			}
		})
	}
}
