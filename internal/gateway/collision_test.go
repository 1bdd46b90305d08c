package gateway

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/spawnaudit"
	"github.com/confidential-mcp/cmcp/internal/upstream"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// twoUpstreams is a gateway with per-session upstreams "a" and "a_" (the
// "named" child), whose tools "_b" and "b" are both exposed as "a___b".
// "a" does not start until the file mark exists.
func twoUpstreams(t *testing.T, mark string) *harness {
	t.Helper()
	exe, pin := selfDigest(t)
	dir := t.TempDir()
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	w, err := auditlog.Open(filepath.Join(dir, "audit"), auditlog.Options{Key: key, Durability: record.DurabilityGroup, Gateway: record.GatewayInfo{Version: "test"}})
	if err != nil {
		t.Fatal(err)
	}
	logs := &lockedWriter{}
	logger := slog.New(slog.NewTextHandler(logs, nil))
	mk := func(name, tools string, env map[string]string) UpstreamOptions {
		env[childEnv], env["CMCP_TEST_TOOLS"], env["CMCP_TEST_ID"] = "named", tools, name
		spec := upstream.StdioSpec{Name: name, Command: exe, Pin: pin, Env: env}
		return UpstreamOptions{Upstream: &upstream.Stdio{Spec: spec, Environ: os.Environ(), Hooks: spawnaudit.Hooks(w, logger, nil), Share: "per-session"},
			Namespaced: true, Class: upstream.ClassSpawnMeasured}
	}
	g, err := New(Options{Version: "test", Log: w, Logger: logger, Upstreams: []UpstreamOptions{
		mk("a", "_b,other", map[string]string{"CMCP_TEST_MARK": mark}), mk("a_", "b", map[string]string{})}})
	if err != nil {
		t.Fatal(err)
	}
	g.Start(context.Background())
	mux := http.NewServeMux()
	mux.Handle("/mcp", g.HTTPHandler(HTTPOptions{MaxRequestBytes: 1 << 20}))
	srv := httptest.NewServer(mux)
	h := &harness{t: t, dir: filepath.Join(dir, "audit"), w: w, g: g, srv: srv, url: srv.URL + "/mcp", logs: logs}
	t.Cleanup(func() {
		srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		g.Shutdown(ctx)
		w.Close()
		if t.Failed() {
			t.Logf("gateway log:\n%s", clip(logs.String(), 4000))
		}
	})
	return h
}

// TestCollidingNameIsNotTakenOver: upstream "a" is down at start, so the
// agent is shown upstream a_'s tool "b" as "a___b" and uses it. When "a"
// comes up, its tool "_b" maps to the same name: the name is withdrawn for
// both (the agent is sent list_changed, the call is refused as unknown,
// both tools are recorded as refused) instead of passing to "a" under the
// agent, and a's tool never runs under it.
func TestCollidingNameIsNotTakenOver(t *testing.T) {
	mark := filepath.Join(t.TempDir(), "a-may-start")
	h := twoUpstreams(t, mark)
	var changed atomic.Int32
	cs := h.connect("", &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed.Add(1) }})
	listed := func() map[string]string {
		lt, err := cs.ListTools(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]string{}
		for _, tl := range lt.Tools {
			m[tl.Name] = tl.Description
		}
		return m
	}
	if d := listed()["a___b"]; d != "tool b of a_" {
		t.Fatalf("with a down, a___b is listed as %q, want a_'s tool b", d)
	}
	if r, err := call(t, cs, "a___b", nil); err != nil || firstText(r) != "answered by upstream a_ tool b" {
		t.Fatalf("with a down, a___b -> %q, %v", firstText(r), err)
	}
	if err := os.WriteFile(mark, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if r, err := call(t, cs, "a__other", nil); err != nil || firstText(r) != "answered by upstream a tool other" { // brings "a" up
		t.Fatalf("a__other -> %q, %v", firstText(r), err)
	}
	eventually(t, 5*time.Second, func() string {
		if changed.Load() == 0 {
			return "the agent was not sent tools/list_changed when a___b was withdrawn"
		}
		return ""
	})
	if d, ok := listed()["a___b"]; ok {
		t.Fatalf("a___b is still listed (as %q) although two upstreams' tools map to it", d)
	}
	r, err := call(t, cs, "a___b", nil)
	if strings.Contains(firstText(r), "upstream a tool") {
		t.Fatal("the name a___b the agent was shown for upstream a_ ran upstream a's tool _b")
	}
	if wireCode(err) != CodeUnknownTool {
		t.Fatalf("a___b after a came up: %q, %v; want %d", firstText(r), err, CodeUnknownTool)
	}
	refused := map[string]bool{}
	for _, d := range kinds(h.records(), "drift") {
		if d.Body["action"] == "refused" && d.Body["change"] == "invalid" {
			refused[fmt.Sprint(d.Body["upstream"], "/", d.Body["tool"])] = true
		}
	}
	if !refused["a/_b"] || !refused["a_/b"] {
		t.Fatalf("drift records name %v, want both colliding tools refused", refused)
	}
}
