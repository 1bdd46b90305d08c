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
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/config"
)

// postCall POSTs one JSON-RPC request to an HTTP session and returns the
// JSON-RPC message answering it (the response body, or the SSE event that
// carries the response); err when the connection gave no HTTP response.
func postCall(url, sid, token, body string) (status int, answer string, err error) {
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", sid)
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, string(b), err
	}
	answer = string(bytes.TrimSpace(b))
	for _, l := range strings.Split(string(b), "\n") {
		if d, ok := strings.CutPrefix(l, "data: "); ok && strings.Contains(d, `"id":`) {
			answer = d
		}
	}
	return resp.StatusCode, answer, nil
}

// answerCode is the JSON-RPC error code of an answer (0: none).
func answerCode(answer string) int64 {
	var m struct {
		Error *struct {
			Code int64 `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal([]byte(answer), &m) != nil || m.Error == nil {
		return 0
	}
	return m.Error.Code
}

// callPaths are the two ways an HTTP tools/call is answered: by the fast
// path, or by go-sdk (a _meta member name with an escape, which the fast
// path leaves to go-sdk), as the params' leading members.
var callPaths = []struct{ name, meta string }{
	{"fast", ""},
	{"go-sdk", `"_meta":{"x\u0041":1},`},
}

// waitForwarded waits until the audit log in dir holds n forwarded call
// records of tool.
func waitForwarded(t *testing.T, dir, tool string, n int) {
	t.Helper()
	eventually(t, 20*time.Second, func() string {
		got := 0
		for _, r := range kinds(readRecords(t, dir), "call") {
			if r.Body["tool"] == tool && r.Body["outcome"] == "forwarded" {
				got++
			}
		}
		if got < n {
			return fmt.Sprintf("%d of %d calls forwarded", got, n)
		}
		return ""
	})
}

// checkCutResult checks the n result records in dir: each call was cut by
// the gateway, answered with code, for a reason naming why.
func checkCutResult(t *testing.T, dir string, n int, code int64, why string) {
	t.Helper()
	results := kinds(readRecords(t, dir), "result")
	if len(results) != n {
		t.Fatalf("%d result records, want %d: %v", len(results), n, results)
	}
	for _, r := range results {
		b := r.Body
		reason := fmt.Sprint(b["reason"])
		if b["outcome"] != "cancelled" || b["error_code"] != fmt.Sprint(code) || !strings.Contains(reason, "the gateway cut the call") ||
			!strings.Contains(reason, why) || strings.Contains(reason, "the agent cancelled") {
			t.Errorf("a cut call's result record: %v", b)
		}
	}
}

// TestCallCutByTheShutdownIsAnswered: a call still running when the drain
// ends (shutdown_grace after SIGTERM, or the signal to `serve --stdio`) is
// cancelled upstream and answered -32068 on its own request before the
// connection closes, on both fronts, one shutdown_grace after the signal
// (not two); its result record says the gateway's shutdown cut it, not
// that the agent cancelled it; and the gateway exits 0 on both fronts,
// warning of the cut call, with a sealed log that verifies.
func TestCallCutByTheShutdownIsAnswered(t *testing.T) {
	const grace = 2 * time.Second
	t.Run("http-SIGTERM", func(t *testing.T) {
		exe, pin := selfDigest(t)
		dir := t.TempDir()
		cfgPath := filepath.Join(dir, "cmcp.yaml")
		os.WriteFile(cfgPath, []byte(fmt.Sprintf(`version: 1
server: {listen: %s, tee: software, shutdown_grace: %s}
audit: {dir: audit}
upstreams:
  - name: t
    stdio: {command: %s, env: {%s: server}}
    pin: {command: %s}
`, freePort(t), grace, exe, childEnv, pin)), 0o600)
		cmd, endpoint, stderr := startGatewayProcess(t, cfgPath)
		cs, err := connectWith(endpoint, "")
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		type answer struct {
			status int
			body   string
			err    error
			at     time.Time
		}
		// One call the fast path answers, one go-sdk answers (its _meta
		// has a member name with an escape).
		got := make(chan answer, 2)
		for _, p := range callPaths {
			go func() {
				st, b, err := postCall(endpoint, cs.ID(), "", `{"jsonrpc":"2.0","id":"`+p.name+`","method":"tools/call","params":{"name":"t__sleep",`+p.meta+`"arguments":{"text":"10s"}}}`)
				got <- answer{st, b, err, time.Now()}
			}()
		}
		audit := filepath.Join(dir, "audit")
		waitForwarded(t, audit, "t__sleep", 2)
		sent := time.Now()
		cmd.Process.Signal(syscall.SIGTERM)
		for range callPaths {
			a := <-got
			if a.err != nil || a.status != http.StatusOK || answerCode(a.body) != CodeShuttingDown || !strings.Contains(a.body, "server.shutdown_grace") {
				t.Errorf("a cut call got %d %q (%v), want a JSON-RPC error %d", a.status, a.body, a.err, CodeShuttingDown)
			}
			if d := a.at.Sub(sent); d > grace+1500*time.Millisecond {
				t.Errorf("a cut call was answered %v after SIGTERM: the drain lasts one shutdown_grace (%v)", d, grace)
			}
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("gateway exit: %v\n%s", err, stderr.String())
		}
		if !strings.Contains(stderr.String(), "cutting them") {
			t.Errorf("no warning of the cut call:\n%s", stderr.String())
		}
		checkCutResult(t, audit, 2, CodeShuttingDown, "gateway shutdown")
		checkStoppedLog(t, audit, stderr.String())
	})
	t.Run("stdio-signal", func(t *testing.T) {
		st := serveStdio(t, fmt.Sprintf("  shutdown_grace: %s\n", grace))
		type answer struct {
			err error
			at  time.Time
		}
		got := make(chan answer, 1)
		go func() {
			_, err := st.cs.CallTool(st.ctx, &mcp.CallToolParams{Name: "t__sleep", Arguments: map[string]any{"text": "10s"}})
			got <- answer{err, time.Now()}
		}()
		audit := filepath.Join(st.dir, "audit")
		waitForwarded(t, audit, "t__sleep", 1)
		sent := time.Now()
		st.signal()
		var a answer
		select {
		case a = <-got:
		case <-time.After(15 * time.Second):
			t.Fatalf("the cut call was never answered\n%s", st.logs.String())
		}
		if wireCode(a.err) != CodeShuttingDown || !strings.Contains(a.err.Error(), "server.shutdown_grace") {
			t.Fatalf("the cut call got %v, want %d", a.err, CodeShuttingDown)
		}
		if d := a.at.Sub(sent); d > grace+1500*time.Millisecond {
			t.Errorf("the cut call was answered %v after the signal: the drain lasts one shutdown_grace (%v)", d, grace)
		}
		st.wait(t) // Serve returns nil: exit 0, as over HTTP
		if !strings.Contains(st.logs.String(), "cutting them") {
			t.Errorf("no warning of the cut call:\n%s", st.logs.String())
		}
		checkCutResult(t, audit, 1, CodeShuttingDown, "gateway shutdown")
		checkStoppedLog(t, audit, st.logs.String())
	})
}

// TestCallCutByItsSessionEndIsAnswered: a call still running when its HTTP
// session ends for another reason than the shutdown (the agent's DELETE,
// its token withdrawn by SIGHUP) is cancelled upstream and answered -32071
// naming the reason on its own request; its result record and the
// session's end record say why, not that the agent cancelled it.
func TestCallCutByItsSessionEndIsAnswered(t *testing.T) {
	const tok = "token-cut-0123456789abcdef"
	cases := []struct {
		name string
		end  func(t *testing.T, h *harness, ts *TokenSet, sid string)
		why  string
	}{
		{"DELETE", func(t *testing.T, h *harness, _ *TokenSet, sid string) {
			req, _ := http.NewRequest("DELETE", h.url, nil)
			req.Header.Set("Mcp-Session-Id", sid)
			req.Header.Set("Authorization", "Bearer "+tok)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}, "HTTP DELETE"},
		{"token withdrawn", func(t *testing.T, h *harness, ts *TokenSet, _ string) {
			// SIGHUP re-reads server.tokens without alice's.
			started, _ := config.LoadBytes("cmcp.yaml", []byte("version: 1\n"))
			next := &config.Config{Server: &config.Server{Tokens: []config.Token{{Identity: "bob", SHA256: TokenDigest("token-bob-0123456789abcdef")}}}}
			var restart []string
			if err := h.g.reloadTokens(context.Background(), next, &reloadTargets{started: started, tokens: ts}, &restart); err != nil {
				t.Fatal(err)
			}
		}, "no longer has a bearer token"},
	}
	for _, tc := range cases {
		for _, p := range callPaths {
			t.Run(tc.name+"/"+p.name, func(t *testing.T) {
				initial := []Token{{Digest: TokenDigest(tok), Identity: "alice"}}
				ts := NewTokenSet(initial)
				h := newHarness(t, hconf{tokens: initial, tokenSet: ts})
				cs := h.connect(tok, nil)
				type answer struct {
					status int
					body   string
					err    error
				}
				got := make(chan answer, 1)
				go func() {
					st, b, err := postCall(h.url, cs.ID(), tok, `{"jsonrpc":"2.0","id":"c1","method":"tools/call","params":{"name":"t__sleep",`+p.meta+`"arguments":{"text":"10s"}}}`)
					got <- answer{st, b, err}
				}()
				waitForwarded(t, h.dir, "t__sleep", 1)
				tc.end(t, h, ts, cs.ID())
				var a answer
				select {
				case a = <-got:
				case <-time.After(8 * time.Second):
					t.Fatal("the cut call was not answered")
				}
				if a.err != nil || a.status != http.StatusOK || answerCode(a.body) != CodeSessionEnded || !strings.Contains(a.body, tc.why) || !strings.Contains(a.body, `"id":"c1"`) {
					t.Fatalf("the cut call got %d %q (%v), want a JSON-RPC error %d naming %q", a.status, a.body, a.err, CodeSessionEnded, tc.why)
				}
				eventually(t, 10*time.Second, func() string {
					for _, r := range kinds(h.records(), "session") {
						if r.Body["event"] == "end" {
							if !strings.Contains(fmt.Sprint(r.Body["reason"]), tc.why) {
								return fmt.Sprintf("session end record %v", r.Body)
							}
							return ""
						}
					}
					return "no session end record"
				})
				h.g.results.Wait()
				checkCutResult(t, h.dir, 1, CodeSessionEnded, tc.why)
			})
		}
	}
}
