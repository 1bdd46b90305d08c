package gateway

import (
	"bufio"
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// rawExchange opens an initialised session with h over front without an
// SDK client, sends one request line whose id is `"x"` and returns every
// message the agent receives up to and including its response.
func rawExchange(t *testing.T, h *harness, front, line string) []string {
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
		io.WriteString(inW, initReq+"\n")
		if !replies.Scan() {
			t.Fatal("no answer to initialize")
		}
		io.WriteString(inW, initialized+"\n"+line+"\n")
		var got []string
		for replies.Scan() {
			got = append(got, replies.Text())
			if strings.Contains(replies.Text(), `"id":"x"`) {
				return got
			}
		}
		t.Fatalf("no response to %q; got %q", line, got)
	}
	resp, _ := rawPostResp(t, h.url, "", []byte(initReq))
	sid := resp.Header.Get("Mcp-Session-Id")
	rawPostResp(t, h.url, sid, []byte(initialized))
	resp, b := rawPostResp(t, h.url, sid, []byte(line))
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		return []string{string(b)}
	}
	var got []string
	for _, l := range strings.Split(string(b), "\n") {
		if d, ok := strings.CutPrefix(l, "data: "); ok {
			got = append(got, d)
		}
	}
	return got
}

// TestCallMetaReachesTheUpstreamAsSent: the _meta of an agent's tools/call
// reaches the upstream byte for byte (a number a float64 cannot hold,
// member order, "<>&" unescaped, 1.0 and 2e0 as spelled) with only the
// progress token replaced by the gateway's own, and the agent's progress
// notifications carry its token as it sent it (9007199254740993, which a
// float64 reads as 9007199254740992), through both fronts to both kinds of
// upstream.
func TestCallMetaReachesTheUpstreamAsSent(t *testing.T) {
	const before, after = `{"z":1,"big":12345678901234567890,"progressToken":`, `,"html":"<b>&","a":[1.0,2e0]}`
	const agentTok = `9007199254740993`
	sent := regexp.MustCompile(`"_meta":` + regexp.QuoteMeta(before) + `"cmcp-[0-9]+"` + regexp.QuoteMeta(after) + `,"name":"progress"`)
	for _, up := range []string{"stdio", "http"} {
		for _, front := range fronts {
			t.Run(up+"-upstream/"+front, func(t *testing.T) {
				seen := filepath.Join(t.TempDir(), "seen")
				bodies := &lockedWriter{}
				h := newHarness(t, hconf{mode: "teestdin", env: map[string]string{"CMCP_TEST_SEEN": seen}, http: up == "http", upstreamBodies: bodies})
				got := rawExchange(t, h, front, `{"jsonrpc":"2.0","id":"x","method":"tools/call","params":{"_meta":`+before+agentTok+after+`,"name":"t__progress","arguments":{}}}`)
				if last := got[len(got)-1]; !strings.Contains(last, `"result"`) || !strings.Contains(last, "progressed") {
					t.Fatalf("response: %s", last)
				}
				if n := h.g.fastPath.Load(); n != 1 {
					t.Errorf("%d calls took the fast path, want 1", n)
				}
				progress := 0
				for _, m := range got {
					if strings.Contains(m, `"notifications/progress"`) {
						progress++
						if !strings.Contains(m, `"progressToken":`+agentTok+`,`) && !strings.Contains(m, `"progressToken":`+agentTok+`}`) {
							t.Errorf("the agent's progress token %s came back as: %s", agentTok, m)
						}
					}
				}
				if progress != 3 {
					t.Errorf("%d progress notifications, want 3: %q", progress, got)
				}
				upstreamGot := bodies.String()
				if up == "stdio" {
					b, _ := os.ReadFile(seen)
					upstreamGot = string(b)
				}
				if !sent.MatchString(upstreamGot) {
					for _, l := range strings.Split(upstreamGot, "\n") {
						if strings.Contains(l, `"tools/call"`) {
							t.Errorf("the upstream got: %s", l)
						}
					}
					t.Errorf("the agent's _meta did not reach the upstream as sent (%s<token>%s)", before, after)
				}
			})
		}
	}
}
