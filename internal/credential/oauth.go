package credential

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/oauthex"
)

// OAuthClient is the gateway as an OAuth client of an upstream's
// authorization server: its endpoints (configured, or discovered from the
// issuer's metadata, RFC 8414 then OpenID discovery), its client id and
// secret, and the token requests of the grants the sources use.
type OAuthClient struct {
	// Upstream names the upstream in errors.
	Upstream string
	// Issuer is discovered when an endpoint is not given.
	Issuer                string
	TokenEndpoint         string
	AuthorizationEndpoint string
	ClientID              string
	// ClientSecret authenticates a confidential client (HTTP Basic); zero
	// for a public client (client_id in the form, PKCE).
	ClientSecret Secret
	Scopes       []string
	// Resource is the RFC 8707 resource indicator of every request.
	Resource string
	// HTTP is the client for the authorization server (default: one with
	// a 30 s timeout, no proxy, no redirects).
	HTTP *http.Client
	// ResourceURL is the upstream's endpoint: with neither Issuer nor
	// TokenEndpoint, the authorization server is discovered from the
	// upstream's 401 answer and its RFC 9728 protected resource metadata,
	// fetched with UpstreamHTTP (the upstream's pinned client).
	ResourceURL  string
	UpstreamHTTP *http.Client

	once sync.Mutex
	done bool
}

// maxTokenResponse bounds an authorization server's answer.
const maxTokenResponse = 1 << 20

func defaultOAuthHTTP() *http.Client {
	return &http.Client{
		Timeout: 30 * time.Second,
		Transport: &http.Transport{
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
			TLSHandshakeTimeout: 10 * time.Second,
			ForceAttemptHTTP2:   true,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

func (c *OAuthClient) http() *http.Client {
	if c.HTTP == nil {
		c.HTTP = defaultOAuthHTTP()
	}
	return c.HTTP
}

// endpoints discovers the missing endpoints from the issuer's metadata,
// once it succeeds.
func (c *OAuthClient) endpoints(ctx context.Context, needAuthorize bool) error {
	c.once.Lock()
	defer c.once.Unlock()
	if c.done || (c.TokenEndpoint != "" && (!needAuthorize || c.AuthorizationEndpoint != "")) {
		return nil
	}
	if c.Issuer == "" && c.TokenEndpoint == "" && c.ResourceURL != "" {
		prm, err := DiscoverResource(ctx, c.UpstreamHTTP, c.ResourceURL)
		if err != nil {
			return fmt.Errorf("upstream %q: %w; or configure credential.oauth.issuer", c.Upstream, err)
		}
		c.Issuer = prm.AuthorizationServers[0]
		if c.Resource == "" {
			c.Resource = prm.Resource
		}
	}
	if c.Issuer == "" {
		return fmt.Errorf("upstream %q: no token endpoint and no issuer to discover it from", c.Upstream)
	}
	m, err := DiscoverAuthServer(ctx, c.http(), c.Issuer)
	if err != nil {
		return fmt.Errorf("upstream %q: %w", c.Upstream, err)
	}
	if c.TokenEndpoint == "" {
		c.TokenEndpoint = m.TokenEndpoint
	}
	if c.AuthorizationEndpoint == "" {
		c.AuthorizationEndpoint = m.AuthorizationEndpoint
	}
	c.done = true
	return nil
}

// DiscoverResource finds the protected resource metadata (RFC 9728) of
// the MCP endpoint resource: from the resource_metadata of the
// WWW-Authenticate challenge of an unauthenticated request (as the MCP
// authorization spec has servers send), else at the well-known URIs
// (path-inserted, then the root). It must name at least one
// authorization server.
func DiscoverResource(ctx context.Context, hc *http.Client, resource string) (*oauthex.ProtectedResourceMetadata, error) {
	if hc == nil {
		hc = defaultOAuthHTTP()
	}
	u, err := url.Parse(resource)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("resource %q is not a URL", resource)
	}
	var candidates []string
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, resource, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/event-stream")
	if resp, err := hc.Do(req); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusUnauthorized {
			if cs, err := oauthex.ParseWWWAuthenticate(resp.Header.Values("WWW-Authenticate")); err == nil {
				for _, c := range cs {
					if m := c.Params["resource_metadata"]; c.Scheme == "bearer" && m != "" {
						candidates = append(candidates, m)
					}
				}
			}
		}
	}
	origin := u.Scheme + "://" + u.Host
	if p := strings.TrimSuffix(u.Path, "/"); p != "" {
		candidates = append(candidates, origin+"/.well-known/oauth-protected-resource"+p)
	}
	candidates = append(candidates, origin+"/.well-known/oauth-protected-resource")
	var errs []string
	for _, m := range candidates {
		prm, err := oauthex.GetProtectedResourceMetadata(ctx, m, resource, hc)
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		if len(prm.AuthorizationServers) == 0 {
			errs = append(errs, m+": names no authorization server")
			continue
		}
		return prm, nil
	}
	return nil, fmt.Errorf("discover the upstream's authorization server (RFC 9728): %s", strings.Join(errs, "; "))
}

// AuthServerMeta is what the gateway reads of an authorization server's
// metadata.
type AuthServerMeta struct {
	Issuer                        string   `json:"issuer"`
	AuthorizationEndpoint         string   `json:"authorization_endpoint"`
	TokenEndpoint                 string   `json:"token_endpoint"`
	CodeChallengeMethodsSupported []string `json:"code_challenge_methods_supported"`
}

// DiscoverAuthServer reads issuer's metadata: RFC 8414
// (/.well-known/oauth-authorization-server, path-inserted), then OpenID
// discovery (path-inserted, then appended). The metadata's issuer must be
// issuer exactly.
func DiscoverAuthServer(ctx context.Context, hc *http.Client, issuer string) (*AuthServerMeta, error) {
	if hc == nil {
		hc = defaultOAuthHTTP()
	}
	u, err := url.Parse(issuer)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("issuer %q is not a URL", issuer)
	}
	path := strings.TrimSuffix(u.Path, "/")
	origin := u.Scheme + "://" + u.Host
	candidates := []string{origin + "/.well-known/oauth-authorization-server" + path, origin + "/.well-known/openid-configuration" + path}
	if path != "" {
		candidates = append(candidates, origin+path+"/.well-known/openid-configuration")
	}
	var errs []string
	for _, where := range candidates {
		var m AuthServerMeta
		status, err := getJSON(ctx, hc, where, &m)
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", where, err))
			continue
		}
		if status != http.StatusOK {
			errs = append(errs, fmt.Sprintf("%s: HTTP %d", where, status))
			continue
		}
		if m.Issuer != issuer {
			return nil, fmt.Errorf("the metadata at %s names issuer %q, not %q: refused (RFC 8414 section 3.3)", where, m.Issuer, issuer)
		}
		if m.TokenEndpoint == "" {
			return nil, fmt.Errorf("the metadata at %s has no token_endpoint", where)
		}
		return &m, nil
	}
	return nil, fmt.Errorf("discover the authorization server %s: %s", issuer, strings.Join(errs, "; "))
}

