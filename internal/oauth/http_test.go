package oauth_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"

	"github.com/confidential-mcp/cmcp/internal/oauth"
	"github.com/confidential-mcp/cmcp/internal/oauthtest"
)

func TestResourceMetadataURL(t *testing.T) {
	for in, want := range map[string]string{
		"https://gw.example/mcp":       "https://gw.example/.well-known/oauth-protected-resource/mcp",
		"https://gw.example/":          "https://gw.example/.well-known/oauth-protected-resource",
		"https://gw.example":           "https://gw.example/.well-known/oauth-protected-resource",
		"http://127.0.0.1:8080/a/mcp/": "http://127.0.0.1:8080/.well-known/oauth-protected-resource/a/mcp",
	} {
		if got := oauth.ResourceMetadataURL(in); got != want {
			t.Errorf("ResourceMetadataURL(%s) = %s, want %s", in, got, want)
		}
	}
}

// protect is the shape of the gateway's front with OAuth: the metadata at
// its well-known paths, every other request verified and refused with
// Challenge's status and header.
func protect(v *oauth.Verifier, next http.Handler) http.Handler {
	mux := http.NewServeMux()
	for _, p := range v.MetadataPaths() {
		mux.Handle(p, v.MetadataHandler())
	}
	mux.Handle("/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := r.Header.Get("Authorization")
		var err error
		if tok, ok := strings.CutPrefix(h, "Bearer "); ok {
			if _, err = v.Verify(r.Context(), tok); err == nil {
				next.ServeHTTP(w, r)
				return
			}
		}
		http.Error(w, "refused", v.Challenge(w.Header(), err))
	}))
	return mux
}

// TestGoSDKClientSignsInThroughTheAuthorizationServer: go-sdk's own
// client-side authorization (auth.AuthorizationCodeHandler: 401, RFC 9728
// metadata, RFC 8414 discovery, PKCE, resource) gets a token from the test
// authorization server, a person's login driven by oauthtest.Browser, and
// the protected MCP endpoint accepts it.
func TestGoSDKClientSignsInThroughTheAuthorizationServer(t *testing.T) {
	op := startOP(t, oauthtest.Options{})
	srv := httptest.NewUnstartedServer(nil)
	res := "http://" + srv.Listener.Addr().String() + "/mcp"
	v := newVerifier(t, op, func(c *oauth.Config) { c.Resource = res })
	mcpServer := mcp.NewServer(&mcp.Implementation{Name: "s", Version: "1"}, nil)
	mcp.AddTool(mcpServer, &mcp.Tool{Name: "echo"}, func(ctx context.Context, req *mcp.CallToolRequest, in struct{ S string }) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: in.S}}}, nil, nil
	})
	srv.Config.Handler = protect(v, mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return mcpServer }, nil))
	srv.Start()
	t.Cleanup(srv.Close)

	// The metadata as go-sdk reads it.
	prm, err := oauthex.GetProtectedResourceMetadata(t.Context(), oauth.ResourceMetadataURL(res), res, http.DefaultClient)
	if err != nil {
		t.Fatal(err)
	}
	if prm.Resource != res || len(prm.AuthorizationServers) != 1 || prm.AuthorizationServers[0] != op.Issuer {
		t.Fatalf("metadata %+v", prm)
	}

	var logins atomic.Int32
	h, err := auth.NewAuthorizationCodeHandler(&auth.AuthorizationCodeHandlerConfig{
		PreregisteredClient: &oauthex.ClientCredentials{ClientID: "agent"},
		RedirectURL:         agent.RedirectURIs[0],
		AuthorizationCodeFetcher: func(ctx context.Context, a *auth.AuthorizationArgs) (*auth.AuthorizationResult, error) {
			logins.Add(1)
			back, err := (&oauthtest.Browser{}).SignIn(ctx, a.URL, alice.Email, alice.Password)
			if err != nil {
				return nil, err
			}
			q := back.Query()
			if e := q.Get("error"); e != "" {
				return nil, errors.New(e + ": " + q.Get("error_description"))
			}
			return &auth.AuthorizationResult{Code: q.Get("code"), State: q.Get("state"), Iss: q.Get("iss")}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil)
	cs, err := client.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: res, OAuthHandler: h}, nil)
	if err != nil {
		t.Fatalf("connect with go-sdk's OAuth handler: %v", err)
	}
	defer cs.Close()
	out, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"S": "hi"}})
	if err != nil || out.IsError || out.Content[0].(*mcp.TextContent).Text != "hi" {
		t.Fatalf("call: %+v, %v", out, err)
	}
	if n := logins.Load(); n != 1 {
		t.Errorf("%d logins, want 1", n)
	}
}

func TestChallenge(t *testing.T) {
	op := startOP(t, oauthtest.Options{})
	v := newVerifier(t, op, nil)
	for _, tc := range []struct {
		name   string
		err    error
		status int
		want   []string
	}{
		{"no token", nil, 401, []string{`Bearer resource_metadata="http://127.0.0.1:9/.well-known/oauth-protected-resource/mcp"`, `scope="mcp:tools"`}},
		{"invalid", errors.Join(oauth.ErrInvalidToken, errors.New(`key "x" \ unknown`)), 401, []string{`Bearer error="invalid_token"`, `error_description="invalid_token`, `key 'x' ? unknown"`, `resource_metadata="http://127.0.0.1:9/`}},
		{"scope", errors.Join(oauth.ErrInsufficientScope), 403, []string{`Bearer error="insufficient_scope"`, `scope="mcp:tools"`, "resource_metadata="}},
		{"unavailable", oauth.ErrUnavailable, 503, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			if got := v.Challenge(h, tc.err); got != tc.status {
				t.Fatalf("status %d, want %d", got, tc.status)
			}
			for _, w := range tc.want {
				if !strings.Contains(h.Get("WWW-Authenticate"), w) {
					t.Errorf("WWW-Authenticate %q lacks %q", h.Get("WWW-Authenticate"), w)
				}
			}
		})
	}
}
