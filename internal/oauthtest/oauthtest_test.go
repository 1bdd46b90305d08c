package oauthtest_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/zitadel/oidc/v3/pkg/oidc"

	"github.com/confidential-mcp/cmcp/internal/oauthtest"
)

const resource = "http://127.0.0.1:9/mcp"

var (
	alice = oauthtest.User{Subject: "u-alice", Email: "Alice@Example.com", EmailVerified: true, Groups: []string{"eng", "oncall"}, Password: "alice-pw"}
	agent = oauthtest.Client{ID: "agent", RedirectURIs: []string{"http://127.0.0.1:1/callback"}}
	gw    = oauthtest.Client{ID: "gateway", Secret: "gateway-secret", Audience: []string{"https://gw.example/"}}
)

func start(t *testing.T, opts oauthtest.Options) *oauthtest.Server {
	t.Helper()
	opts.Users = append(opts.Users, alice)
	opts.Clients = append(opts.Clients, agent, gw)
	return oauthtest.Start(t, opts)
}

func getJSON(t *testing.T, u string, v any) {
	t.Helper()
	res, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(res.Body)
		t.Fatalf("GET %s: %d %s", u, res.StatusCode, b)
	}
	if err := json.NewDecoder(res.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
}

// verify checks raw against the server's published JWKS (fetched over
// HTTP) and returns its header and claims.
func verify(t *testing.T, s *oauthtest.Server, raw string) (jose.Header, map[string]any) {
	t.Helper()
	var jwks jose.JSONWebKeySet
	getJSON(t, s.JWKSURL(), &jwks)
	tok, err := jwt.ParseSigned(raw, []jose.SignatureAlgorithm{jose.RS256, jose.ES256})
	if err != nil {
		t.Fatalf("parse access token: %v", err)
	}
	var std jwt.Claims
	var all map[string]any
	if err := tok.Claims(&jwks, &std, &all); err != nil {
		t.Fatalf("verify access token against JWKS: %v", err)
	}
	if err := std.Validate(jwt.Expected{Issuer: s.Issuer, Time: time.Now()}); err != nil {
		t.Fatalf("validate claims: %v", err)
	}
	return tok.Headers[0], all
}

func TestCodeFlowWithPKCEIssuesJWTForTheResource(t *testing.T) {
	s := start(t, oauthtest.Options{TokenLifetime: 2 * time.Minute})
	tok, err := s.CodeFlowToken(t.Context(), "agent", alice.Email, resource, "mcp:tools")
	if err != nil {
		t.Fatal(err)
	}
	h, c := verify(t, s, tok.AccessToken)
	if h.KeyID != s.KeyID() {
		t.Errorf("kid = %q, want %q", h.KeyID, s.KeyID())
	}
	if aud, _ := c["aud"].([]any); len(aud) != 1 || aud[0] != resource {
		t.Errorf("aud = %v, want [%s] (the RFC 8707 resource)", c["aud"], resource)
	}
	if c["sub"] != alice.Subject || c["email"] != alice.Email || c["email_verified"] != true || c["scope"] != "mcp:tools" {
		t.Errorf("claims = %v", c)
	}
	if g, _ := c["groups"].([]any); len(g) != 2 || g[0] != "eng" {
		t.Errorf("groups = %v", c["groups"])
	}
	if c["jti"] == "" || c["jti"] == nil {
		t.Errorf("no jti: %v", c)
	}
	if exp := time.Unix(int64(c["exp"].(float64)), 0); time.Until(exp) > 2*time.Minute+5*time.Second || time.Until(exp) < time.Minute {
		t.Errorf("exp %v: want about 2 minutes from now", exp)
	}
	if n := s.Issued(oidc.GrantTypeCode); n != 1 {
		t.Errorf("Issued(code) = %d, want 1", n)
	}
}