func getJSON(ctx context.Context, hc *http.Client, where string, v any) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, where, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, nil
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxTokenResponse+1))
	if err != nil {
		return 0, err
	}
	if len(b) > maxTokenResponse {
		return 0, fmt.Errorf("larger than %d bytes", maxTokenResponse)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return 0, fmt.Errorf("not JSON metadata: %v", err)
	}
	return http.StatusOK, nil
}

// tokenResponse is an RFC 6749 section 5.1 token response (and 5.2 error).
type tokenResponse struct {
	AccessToken      string          `json:"access_token"`
	TokenType        string          `json:"token_type"`
	ExpiresIn        json.RawMessage `json:"expires_in"`
	RefreshToken     string          `json:"refresh_token"`
	Error            string          `json:"error"`
	ErrorDescription string          `json:"error_description"`
}

// OAuthError is an error the authorization server answered a token
// request with (RFC 6749 section 5.2).
type OAuthError struct {
	Upstream, Grant string
	Status          int
	Code            string // invalid_grant, invalid_client, ...
	Description     string
}

func (e *OAuthError) Error() string {
	s := fmt.Sprintf("upstream %q: the authorization server refused the %s request (HTTP %d", e.Upstream, e.Grant, e.Status)
	if e.Code != "" {
		s += ", " + e.Code
	}
	s += ")"
	if e.Description != "" {
		s += ": " + cleanText(e.Description, 200)
	}
	return s
}

