package gateway

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestReloadTokensOnTheHTTPFront: in process, a session whose token is
// moved to another identity is ended (its next request fails), and a
// reload on a gateway that started without authentication (development
// mode) applies no tokens and says a restart is needed.
func TestReloadTokensOnTheHTTPFront(t *testing.T) {
	const tokA, tokB = "token-a-0123456789abcdef", "token-b-0123456789abcdef"
	initial := []Token{{Digest: TokenDigest(tokA), Identity: "alice"}}
	ts := NewTokenSet(initial)
	h := newHarness(t, hconf{tokens: initial, tokenSet: ts})
	cs := h.connect(tokA, nil)
	if _, err := call(t, cs, "t__echo", map[string]any{"text": "x"}); err != nil {
		t.Fatal(err)
	}
	rt := &ReloadTargets{Tokens: ts}
	next := ReloadedTokens{Agents: []Token{{Identity: "mallory", Digest: TokenDigest(tokA)}, {Identity: "alice", Digest: TokenDigest(tokB)}}}
	var restart []string
	if err := h.g.ReloadTokens(context.Background(), next, rt, &restart); err != nil || len(restart) != 0 {
		t.Fatalf("reload: %v %v", err, restart)
	}
	if _, err := call(t, cs, "t__echo", map[string]any{"text": "x"}); err == nil {
		t.Fatal("a session whose token now maps to another identity still answers")
	}
	for stop := time.Now().Add(3 * time.Second); len(h.g.sessionList()) != 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(stop) {
			t.Fatal("the session whose token moved to another identity was not ended")
		}
	}
	if _, err := call(t, h.connect(tokB, nil), "t__echo", map[string]any{"text": "x"}); err != nil {
		t.Fatalf("the identity's new token: %v", err)
	}

	// Started without authentication: tokens are not applied.
	open := NewTokenSet(nil)
	rt = &ReloadTargets{Tokens: open, Open: true}
	if err := h.g.ReloadTokens(context.Background(), next, rt, &restart); err != nil {
		t.Fatal(err)
	}
	if len(open.Load()) != 0 || len(restart) != 1 || !strings.Contains(restart[0], "server.tokens") {
		t.Fatalf("development mode: tokens %v, restart %v", open.Load(), restart)
	}
}

// TestRotatedTokenEndsItsSessions: alice rotates her token (B added, then
// A withdrawn on SIGHUP while she keeps B). The session opened with A is
// ended, so the GET stream it opened before the reload stops delivering
// the session's messages (list_changed here); the session opened with B
// goes on receiving them.
func TestRotatedTokenEndsItsSessions(t *testing.T) {
	const tokA, tokB = "token-a-0123456789abcdef", "token-b-0123456789abcdef"
	initial := []Token{{Digest: TokenDigest(tokA), Identity: "alice"}, {Digest: TokenDigest(tokB), Identity: "alice"}}
	ts := NewTokenSet(initial)
	h := newHarness(t, hconf{tokens: initial, tokenSet: ts})
	gotA, gotB := make(chan struct{}, 10), make(chan struct{}, 10)
	csA := h.connect(tokA, &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { gotA <- struct{}{} }})
	csB := h.connect(tokB, &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { gotB <- struct{}{} }})
	for _, cs := range []*mcp.ClientSession{csA, csB} {
		if _, err := call(t, cs, "t__echo", map[string]any{"text": "x"}); err != nil {
			t.Fatal(err)
		}
	}
	// Both GET streams deliver before the rotation.
	deadline := time.After(5 * time.Second)
	for a, b := false, false; !a || !b; {
		for _, s := range h.g.sessionList() {
			s.notifyToolsChanged()
		}
		select {
		case <-gotA:
			a = true
		case <-gotB:
			b = true
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			t.Fatalf("no list_changed before the rotation (A %v, B %v)", a, b)
		}
	}

	rt := &ReloadTargets{Tokens: ts}
	next := ReloadedTokens{Agents: []Token{{Identity: "alice", Digest: TokenDigest(tokB)}}}
	var restart []string
	if err := h.g.ReloadTokens(context.Background(), next, rt, &restart); err != nil || len(restart) != 0 {
		t.Fatalf("reload: %v %v", err, restart)
	}
	for stop := time.Now().Add(3 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		ss := h.g.sessionList()
		if len(ss) == 1 && ss[0].http.token.Equal(TokenDigest(tokB)) {
			break
		}
		if time.Now().After(stop) {
			t.Fatalf("after the rotation %d sessions are alive; want only the one opened with the new token", len(ss))
		}
	}
	// A list_changed sent to A before the rotation may still be on its
	// way: wait until A's connection has ended (its GET stream closed by
	// the gateway, delivered up to its end) before draining, so what A
	// receives below can only be a message sent after the rotation.
	ended := make(chan struct{})
	go func() { csA.Wait(); close(ended) }()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the session opened with the withdrawn token: its connection did not end after the rotation")
	}
	for len(gotA) > 0 {
		<-gotA
	}
	for len(gotB) > 0 {
		<-gotB
	}
	for _, s := range h.g.sessionList() {
		s.notifyToolsChanged()
	}
	select {
	case <-gotB:
	case <-time.After(3 * time.Second):
		t.Fatal("the session opened with the token still in force no longer receives its messages")
	}
	select {
	case <-gotA:
		t.Fatal("the withdrawn token's GET stream still receives messages after the rotation")
	case <-time.After(500 * time.Millisecond):
	}
	if _, err := call(t, csB, "t__echo", map[string]any{"text": "x"}); err != nil {
		t.Fatalf("the session opened with the token still in force: %v", err)
	}
}
