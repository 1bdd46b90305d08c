package oauthtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/zitadel/oidc/v3/pkg/oidc"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/clientcredentials"
)

// OAuth2Config is the golang.org/x/oauth2 configuration of a registered
// client at this server, with its first redirect URI.
func (s *Server) OAuth2Config(clientID string, scopes ...string) (*oauth2.Config, error) {
	s.st.mu.Lock()
	c, ok := s.st.clients[clientID]
	s.st.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("client %q is not registered", clientID)
	}
	cfg := &oauth2.Config{
		ClientID:     c.ID,
		ClientSecret: c.Secret,
		Endpoint: oauth2.Endpoint{
			AuthURL:   s.AuthorizationEndpoint(),
			TokenURL:  s.TokenEndpoint(),
			AuthStyle: oauth2.AuthStyleInHeader,
		},
		Scopes: scopes,
	}
	if len(c.RedirectURIs) > 0 {
		cfg.RedirectURL = c.RedirectURIs[0]
	}
	return cfg, nil
}

// CodeFlowToken runs the authorization code flow with PKCE for clientID as
// the user username would in a browser (see [Browser]), asking for an
// access token for resource (RFC 8707; empty asks for none) with scopes,
// and returns the token response.
func (s *Server) CodeFlowToken(ctx context.Context, clientID, username, resource string, scopes ...string) (*oauth2.Token, error) {
	cfg, err := s.OAuth2Config(clientID, scopes...)
	if err != nil {
		return nil, err
	}
	s.st.mu.Lock()
	u, ok := s.st.users[username]
	s.st.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("user %q is not registered", username)
	}
	verifier := oauth2.GenerateVerifier()
	state := oauth2.GenerateVerifier()
	opts := []oauth2.AuthCodeOption{oauth2.S256ChallengeOption(verifier)}
	if resource != "" {
		opts = append(opts, oauth2.SetAuthURLParam("resource", resource))
	}
	back, err := (&Browser{}).SignIn(ctx, cfg.AuthCodeURL(state, opts...), username, u.Password)
	if err != nil {
		return nil, err
	}
	q := back.Query()
	if e := q.Get("error"); e != "" {
		return nil, fmt.Errorf("authorization refused: %s: %s", e, q.Get("error_description"))
	}
	if q.Get("state") != state {
		return nil, errors.New("authorization response carries another state")
	}
	exch := []oauth2.AuthCodeOption{oauth2.VerifierOption(verifier)}
	if resource != "" {
		exch = append(exch, oauth2.SetAuthURLParam("resource", resource))
	}
	return cfg.Exchange(ctx, q.Get("code"), exch...)
}

// ClientCredentialsToken gets a token for a confidential client by the
// client credentials grant, for resource (empty: none) with scopes.
func (s *Server) ClientCredentialsToken(ctx context.Context, clientID, resource string, scopes ...string) (*oauth2.Token, error) {
	cfg, err := s.OAuth2Config(clientID, scopes...)
	if err != nil {
		return nil, err
	}
	cc := &clientcredentials.Config{
		ClientID:     cfg.ClientID,
		ClientSecret: cfg.ClientSecret,
		TokenURL:     cfg.Endpoint.TokenURL,
		Scopes:       scopes,
		AuthStyle:    oauth2.AuthStyleInHeader,
	}
	if resource != "" {
		cc.EndpointParams = map[string][]string{"resource": {resource}}
	}
	return cc.Token(ctx)
}

// ExchangeToken runs an RFC 8693 token exchange at the server for the
// confidential client clientID: subjectToken (an access token this server
// issued) for an access token whose audience is audience, with scopes.
func (s *Server) ExchangeToken(ctx context.Context, clientID, subjectToken, audience string, scopes ...string) (*oauth2.Token, error) {
	cfg, err := s.OAuth2Config(clientID)
	if err != nil {
		return nil, err
	}
	form := url.Values{
		"grant_type":           {string(oidc.GrantTypeTokenExchange)},
		"subject_token":        {subjectToken},
		"subject_token_type":   {string(oidc.AccessTokenType)},
		"requested_token_type": {string(oidc.AccessTokenType)},
	}
	if audience != "" {
		form.Set("audience", audience)
	}
	if len(scopes) > 0 {
		form.Set("scope", strings.Join(scopes, " "))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.TokenEndpoint(), strings.NewReader(form.Encode()))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth(url.QueryEscape(cfg.ClientID), url.QueryEscape(cfg.ClientSecret))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("token exchange: status %d: %s", res.StatusCode, strings.TrimSpace(string(body)))
	}
	var tr struct {
		AccessToken string `json:"access_token"`
		TokenType   string `json:"token_type"`
		ExpiresIn   int64  `json:"expires_in"`
	}
	if err := json.Unmarshal(body, &tr); err != nil {
		return nil, fmt.Errorf("token exchange response: %w", err)
	}
	t := &oauth2.Token{AccessToken: tr.AccessToken, TokenType: tr.TokenType}
	if tr.ExpiresIn > 0 {
		t.Expiry = time.Now().Add(time.Duration(tr.ExpiresIn) * time.Second)
	}
	return t, nil
}
