package gateway

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/credential"
	"github.com/confidential-mcp/cmcp/internal/credential/credtest"
	"github.com/confidential-mcp/cmcp/internal/upstream"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// whoamiVia is credtest.WhoAmIVia.
func whoamiVia(t *testing.T, cs *mcp.ClientSession) (credtest.WhoAmI, error) {
	t.Helper()
	return credtest.WhoAmIVia(t, cs)
}

// TestReloadForgetsTheCredentialsOfRemovedIdentities: a SIGHUP that
// leaves an identity without a token drops its minted upstream
// credentials; the others keep theirs.
func TestReloadForgetsTheCredentialsOfRemovedIdentities(t *testing.T) {
	u := credtest.Start(t)
	b := credential.NewBroker("remote", &credential.Exec{Command: u.Helper(t, 0), Env: map[string]string{"CREDTEST_MINT_URL": u.MintURL}}, credential.Options{})
	hu, err := upstream.NewHTTP(upstream.HTTPOptions{Name: "remote", URL: u.URL, Credentials: b})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	w, err := auditlog.Open(dir, auditlog.Options{Key: key, Durability: record.DurabilityGroup, Gateway: record.GatewayInfo{Version: "test", Platform: "software"}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	g, err := New(Options{Version: "test", Log: w, Logger: slog.New(slog.DiscardHandler),
		Upstreams: []UpstreamOptions{{Upstream: hu, Namespaced: true, Transport: "http", Class: hu.Class(), Credentials: b}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		g.Shutdown(ctx)
	}()
	initial := []Token{{Digest: TokenDigest("alice-tok"), Identity: "alice"}, {Digest: TokenDigest("bob-tok"), Identity: "bob"}}
	ts := NewTokenSet(initial)
	mux := http.NewServeMux()
	mux.Handle("/mcp", g.HTTPHandler(HTTPOptions{Tokens: initial, TokenSet: ts, MaxRequestBytes: 1 << 20}))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	for _, a := range []struct{ name, tok string }{{"alice", "alice-tok"}, {"bob", "bob-tok"}} {
		cs, err := connectWith(srv.URL+"/mcp", a.tok)
		if err != nil {
			t.Fatal(err)
		}
		w, err := whoamiVia(t, cs)
		cs.Close()
		if err != nil || w.Identity != a.name {
			t.Fatalf("%s: %q %v", a.name, w.Identity, err)
		}
	}
	if b.Len() != 2 {
		t.Fatalf("%d credentials cached, want 2", b.Len())
	}
	next := ReloadedTokens{Agents: []Token{{Identity: "alice", Digest: TokenDigest("alice-tok")}}}
	var restart []string
	if err := g.ReloadTokens(context.Background(), next, &ReloadTargets{Tokens: ts}, &restart); err != nil {
		t.Fatal(err)
	}
	if b.Len() != 1 {
		t.Fatalf("%d credentials cached after bob's token was removed, want alice's only", b.Len())
	}
	cs, err := connectWith(srv.URL+"/mcp", "alice-tok")
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if w, err := whoamiVia(t, cs); err != nil || w.Identity != "alice" || u.Mints("alice") != 1 {
		t.Fatalf("alice after the reload: %q %v, mints %d (want her cached credential)", w.Identity, err, u.Mints("alice"))
	}
}