func TestWrongPasswordIsRefusedAtTheLoginForm(t *testing.T) {
	s := start(t, oauthtest.Options{})
	cfg, err := s.OAuth2Config("agent", "mcp:tools")
	if err != nil {
		t.Fatal(err)
	}
	u := cfg.AuthCodeURL("st") + "&code_challenge=E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM&code_challenge_method=S256"
	_, err = (&oauthtest.Browser{}).SignIn(t.Context(), u, alice.Email, "wrong")
	if !errors.Is(err, oauthtest.ErrLoginRefused) {
		t.Fatalf("err = %v, want ErrLoginRefused", err)
	}
}

func TestPublicClientWithoutPKCEIsRefused(t *testing.T) {
	s := start(t, oauthtest.Options{})
	cfg, err := s.OAuth2Config("agent", "mcp:tools")
	if err != nil {
		t.Fatal(err)
	}
	back, err := (&oauthtest.Browser{}).SignIn(t.Context(), cfg.AuthCodeURL("st"), alice.Email, alice.Password)
	if err != nil {
		t.Fatal(err)
	}
	if back.Query().Get("error") == "" {
		t.Fatalf("authorization without a code challenge returned %s, want an error", back)
	}
}

func TestClientCredentialsAndTokenExchange(t *testing.T) {
	s := start(t, oauthtest.Options{})
	cc, err := s.ClientCredentialsToken(t.Context(), "gateway", "", "svc")
	if err != nil {
		t.Fatal(err)
	}
	_, c := verify(t, s, cc.AccessToken)
	if c["sub"] != "gateway" || c["aud"].([]any)[0] != "https://gw.example/" || c["scope"] != "svc" {
		t.Errorf("client credentials claims = %v", c)
	}

	user, err := s.CodeFlowToken(t.Context(), "agent", alice.Email, resource, "mcp:tools")
	if err != nil {
		t.Fatal(err)
	}
	up, err := s.ExchangeToken(t.Context(), "gateway", user.AccessToken, "https://upstream.example", "repo")
	if err != nil {
		t.Fatal(err)
	}
	_, c = verify(t, s, up.AccessToken)
	if c["sub"] != alice.Subject || c["aud"].([]any)[0] != "https://upstream.example" || c["email"] != alice.Email || c["scope"] != "repo" {
		t.Errorf("exchanged claims = %v", c)
	}
	if _, err := s.ExchangeToken(t.Context(), "gateway", "not-a-token", "https://upstream.example"); err == nil {
		t.Error("exchanging a junk subject token succeeded")
	}
	if n := s.Issued(oidc.GrantTypeTokenExchange); n != 1 {
		t.Errorf("Issued(token exchange) = %d, want 1", n)
	}
}

func TestRefreshTokensRotate(t *testing.T) {
	s := start(t, oauthtest.Options{})
	tok, err := s.CodeFlowToken(t.Context(), "agent", alice.Email, resource, "mcp:tools", oidc.ScopeOfflineAccess)
	if err != nil {
		t.Fatal(err)
	}
	if tok.RefreshToken == "" {
		t.Fatal("no refresh token with offline_access")
	}
	cfg, _ := s.OAuth2Config("agent")
	tok.Expiry = time.Now().Add(-time.Hour)
	next, err := cfg.TokenSource(t.Context(), tok).Token()
	if err != nil {
		t.Fatal(err)
	}
	if next.RefreshToken == tok.RefreshToken || next.AccessToken == tok.AccessToken {
		t.Error("refresh returned the same tokens")
	}
	if _, err := cfg.TokenSource(t.Context(), tok).Token(); err == nil {
		t.Error("the used refresh token worked a second time")
	}
}

