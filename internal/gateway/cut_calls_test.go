package gateway

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

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
			next := ReloadedTokens{Agents: []Token{{Identity: "bob", Digest: TokenDigest("token-bob-0123456789abcdef")}}}
			var restart []string
			if err := h.g.ReloadTokens(context.Background(), next, &ReloadTargets{Tokens: ts}, &restart); err != nil {
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
