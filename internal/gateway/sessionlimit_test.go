package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/confidential-mcp/cmcp/internal/config"
)

// initAs sends an initialize with token and no session, as a new agent
// session's first request, and returns the answer and the session id.
func (h *harness) initAs(token string) (resp *http.Response, body, sid string) {
	h.t.Helper()
	req, _ := http.NewRequest("POST", h.url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b), resp.Header.Get("Mcp-Session-Id")
}

// deleteSession ends a session the way an agent does: DELETE with its id.
func (h *harness) deleteSession(token, sid string) {
	h.t.Helper()
	req, _ := http.NewRequest("DELETE", h.url, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Mcp-Session-Id", sid)
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		h.t.Fatalf("DELETE session: %s", resp.Status)
	}
}

// refusedSession checks that an answer is a session bound's refusal:
// status, a JSON-RPC error with CodeTooManySessions, and a message naming
// the setting and what to do.
func refusedSession(t *testing.T, resp *http.Response, body string, status int, says ...string) {
	t.Helper()
	var m struct {
		ID    any `json:"id"`
		Error struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if resp.StatusCode != status || json.Unmarshal([]byte(body), &m) != nil || m.Error.Code != CodeTooManySessions || resp.Header.Get("Mcp-Session-Id") != "" {
		t.Fatalf("answer %s %s; want %d with a JSON-RPC error %d and no session", resp.Status, clip(body, 300), status, CodeTooManySessions)
	}
	for _, s := range says {
		if !strings.Contains(m.Error.Message, s) {
			t.Fatalf("message %q does not say %q", m.Error.Message, s)
		}
	}
}

// TestSessionBounds: an agent past server.max_sessions_per_agent gets 429,
// anyone past server.max_sessions 503, each with a JSON-RPC error saying
// what to do, logged and counted; the sessions already open go on, a
// request that opens no session takes no place, a stdio session is not
// counted, and ending a session (DELETE) frees its place. Before, one
// agent could open sessions, each with its children, until the gateway ran
// out of file descriptors and other agents' calls failed.
func TestSessionBounds(t *testing.T) {
	const alice, bob, carol = "alice-token-0123456789", "bob-token-0123456789", "carol-token-0123456789"
	m := NewMetrics()
	h := newHarness(t, hconf{metrics: m, maxSessions: 4, maxPerAgent: 2, tokens: []Token{
		{Digest: TokenDigest(alice), Identity: "alice"}, {Digest: TokenDigest(bob), Identity: "bob"}, {Digest: TokenDigest(carol), Identity: "carol"}}})

	// Requests that open no session give their place back.
	for range 5 {
		req, _ := http.NewRequest("POST", h.url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Authorization", "Bearer "+carol)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	a1 := h.connect(alice, nil)
	h.connect(alice, nil)
	resp, body, _ := h.initAs(alice)
	refusedSession(t, resp, body, http.StatusTooManyRequests, `agent "alice" already has as many open sessions as server.max_sessions_per_agent allows (2)`, "DELETE", "server.session_timeout")

	// Another agent still gets its own, up to the gateway's bound.
	h.connect(bob, nil)
	_, _, bobSID := h.initAs(bob)
	if bobSID == "" {
		t.Fatal("bob could not open a session while alice was at her bound")
	}
	resp, body, _ = h.initAs(carol)
	refusedSession(t, resp, body, http.StatusServiceUnavailable, "the gateway already has as many open sessions as server.max_sessions allows (4)")

	// The open sessions go on; a stdio session is not counted.
	if _, err := call(t, a1, "t__echo", map[string]any{"text": "still served"}); err != nil {
		t.Fatalf("an open session at the bound: %v", err)
	}
	if _, err := call(t, h.connectVia("stdio", nil), "t__echo", map[string]any{"text": "stdio"}); err != nil {
		t.Fatalf("a stdio session with the HTTP front full: %v", err)
	}

	// Ending sessions frees their places: a go-sdk client's Close and a
	// raw DELETE both send DELETE.
	a1.Close()
	h.deleteSession(bob, bobSID)
	for who, tok := range map[string]string{"alice": alice, "carol": carol} {
		eventually(t, 5*time.Second, func() string { // the place is given back once the session has ended
			if resp, body, sid := h.initAs(tok); sid == "" {
				return who + " after a session ended: " + resp.Status + " " + clip(body, 200)
			}
			return ""
		})
	}

	var text bytes.Buffer
	m.WriteText(&text)
	s := parseExposition(t, text.String())
	if s[`cmcp_sessions_refused_total{limit="per_agent"}`] < 1 || s[`cmcp_sessions_refused_total{limit="total"}`] < 1 {
		t.Fatalf("refused sessions in the metrics: per_agent %v, total %v; want each counted", s[`cmcp_sessions_refused_total{limit="per_agent"}`], s[`cmcp_sessions_refused_total{limit="total"}`])
	}
	if logs := h.logs.String(); !strings.Contains(logs, "refused a new session: per_agent session bound reached") || !strings.Contains(logs, "agent=alice") {
		t.Fatalf("the refusal is not logged:\n%s", clip(logs, 3000))
	}
}

// TestSessionBoundInheritedNamesMaxSessions: with only server.max_sessions
// set (below the default per agent), the bound per agent is inherited from
// it, so the refusal tells the operator to raise server.max_sessions:
// raising server.max_sessions_per_agent alone past it is refused at load.
func TestSessionBoundInheritedNamesMaxSessions(t *testing.T) {
	const tok = "alice-token-0123456789"
	h := newHarness(t, hconf{maxSessions: 2, tokens: []Token{{Digest: TokenDigest(tok), Identity: "alice"}}})
	for range 2 {
		if _, _, sid := h.initAs(tok); sid == "" {
			t.Fatal("no session")
		}
	}
	resp, body, _ := h.initAs(tok)
	refusedSession(t, resp, body, http.StatusTooManyRequests, `agent "alice" already has as many open sessions as server.max_sessions allows (2;`,
		"server.max_sessions_per_agent is unset", "raise server.max_sessions")
	if strings.Contains(body, "raise server.max_sessions_per_agent") {
		t.Fatalf("the refusal tells the operator to raise the bound per agent, which is inherited from server.max_sessions: %s", body)
	}
}

// TestSessionBoundAtDefaultNamesMaxSessionsPerAgent: with only
// server.max_sessions set, at or above the default bound per agent (64),
// the bound per agent is that default, not inherited: raising
// server.max_sessions does not raise it, so the refusal must not tell the
// operator to (it did at max_sessions: 64, where the two are equal).
func TestSessionBoundAtDefaultNamesMaxSessionsPerAgent(t *testing.T) {
	const tok = "alice-token-0123456789"
	if _, per := (&config.Server{MaxSessions: 2 * config.DefaultMaxSessionsPerAgent}).SessionBounds(); per != config.DefaultMaxSessionsPerAgent {
		t.Fatalf("raising server.max_sessions raises the bound per agent to %d: the refusal below would be wrong to name it", per)
	}
	h := newHarness(t, hconf{maxSessions: config.DefaultMaxSessionsPerAgent, tokens: []Token{{Digest: TokenDigest(tok), Identity: "alice"}}})
	for range config.DefaultMaxSessionsPerAgent {
		if _, _, sid := h.initAs(tok); sid == "" {
			t.Fatal("no session")
		}
	}
	resp, body, _ := h.initAs(tok)
	refusedSession(t, resp, body, http.StatusTooManyRequests, `agent "alice" already has as many open sessions as server.max_sessions_per_agent allows (64`,
		"raise server.max_sessions_per_agent")
	if strings.Contains(body, "raise server.max_sessions ") || strings.Contains(body, "raise server.max_sessions\"") || strings.Contains(body, "one agent may hold them all") {
		t.Fatalf("the refusal tells the operator to raise server.max_sessions, which leaves the bound per agent at its default: %s", body)
	}
}

// TestSessionBoundsFreedWhenSessionsEnd: a session ended by the idle
// timeout, or by a SIGHUP that withdrew the token it was opened with,
// gives its place back.
func TestSessionBoundsFreedWhenSessionsEnd(t *testing.T) {
	t.Run("idle timeout", func(t *testing.T) {
		const tok = "alice-token-0123456789"
		h := newHarness(t, hconf{maxPerAgent: 1, idle: 300 * time.Millisecond, tokens: []Token{{Digest: TokenDigest(tok), Identity: "alice"}}})
		if _, _, sid := h.initAs(tok); sid == "" {
			t.Fatal("no session")
		}
		resp, body, _ := h.initAs(tok)
		refusedSession(t, resp, body, http.StatusTooManyRequests, "idle ones end after 300ms")
		eventually(t, 5*time.Second, func() string {
			if _, _, sid := h.initAs(tok); sid == "" {
				return "no place after the idle session ended"
			}
			return ""
		})
	})
	t.Run("token withdrawn", func(t *testing.T) {
		const old, next = "alice-old-0123456789", "alice-new-0123456789"
		initial := []Token{{Digest: TokenDigest(old), Identity: "alice"}}
		ts := NewTokenSet(initial)
		h := newHarness(t, hconf{maxPerAgent: 1, tokens: initial, tokenSet: ts})
		if _, _, sid := h.initAs(old); sid == "" {
			t.Fatal("no session")
		}
		rotated := ReloadedTokens{Agents: []Token{{Identity: "alice", Digest: TokenDigest(next)}}}
		var restart []string
		if err := h.g.ReloadTokens(context.Background(), rotated, &ReloadTargets{Tokens: ts}, &restart); err != nil {
			t.Fatal(err)
		}
		eventually(t, 5*time.Second, func() string {
			if resp, body, sid := h.initAs(next); sid == "" {
				return "no place after the rotation ended alice's session: " + resp.Status + " " + clip(body, 200)
			}
			return ""
		})
	})
}