// cleanText keeps printable ASCII of s, at most n bytes.
func cleanText(s string, n int) string {
	var b strings.Builder
	for _, r := range s {
		if b.Len() >= n {
			b.WriteString("...")
			break
		}
		if r >= ' ' && r < 0x7f {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// token posts a token request of grant with form and reads the answer.
// No error holds the form (it has the subject token, the code, the
// refresh token) or the answer's tokens.
func (c *OAuthClient) token(ctx context.Context, grant string, form url.Values) (Token, Secret, error) {
	if err := c.endpoints(ctx, false); err != nil {
		return Token{}, Secret{}, err
	}
	form.Set("grant_type", grant)
	if c.Resource != "" && form.Get("resource") == "" {
		form.Set("resource", c.Resource)
	}
	if len(c.Scopes) > 0 && form.Get("scope") == "" {
		form.Set("scope", strings.Join(c.Scopes, " "))
	}
	if c.ClientSecret.IsZero() {
		form.Set("client_id", c.ClientID)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.TokenEndpoint, strings.NewReader(form.Encode()))
	if err != nil {
		return Token{}, Secret{}, fmt.Errorf("upstream %q: token endpoint: %w", c.Upstream, err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	if !c.ClientSecret.IsZero() {
		req.SetBasicAuth(url.QueryEscape(c.ClientID), url.QueryEscape(c.ClientSecret.v))
	}
	grantName := strings.TrimPrefix(grant, "urn:ietf:params:oauth:grant-type:")
	resp, err := c.http().Do(req)
	if err != nil {
		return Token{}, Secret{}, fmt.Errorf("upstream %q: %s request to %s: %w", c.Upstream, grantName, c.TokenEndpoint, stripURLError(err))
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxTokenResponse+1))
	if err != nil {
		return Token{}, Secret{}, fmt.Errorf("upstream %q: read the %s response: %w", c.Upstream, grantName, err)
	}
	var tr tokenResponse
	jerr := json.Unmarshal(b, &tr)
	if resp.StatusCode != http.StatusOK {
		e := &OAuthError{Upstream: c.Upstream, Grant: grantName, Status: resp.StatusCode}
		if jerr == nil {
			e.Code, e.Description = cleanText(tr.Error, 64), tr.ErrorDescription
		}
		return Token{}, Secret{}, e
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "application/json" || jerr != nil || len(b) > maxTokenResponse {
		return Token{}, Secret{}, fmt.Errorf("upstream %q: the %s response is not a JSON token response", c.Upstream, grantName)
	}
	if tr.AccessToken == "" {
		return Token{}, Secret{}, fmt.Errorf("upstream %q: the %s response has no access_token", c.Upstream, grantName)
	}
	if tr.TokenType != "" && !strings.EqualFold(tr.TokenType, "bearer") && !strings.EqualFold(tr.TokenType, "N_A") {
		return Token{}, Secret{}, fmt.Errorf("upstream %q: the %s response's token_type is %q; only bearer tokens are sent", c.Upstream, grantName, cleanText(tr.TokenType, 32))
	}
	t := Token{Value: NewSecret(tr.AccessToken)}
	var secs json.Number
	if len(tr.ExpiresIn) > 0 && json.Unmarshal(tr.ExpiresIn, &secs) == nil {
		if n, err := secs.Int64(); err == nil && n > 0 {
			t.Expiry = time.Now().Add(time.Duration(n) * time.Second)
		}
	} else if len(tr.ExpiresIn) > 0 {
		var s string
		if json.Unmarshal(tr.ExpiresIn, &s) == nil {
			var n int64
			if _, err := fmt.Sscan(s, &n); err == nil && n > 0 {
				t.Expiry = time.Now().Add(time.Duration(n) * time.Second)
			}
		}
	}
	return t, NewSecret(tr.RefreshToken), nil
}

// stripURLError drops *url.Error's repetition of the URL (the endpoint's
// is configured, but keep errors short and free of any query).
func stripURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// ClientCredentials is the client_credentials source: one service
// identity (the gateway's client) for every caller.
type ClientCredentials struct{ Client *OAuthClient }

// Kind is "client_credentials".
func (s *ClientCredentials) Kind() string { return "client_credentials" }

// SharedIdentity is the client id: every identity shares its credential.
func (s *ClientCredentials) SharedIdentity() string { return "client:" + s.Client.ClientID }

// Mint runs the client credentials grant.
func (s *ClientCredentials) Mint(ctx context.Context, r Request) (Token, error) {
	form := url.Values{}
	if r.Audience != "" && s.Client.Resource == "" {
		form.Set("resource", r.Audience)
	}
	t, _, err := s.Client.token(ctx, "client_credentials", form)
	return t, err
}

// Token types of RFC 8693.
const (
	TokenTypeAccessToken = "urn:ietf:params:oauth:token-type:access_token"
	TokenTypeJWT         = "urn:ietf:params:oauth:token-type:jwt"
	TokenTypeIDToken     = "urn:ietf:params:oauth:token-type:id_token"
)

// TokenExchange is the token_exchange source (RFC 8693): the identity's
// own verified token is the subject token, exchanged at the upstream's
// authorization server for one whose audience is the upstream. The
// subject token goes to the authorization server only, never upstream.
type TokenExchange struct {
	Client *OAuthClient
	// SubjectTokenType defaults to TokenTypeAccessToken.
	SubjectTokenType string
}

// Kind is "token_exchange".
func (s *TokenExchange) Kind() string { return "token_exchange" }

// Mint exchanges r.Identity.Token.
func (s *TokenExchange) Mint(ctx context.Context, r Request) (Token, error) {
	if r.Identity.Token.IsZero() {
		return Token{}, fmt.Errorf("upstream %q: %q signed in without an OAuth token (a static bearer token), so there is no token to exchange; "+
			"token_exchange needs agents that sign in through server.oauth", r.Upstream, r.Identity.Name)
	}
	st := s.SubjectTokenType
	if st == "" {
		st = TokenTypeAccessToken
	}
	form := url.Values{
		"subject_token":        {r.Identity.Token.v},
		"subject_token_type":   {st},
		"requested_token_type": {TokenTypeAccessToken},
	}
	if r.Audience != "" {
		form.Set("audience", r.Audience)
	}
	t, _, err := s.Client.token(ctx, "urn:ietf:params:oauth:grant-type:token-exchange", form)
	if err != nil {
		return Token{}, fmt.Errorf("%w (for %q)", err, r.Identity.Name)
	}
	return t, nil
}
