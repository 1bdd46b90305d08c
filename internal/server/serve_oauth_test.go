package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"

	"github.com/confidential-mcp/cmcp/internal/config"
	"github.com/confidential-mcp/cmcp/internal/front/httpfront"
	"github.com/confidential-mcp/cmcp/internal/gateway"
	"github.com/confidential-mcp/cmcp/internal/gwtest"
	"github.com/confidential-mcp/cmcp/internal/oauth"
	"github.com/confidential-mcp/cmcp/internal/oauthtest"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
)

// TestServeOAuth: `cmcp serve` with server.oauth, run in process from its
// configuration file. go-sdk's client signs in at the test authorization
// server through go-sdk's OAuth handler (the 401, the metadata the
// gateway serves, PKCE, a person's login) and calls a tool; a static token
// works beside it; and the endpoint is not open to a request without a
// credential even on loopback (no development mode with OAuth).
func TestServeOAuth(t *testing.T) {
	exe, pin := selfDigest(t)
	op := oauthtest.Start(t, oauthtest.Options{
		Users:   []oauthtest.User{{Subject: "u-alice", Email: "alice@example.com", EmailVerified: true, Password: "pw"}},
		Clients: []oauthtest.Client{{ID: "agent", RedirectURIs: []string{"http://127.0.0.1:1/callback"}}},
	})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	resource := "http://" + addr + "/mcp"
	dir := t.TempDir()
	cfg, _ := loadConfigFile(t, dir, fmt.Sprintf(`version: 1
server:
  listen: %s
  tee: software
  tokens: [{identity: bot, sha256: %s}]
  oauth:
    issuer: %s
    resource: %s
    identity_claim: email
    scopes: [mcp:tools]
audit: {dir: audit}
upstreams:
  - name: t
    stdio: {command: %s, env: {%s: server}}
    pin: {command: %s}
`, addr, httpfront.TokenDigest("tok-1"), op.Issuer, resource, exe, childEnv, pin))
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, cfg, ServeOptions{Environ: os.Environ(), Started: func(ep string, _ *gateway.Gateway, _ *auditlog.Writer) { ready <- ep }})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("Serve: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("Serve did not start")
	}

	res, err := http.Post(resource, "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusUnauthorized || !strings.Contains(res.Header.Get("WWW-Authenticate"), `resource_metadata="`+oauth.ResourceMetadataURL(resource)+`"`) {
		t.Fatalf("no credential: %d %q, want 401 with the resource metadata", res.StatusCode, res.Header.Get("WWW-Authenticate"))
	}

	h, err := auth.NewAuthorizationCodeHandler(&auth.AuthorizationCodeHandlerConfig{
		PreregisteredClient: &oauthex.ClientCredentials{ClientID: "agent"},
		RedirectURL:         "http://127.0.0.1:1/callback",
		AuthorizationCodeFetcher: func(ctx context.Context, a *auth.AuthorizationArgs) (*auth.AuthorizationResult, error) {
			back, err := (&oauthtest.Browser{}).SignIn(ctx, a.URL, "alice@example.com", "pw")
			if err != nil {
				return nil, err
			}
			q := back.Query()
			if e := q.Get("error"); e != "" {
				return nil, errors.New(e)
			}
			return &auth.AuthorizationResult{Code: q.Get("code"), State: q.Get("state"), Iss: q.Get("iss")}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer ccancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "oauth-agent", Version: "1"}, nil).Connect(cctx, &mcp.StreamableClientTransport{Endpoint: resource, OAuthHandler: h, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatalf("connect with go-sdk's OAuth handler: %v", err)
	}
	defer cs.Close()
	out, err := cs.CallTool(cctx, &mcp.CallToolParams{Name: "t__echo", Arguments: map[string]any{"text": "hi"}})
	if err != nil || out.IsError {
		t.Fatalf("call: %+v, %v", out, err)
	}

	bot, err := mcp.NewClient(&mcp.Implementation{Name: "bot", Version: "1"}, nil).Connect(cctx, &mcp.StreamableClientTransport{Endpoint: resource,
		HTTPClient: &http.Client{Transport: gwtest.Bearer{Tok: "tok-1", Base: http.DefaultTransport}}, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatalf("static token beside OAuth: %v", err)
	}
	bot.Close()
}

// TestOAuthAlgorithmListsAgree: server.oauth.algorithms is checked against
// config's list and the verifier refuses anything not in its own; they are
// the same list, public-key algorithms only.
func TestOAuthAlgorithmListsAgree(t *testing.T) {
	if !slices.Equal(config.OAuthAlgorithms, oauth.PublicKeyAlgorithms) {
		t.Fatalf("config.OAuthAlgorithms %v != oauth.PublicKeyAlgorithms %v", config.OAuthAlgorithms, oauth.PublicKeyAlgorithms)
	}
	for _, a := range oauth.PublicKeyAlgorithms {
		if a == "none" || strings.HasPrefix(a, "HS") {
			t.Fatalf("%s is in the list", a)
		}
	}
	c := oauthConfig(&config.OAuth{Issuer: "https://as.example", Resource: "https://gw.example/mcp"})
	if c.IdentityClaim != "sub" || c.ClockSkew != config.DefaultOAuthClockSkew || c.RefreshFloor != config.DefaultOAuthJWKSRefreshFloor || !slices.Equal(c.Algorithms, config.OAuthAlgorithms) {
		t.Fatalf("defaults: %+v", c)
	}
}
