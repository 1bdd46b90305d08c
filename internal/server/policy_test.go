package server

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/config"
	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/confidential-mcp/cmcp/internal/front/httpfront"
	"github.com/confidential-mcp/cmcp/internal/gateway"
	"github.com/confidential-mcp/cmcp/internal/policy"
	"github.com/confidential-mcp/cmcp/internal/spawnaudit"
	"github.com/confidential-mcp/cmcp/internal/upstream"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

func TestPolicyFromConfigAndSIGHUPReload(t *testing.T) {
	dir := policyBundle(t, testPolicy)
	ctx := context.Background()
	d1, err := digest.Tree(ctx, dir, digest.TreeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(t.TempDir(), "cmcp.yaml")
	writeCfg := func(expect digest.Digest, mode string) {
		rel, _ := filepath.Rel(filepath.Dir(cfgPath), dir)
		y := "version: 1\npolicy:\n  dir: " + rel + "\n  expect: " + expect.String() + "\n  mode: " + mode + "\n  groups:\n    staff: [agent-a]\n"
		if err := os.WriteFile(cfgPath, []byte(y), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeCfg(d1, "enforcing")
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	eng, err := PolicyFromConfig(ctx, cfg, nil)
	if err != nil || eng.Bundle().Digest() != d1 || eng.Mode() != policy.Enforcing || !slices.Equal(eng.GroupsOf("agent-a"), []string{"staff"}) {
		t.Fatalf("engine %v %v", eng, err)
	}
	// A wrong pin stops the gateway from starting, naming the digests.
	writeCfg(digest.Bytes([]byte("other")), "enforcing")
	cfg2, _ := config.Load(cfgPath)
	if _, err := PolicyFromConfig(ctx, cfg2, nil); err == nil || !strings.Contains(err.Error(), "does not match the pin") || exitcode.CodeOf(err) != exitcode.ExitMismatch {
		t.Fatalf("got %v", err)
	}

	h := newPolicyGateway(t, eng)
	a := h.connect("tok-a")
	// The bundle changes but the config still pins the old digest: refused.
	os.WriteFile(filepath.Join(dir, "policy.cedar"), []byte(`@id("all") permit (principal, action, resource);`), 0o644)
	writeCfg(d1, "advisory")
	if err := ReloadPolicyFromConfig(ctx, h.g, cfgPath); err == nil || !strings.Contains(err.Error(), "does not match the pin") {
		t.Fatalf("got %v", err)
	}
	if _, err := call(t, a, "t__echo", map[string]any{"text": "secret"}); wireCode(err) != gateway.CodeDenied {
		t.Fatalf("old bundle not in force: %v", err)
	}
	// The operator pins the new bundle and sends SIGHUP again.
	d2, _ := digest.Tree(ctx, dir, digest.TreeOptions{})
	writeCfg(d2, "advisory")
	if err := ReloadPolicyFromConfig(ctx, h.g, cfgPath); err != nil {
		t.Fatal(err)
	}
	if eng.Bundle().Digest() != d2 || eng.Mode() != policy.Advisory {
		t.Fatalf("not switched: %s %s", eng.Bundle().Digest(), eng.Mode())
	}
	if _, err := call(t, a, "t__echo", map[string]any{"text": "secret"}); err != nil {
		t.Fatalf("new bundle: %v", err)
	}
	// A config that no longer parses: refused, recorded.
	os.WriteFile(cfgPath, []byte("version: 1\npolicy: [\n"), 0o644)
	if err := ReloadPolicyFromConfig(ctx, h.g, cfgPath); err == nil || !strings.Contains(err.Error(), "cmcp.yaml") {
		t.Fatalf("got %v", err)
	}
	var events []string
	for _, p := range kinds(readRecords(t, h.dir), "policy") {
		events = append(events, p.Body["event"].(string))
	}
	if !slices.Equal(events, []string{"loaded", "rejected", "reloaded", "rejected"}) {
		t.Fatalf("policy events %v", events)
	}
}

// policyGateway is a gateway with the test upstream t over HTTP, run as
// the gateway package's test harness runs one.
type policyGateway struct {
	g   *gateway.Gateway
	dir string
	url string
	t   *testing.T
}

// newPolicyGateway runs a gateway with the policy engine eng, the agents
// agent-a (token tok-a) and reader (tok-r), and the test upstream t.
func newPolicyGateway(t *testing.T, eng *policy.Engine) *policyGateway {
	t.Helper()
	exe, pin := selfDigest(t)
	dir := t.TempDir()
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	w, err := auditlog.Open(dir, auditlog.Options{Key: key, Durability: record.DurabilityGroup, Gateway: record.GatewayInfo{Version: "test", Platform: "software"},
		PolicyDigest: eng.Bundle().Digest(), PolicyMode: string(eng.Mode())})
	if err != nil {
		t.Fatal(err)
	}
	logs := &lockedWriter{}
	logger := slog.New(slog.NewTextHandler(logs, nil))
	spec := upstream.StdioSpec{Name: "t", Command: exe, Pin: pin, Env: map[string]string{childEnv: "server"}}
	uo := gateway.UpstreamOptions{Upstream: &upstream.Stdio{Spec: spec, Environ: os.Environ(), Hooks: spawnaudit.Hooks(w, logger, nil), Share: "per-session"},
		Namespaced: true, Class: upstream.ClassSpawnMeasured}
	g, err := gateway.New(gateway.Options{Version: "test", Log: w, Logger: logger, Policy: eng, Upstreams: []gateway.UpstreamOptions{uo}})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	tokens := []httpfront.Token{{Digest: httpfront.TokenDigest("tok-a"), Identity: "agent-a"}, {Digest: httpfront.TokenDigest("tok-r"), Identity: "reader"}}
	mux := http.NewServeMux()
	mux.Handle("/mcp", httpfront.New(g.HTTPCore(), httpfront.Options{Tokens: tokens, MaxRequestBytes: 1 << 20}))
	srv := httptest.NewServer(mux)
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
	return &policyGateway{g: g, dir: dir, url: srv.URL + "/mcp", t: t}
}

// connect opens an agent session with a bearer token.
func (h *policyGateway) connect(token string) *mcp.ClientSession {
	h.t.Helper()
	cs, err := connectWith(h.url, token)
	if err != nil {
		h.t.Fatalf("connect: %v", err)
	}
	h.t.Cleanup(func() { cs.Close() })
	return cs
}
