package gateway

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// TestUnavailableUpstreamIsProbedAgain: a per-session upstream whose
// spawn failed (its measured tree changed) makes /readyz 503 and
// cmcp_upstream_up 0; once the tree is restored, with no agent traffic at
// all, a background probe (a measured child, recorded as the startup
// probe is, with no session, and stopped at once) finds it usable again
// within its backoff: /readyz 200, cmcp_upstream_up 1. While it stays
// unavailable the probes back off (1 s, then doubling), so a broken
// upstream costs a few spawns, not one per scrape.
func TestUnavailableUpstreamIsProbedAgain(t *testing.T) {
	tree := t.TempDir()
	file := filepath.Join(tree, "server.js")
	os.WriteFile(file, []byte("v1\n"), 0o644)
	pin, err := digest.Tree(context.Background(), tree, digest.TreeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m := NewMetrics()
	h := newHarness(t, hconf{measure: tree, measurePin: pin, metrics: m})
	a, err := StartAdmin(AdminConfig{Listen: "127.0.0.1:0", TokenSHA256: digest.Bytes([]byte(testAdminToken))}, nil, h.g, h.w, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Shutdown(context.Background()) })
	f := &adminFixture{h: h, a: a, base: "http://" + a.Addr()}
	state := func() (int, string, float64) {
		code, body := f.do(t, "GET", "/readyz", testAdminToken, "")
		_, text := f.do(t, "GET", "/metrics", testAdminToken, "")
		return code, body, parseExposition(t, text)[`cmcp_upstream_up{upstream="t"}`]
	}
	if code, body, up := state(); code != 200 || up != 1 {
		t.Fatalf("at start: readyz %d %q, cmcp_upstream_up %v", code, body, up)
	}

	os.WriteFile(file, []byte("v2, not the pinned tree\n"), 0o644)
	cs := h.connect("", nil)
	if _, err := call(t, cs, "t__echo", map[string]any{"text": "x"}); wireCode(err) != CodeUpstreamUnavailable {
		t.Fatalf("call with a changed tree: %v", err)
	}
	broken := time.Now()
	if code, body, up := state(); code != 503 || !strings.Contains(body, "measure target") || up != 0 {
		t.Fatalf("after the failed spawn: readyz %d %q, cmcp_upstream_up %v", code, body, up)
	}
	time.Sleep(2500 * time.Millisecond)
	if code, _, _ := state(); code != 503 {
		t.Fatalf("readyz %d while the tree is still changed", code)
	}
	os.WriteFile(file, []byte("v1\n"), 0o644)
	restored := len(h.records())
	// No agent sends anything from here on.
	eventually(t, 15*time.Second, func() string {
		if code, body, up := state(); code != 200 || up != 1 {
			return fmt.Sprintf("readyz %d %q, cmcp_upstream_up %v", code, body, up)
		}
		return ""
	})
	if d := time.Since(broken); d > 10*time.Second {
		t.Errorf("ready again %v after the failure, want within the backoff's first steps", d)
	}

	// The probes: refused while the tree was changed (bounded by the
	// backoff), then one started after the restore, with no session, whose
	// child is stopped.
	rs := h.records()
	refused := 0
	for _, r := range kinds(rs[:restored], "spawn") {
		if r.Body["outcome"] == "refused" && r.Body["session"] == nil {
			refused++
		}
	}
	if refused < 1 || refused > 3 {
		t.Errorf("%d probes refused in the 2.5 s the tree was changed, want 1 to 3", refused)
	}
	var pid int
	for _, r := range kinds(rs[restored:], "spawn") {
		if r.Body["outcome"] == "started" && r.Body["session"] == nil {
			pid, _ = strconv.Atoi(fmt.Sprint(r.Body["pid"]))
		}
	}
	if pid == 0 {
		t.Fatalf("no probe spawn recorded after the restore")
	}
	eventually(t, 10*time.Second, func() string {
		if pidAlive(pid) {
			return fmt.Sprintf("the probe's child %d still runs", pid)
		}
		return ""
	})
	// And the agent's next call works.
	if _, err := call(t, cs, "t__echo", map[string]any{"text": "x"}); err != nil {
		t.Fatalf("call after the restore: %v", err)
	}
}