func TestKeyRotation(t *testing.T) {
	s := start(t, oauthtest.Options{Algorithm: jose.ES256})
	first := s.KeyID()
	old, err := s.ClientCredentialsToken(t.Context(), "gateway", resource)
	if err != nil {
		t.Fatal(err)
	}
	kid, err := s.RotateKey()
	if err != nil || kid == first {
		t.Fatalf("RotateKey = %q, %v", kid, err)
	}
	tok, err := s.ClientCredentialsToken(t.Context(), "gateway", resource)
	if err != nil {
		t.Fatal(err)
	}
	if h, _ := verify(t, s, tok.AccessToken); h.KeyID != kid || h.Algorithm != "ES256" {
		t.Errorf("header = %+v, want kid %s ES256", h, kid)
	}
	verify(t, s, old.AccessToken) // the old key is still published
	s.RetireOldKeys()
	var jwks jose.JSONWebKeySet
	getJSON(t, s.JWKSURL(), &jwks)
	if len(jwks.Keys) != 1 || jwks.Keys[0].KeyID != kid {
		t.Errorf("JWKS after retiring = %v, want only %s", jwks.Keys, kid)
	}
}

func TestIssuerPathAndRFC8414Metadata(t *testing.T) {
	s := start(t, oauthtest.Options{IssuerPath: "/tenant1"})
	if !strings.HasSuffix(s.Issuer, "/tenant1") {
		t.Fatalf("issuer %s", s.Issuer)
	}
	u, _ := url.Parse(s.Issuer)
	for _, p := range []string{"/.well-known/oauth-authorization-server/tenant1", "/tenant1/.well-known/openid-configuration"} {
		var meta struct {
			Issuer     string   `json:"issuer"`
			Token      string   `json:"token_endpoint"`
			JWKS       string   `json:"jwks_uri"`
			PKCE       []string `json:"code_challenge_methods_supported"`
			GrantTypes []string `json:"grant_types_supported"`
		}
		getJSON(t, u.Scheme+"://"+u.Host+p, &meta)
		if meta.Issuer != s.Issuer || meta.Token != s.TokenEndpoint() || meta.JWKS != s.JWKSURL() || !slices.Contains(meta.PKCE, "S256") {
			t.Errorf("%s: %+v", p, meta)
		}
		if !slices.Contains(meta.GrantTypes, string(oidc.GrantTypeTokenExchange)) || !slices.Contains(meta.GrantTypes, string(oidc.GrantTypeClientCredentials)) {
			t.Errorf("%s: grant types %v", p, meta.GrantTypes)
		}
	}
	if _, err := s.CodeFlowToken(t.Context(), "agent", alice.Email, resource, "mcp:tools"); err != nil {
		t.Fatal(err)
	}
}

func TestOpaqueTokensAreIntrospected(t *testing.T) {
	s := start(t, oauthtest.Options{Clients: []oauthtest.Client{{ID: "opaque", RedirectURIs: []string{"http://127.0.0.1:1/cb"}, Opaque: true}}})
	tok, err := s.CodeFlowToken(t.Context(), "opaque", alice.Email, resource, "mcp:tools")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(tok.AccessToken, ".") == 2 {
		t.Fatalf("opaque client got a JWT")
	}
	introspect := func() map[string]any {
		form := url.Values{"token": {tok.AccessToken}}
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, s.IntrospectionEndpoint(), strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.SetBasicAuth("gateway", "gateway-secret")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var m map[string]any
		if err := json.NewDecoder(res.Body).Decode(&m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	m := introspect()
	if m["active"] != true || m["sub"] != alice.Subject || m["email"] != alice.Email || m["iss"] != s.Issuer {
		t.Errorf("introspection = %v", m)
	}
	form := url.Values{"token": {tok.AccessToken}, "client_id": {"opaque"}}
	res, err := http.PostForm(s.RevocationEndpoint(), form)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if m := introspect(); m["active"] != false {
		t.Errorf("after revocation (status %d) introspection = %v", res.StatusCode, m)
	}
}

// TestTheBinaryDoesNotLinkTheTestServer: the authorization server and
// zitadel's op are for tests; the cmcp binary must not carry them.
func TestTheBinaryDoesNotLinkTheTestServer(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/confidential-mcp/cmcp/cmd/cmcp").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, "github.com/zitadel/") || strings.HasSuffix(dep, "/internal/oauthtest") {
			t.Errorf("cmd/cmcp depends on %s", dep)
		}
	}
}
