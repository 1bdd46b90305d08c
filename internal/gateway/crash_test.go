package gateway

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestCallDuringShutdownRefused: once the gateway is shutting down, a new
// tools/call is refused with -32068 and recorded as refused, while the call
// already in flight is drained and answered.
func TestCallDuringShutdownRefused(t *testing.T) {
	h := newHarness(t, hconf{})
	cs := h.connect("", nil)
	if _, err := call(t, cs, "t__echo", map[string]any{"text": "warm"}); err != nil {
		t.Fatal(err)
	}
	inflight := make(chan error, 1)
	go func() {
		_, err := call(t, cs, "t__sleep", map[string]any{"text": "1s"})
		inflight <- err
	}()
	eventually(t, 10*time.Second, func() string {
		if len(kinds(h.records(), "call")) < 2 {
			return "the sleeping call is not recorded yet"
		}
		return ""
	})
	shut := make(chan error, 1)
	go func() { shut <- h.g.Shutdown(context.Background()) }()
	eventually(t, 10*time.Second, func() string {
		if !h.g.closing.Load() {
			return "the gateway is not shutting down yet"
		}
		return ""
	})
	_, err := call(t, cs, "t__echo", map[string]any{"text": "late"})
	if wireCode(err) != CodeShuttingDown || !strings.Contains(err.Error(), "reconnect and retry") {
		t.Fatalf("a call during shutdown: %v, want %d", err, CodeShuttingDown)
	}
	if err := <-inflight; err != nil {
		t.Fatalf("the in-flight call was not drained: %v", err)
	}
	if err := <-shut; err != nil {
		t.Fatal(err)
	}
	calls := kinds(h.records(), "call")
	last := calls[len(calls)-1]
	if len(calls) != 3 || last.Body["outcome"] != "refused" || !strings.Contains(fmt.Sprint(last.Body["reason"]), "shutting down") {
		t.Fatalf("call records: %v", calls)
	}
}

// TestUpstreamThatNeverListsToolsIsBounded: a child that completes the
// handshake but never answers tools/list fails the call within
// connect_timeout, and the agent's own deadline is honoured, instead of
// the call (and every later one) waiting for ever.
func TestUpstreamThatNeverListsToolsIsBounded(t *testing.T) {
	mark := filepath.Join(t.TempDir(), "mark")
	h := newHarness(t, hconf{mode: "listhang", env: map[string]string{"CMCP_TEST_MARK": mark}, callTimeout: time.Second, connTimeout: 2 * time.Second})
	cs := h.connect("", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "t__echo", Arguments: map[string]any{"text": "x"}})
	if took := time.Since(start); wireCode(err) != CodeUpstreamUnavailable || !strings.Contains(err.Error(), "tools/list") || took > 10*time.Second {
		t.Fatalf("after %v: %v, want %d naming tools/list within the 2 s connect_timeout", took, err, CodeUpstreamUnavailable)
	}
	// An agent with a shorter deadline than the start is not held past it.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel2()
	start = time.Now()
	if _, err := cs.CallTool(ctx2, &mcp.CallToolParams{Name: "t__echo", Arguments: map[string]any{"text": "y"}}); err == nil || time.Since(start) > 5*time.Second {
		t.Fatalf("the agent's 500 ms deadline: %v after %v", err, time.Since(start))
	}
}

// TestHungPromptIsBounded: a forwarded request other than tools/call
// (here prompts/get to a child that never answers) ends at call_timeout
// with -32066, and does not hold up the gateway's shutdown.
func TestHungPromptIsBounded(t *testing.T) {
	h := newHarness(t, hconf{callTimeout: time.Second})
	cs := h.connect("", nil)
	start := time.Now()
	_, err := cs.GetPrompt(context.Background(), &mcp.GetPromptParams{Name: "t__stuck"})
	if took := time.Since(start); wireCode(err) != CodeUpstreamTimeout || took > 10*time.Second {
		t.Fatalf("after %v: %v, want %d", took, err, CodeUpstreamTimeout)
	}
	go cs.GetPrompt(context.Background(), &mcp.GetPromptParams{Name: "t__stuck"})
	time.Sleep(200 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- h.g.Shutdown(ctx) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown (grace 2 s) still running after 10 s: a hung prompts/get held up the session's end")
	}
}
