package oauthtest

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/subtle"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"
)

// storage is the op.Storage (with client credentials, token exchange and
// introspection) of a Server, all in memory under one lock.
type storage struct {
	issuer string

	mu          sync.Mutex
	lifetime    time.Duration
	alg         jose.SignatureAlgorithm
	keys        []*signingKey    // the last one signs
	users       map[string]*User // by username
	usersBySub  map[string]*User
	clients     map[string]*Client
	requests    map[string]*authRequest // by ID
	codes       map[string]string       // code -> request ID
	refresh     map[string]*grant       // refresh token -> grant
	access      map[string]*grant       // access token ID -> grant
	issued      map[oidc.GrantType]int
	jwksFetches int
}

// grant is what a token was issued for.
type grant struct {
	subject  string
	clientID string
	audience []string
	scopes   []string
	authTime time.Time
	amr      []string
	expires  time.Time
}

type signingKey struct {
	id   string
	alg  jose.SignatureAlgorithm
	priv crypto.Signer
}

func (k *signingKey) public() crypto.PublicKey { return k.priv.Public() }

func newKey(alg jose.SignatureAlgorithm) (*signingKey, error) {
	var priv crypto.Signer
	var err error
	switch alg {
	case jose.RS256:
		priv, err = rsa.GenerateKey(rand.Reader, 2048)
	case jose.ES256:
		priv, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	default:
		return nil, fmt.Errorf("signing algorithm %q: want RS256 or ES256", alg)
	}
	if err != nil {
		return nil, fmt.Errorf("generate %s key: %w", alg, err)
	}
	return &signingKey{id: rand.Text()[:16], alg: alg, priv: priv}, nil
}

func newStorage(issuer string, opts Options) (*storage, error) {
	k, err := newKey(opts.Algorithm)
	if err != nil {
		return nil, err
	}
	st := &storage{
		issuer:     issuer,
		lifetime:   opts.TokenLifetime,
		alg:        opts.Algorithm,
		keys:       []*signingKey{k},
		users:      map[string]*User{},
		usersBySub: map[string]*User{},
		clients:    map[string]*Client{},
		requests:   map[string]*authRequest{},
		codes:      map[string]string{},
		refresh:    map[string]*grant{},
		access:     map[string]*grant{},
		issued:     map[oidc.GrantType]int{},
	}
	for _, u := range opts.Users {
		st.addUser(u)
	}
	for _, c := range opts.Clients {
		st.addClient(c)
	}
	return st, nil
}

func (st *storage) addUser(u User) {
	if u.Username == "" {
		u.Username = u.Email
	}
	if u.Username == "" {
		u.Username = u.Subject
	}
	if u.Password == "" {
		u.Password = "password"
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	st.users[u.Username] = &u
	st.usersBySub[u.Subject] = &u
}

func (st *storage) addClient(c Client) {
	if len(c.Grants) == 0 {
		c.Grants = []oidc.GrantType{oidc.GrantTypeCode, oidc.GrantTypeRefreshToken}
		if c.Secret != "" {
			c.Grants = append(c.Grants, oidc.GrantTypeClientCredentials, oidc.GrantTypeTokenExchange)
		}
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	st.clients[c.ID] = &c
}

func (st *storage) rotate() (string, error) {
	st.mu.Lock()
	alg := st.alg
	st.mu.Unlock()
	k, err := newKey(alg)
	if err != nil {
		return "", err
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	st.keys = append(st.keys, k)
	return k.id, nil
}

func (st *storage) retire() {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.keys = st.keys[len(st.keys)-1:]
}

// userClaims are the identity claims of u in tokens.
func userClaims(u *User) map[string]any {
	c := map[string]any{}
	for k, v := range u.Claims {
		c[k] = v
	}
	if u.Email != "" {
		c["email"] = u.Email
		c["email_verified"] = u.EmailVerified
	}
	if len(u.Groups) > 0 {
		c["groups"] = slices.Clone(u.Groups)
	}
	return c
}

var errNotFound = errors.New("not found")

// --- AuthStorage ---

func (st *storage) CreateAuthRequest(ctx context.Context, req *oidc.AuthRequest, userID string) (op.AuthRequest, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	c, ok := st.clients[req.ClientID]
	if !ok {
		return nil, fmt.Errorf("client %q: %w", req.ClientID, errNotFound)
	}
	if req.CodeChallenge == "" || req.CodeChallengeMethod != oidc.CodeChallengeMethodS256 {
		// OAuth 2.1 requires PKCE of every client; zitadel's op checks
		// a challenge only when one was sent.
		return nil, oidc.ErrInvalidRequest().WithDescription("code_challenge with code_challenge_method S256 is required (PKCE)")
	}
	aud := resourcesFrom(ctx)
	if !validResource(aud) {
		return nil, oidc.ErrInvalidRequest().WithDescription("resource must be an absolute URI without a fragment (RFC 8707)")
	}
	if len(aud) == 0 {
		aud = defaultAudience(c)
	}
	ar := &authRequest{
		id:          rand.Text(),
		created:     time.Now(),
		clientID:    req.ClientID,
		redirectURI: req.RedirectURI,
		state:       req.State,
		nonce:       req.Nonce,
		scopes:      slices.Clone(req.Scopes),
		audience:    aud,
		respType:    req.ResponseType,
		respMode:    req.ResponseMode,
		subject:     userID,
	}
	if req.CodeChallenge != "" {
		ar.challenge = &oidc.CodeChallenge{Challenge: req.CodeChallenge, Method: req.CodeChallengeMethod}
	}
	st.requests[ar.id] = ar
	return ar, nil
}

func defaultAudience(c *Client) []string {
	if len(c.Audience) > 0 {
		return slices.Clone(c.Audience)
	}
	return []string{c.ID}
}

func (st *storage) AuthRequestByID(_ context.Context, id string) (op.AuthRequest, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	ar, ok := st.requests[id]
	if !ok {
		return nil, fmt.Errorf("auth request %q: %w", id, errNotFound)
	}
	return ar, nil
}

func (st *storage) AuthRequestByCode(_ context.Context, code string) (op.AuthRequest, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	ar, ok := st.requests[st.codes[code]]
	if !ok {
		return nil, fmt.Errorf("code: %w", errNotFound)
	}
	return ar, nil
}

func (st *storage) SaveAuthCode(_ context.Context, id, code string) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if _, ok := st.requests[id]; !ok {
		return fmt.Errorf("auth request %q: %w", id, errNotFound)
	}
	st.codes[code] = id
	return nil
}

func (st *storage) DeleteAuthRequest(_ context.Context, id string) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	delete(st.requests, id)
	for code, rid := range st.codes {
		if rid == id {
			delete(st.codes, code)
		}
	}
	return nil
}

// login checks a user's credentials for an auth request and marks it done.
func (st *storage) login(username, password, id string) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	ar, ok := st.requests[id]
	if !ok {
		return errors.New("the sign-in request has expired or is unknown; start again")
	}
	u, ok := st.users[username]
	if !ok || subtle.ConstantTimeCompare([]byte(u.Password), []byte(password)) != 1 {
		return errors.New("wrong username or password")
	}
	ar.subject = u.Subject
	ar.done = true
	ar.authTime = time.Now()
	return nil
}

// grantOf describes what a token request grants and for which grant type.
func (st *storage) grantOf(ctx context.Context, req op.TokenRequest) (*grant, oidc.GrantType) {
	g := &grant{
		subject:  req.GetSubject(),
		audience: slices.Clone(req.GetAudience()),
		scopes:   slices.Clone(req.GetScopes()),
		authTime: time.Now(),
		expires:  time.Now().Add(st.lifetime),
	}
	switch r := req.(type) {
	case *authRequest:
		g.clientID, g.authTime, g.amr = r.clientID, r.authTime, r.GetAMR()
		return g, oidc.GrantTypeCode
	case *refreshRequest:
		g.clientID, g.authTime, g.amr = r.g.clientID, r.g.authTime, r.g.amr
		return g, oidc.GrantTypeRefreshToken
	case *clientCredentialsRequest:
		g.clientID = r.clientID
		return g, oidc.GrantTypeClientCredentials
	case op.TokenExchangeRequest:
		g.clientID, g.amr = r.GetClientID(), r.GetAMR()
		return g, oidc.GrantTypeTokenExchange
	}
	return g, oidc.GrantType("unknown")
}

func (st *storage) CreateAccessToken(ctx context.Context, req op.TokenRequest) (string, time.Time, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	g, gt := st.grantOf(ctx, req)
	id := rand.Text()
	st.access[id] = g
	st.issued[gt]++
	return id, g.expires, nil
}

func (st *storage) CreateAccessAndRefreshTokens(ctx context.Context, req op.TokenRequest, current string) (string, string, time.Time, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	g, gt := st.grantOf(ctx, req)
	if current != "" {
		if _, ok := st.refresh[current]; !ok {
			return "", "", time.Time{}, op.ErrInvalidRefreshToken
		}
		delete(st.refresh, current)
	}
	id := rand.Text()
	st.access[id] = g
	rt := rand.Text() + rand.Text()
	st.refresh[rt] = g
	st.issued[gt]++
	return id, rt, g.expires, nil
}

func (st *storage) TokenRequestByRefreshToken(_ context.Context, rt string) (op.RefreshTokenRequest, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	g, ok := st.refresh[rt]
	if !ok {
		return nil, op.ErrInvalidRefreshToken
	}
	return &refreshRequest{g: g, scopes: slices.Clone(g.scopes)}, nil
}

func (st *storage) TerminateSession(context.Context, string, string) error { return nil }

func (st *storage) RevokeToken(_ context.Context, tokenOrID, userID, clientID string) *oidc.Error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if g, ok := st.refresh[tokenOrID]; ok {
		if g.clientID != clientID {
			return oidc.ErrInvalidClient().WithDescription("token was not issued to this client")
		}
		delete(st.refresh, tokenOrID)
		return nil
	}
	if g, ok := st.access[tokenOrID]; ok {
		if g.clientID != clientID {
			return oidc.ErrInvalidClient().WithDescription("token was not issued to this client")
		}
		delete(st.access, tokenOrID)
	}
	return nil
}

func (st *storage) GetRefreshTokenInfo(_ context.Context, clientID, rt string) (string, string, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	g, ok := st.refresh[rt]
	if !ok {
		return "", "", op.ErrInvalidRefreshToken
	}
	return g.subject, rt, nil
}

func (st *storage) SigningKey(context.Context) (op.SigningKey, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	return opKey{st.keys[len(st.keys)-1]}, nil
}

func (st *storage) SignatureAlgorithms(context.Context) ([]jose.SignatureAlgorithm, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	return []jose.SignatureAlgorithm{st.alg}, nil
}

func (st *storage) KeySet(context.Context) ([]op.Key, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	keys := make([]op.Key, 0, len(st.keys))
	for _, k := range st.keys {
		keys = append(keys, publicKey{k})
	}
	return keys, nil
}

// --- OPStorage ---

func (st *storage) GetClientByClientID(_ context.Context, id string) (op.Client, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	c, ok := st.clients[id]
	if !ok {
		return nil, fmt.Errorf("client %q: %w", id, errNotFound)
	}
	return &opClient{c: c, issuer: st.issuer}, nil
}

func (st *storage) AuthorizeClientIDSecret(_ context.Context, id, secret string) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	c, ok := st.clients[id]
	if !ok || c.Secret == "" || subtle.ConstantTimeCompare([]byte(c.Secret), []byte(secret)) != 1 {
		return errors.New("wrong client_id or client_secret")
	}
	return nil
}

func (st *storage) SetUserinfoFromScopes(context.Context, *oidc.UserInfo, string, string, []string) error {
	return nil
}

// SetUserinfoFromRequest fills ID tokens.
func (st *storage) SetUserinfoFromRequest(_ context.Context, ui *oidc.UserInfo, req op.IDTokenRequest, _ []string) error {
	return st.setUserinfo(ui, req.GetSubject())
}

func (st *storage) setUserinfo(ui *oidc.UserInfo, sub string) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	ui.Subject = sub
	if u, ok := st.usersBySub[sub]; ok {
		ui.PreferredUsername = u.Username
		ui.Email = u.Email
		ui.EmailVerified = oidc.Bool(u.EmailVerified)
	}
	return nil
}

func (st *storage) SetUserinfoFromToken(_ context.Context, ui *oidc.UserInfo, tokenID, sub, _ string) error {
	st.mu.Lock()
	_, ok := st.access[tokenID]
	st.mu.Unlock()
	if !ok {
		return errors.New("token revoked or unknown")
	}
	return st.setUserinfo(ui, sub)
}

func (st *storage) SetIntrospectionFromToken(_ context.Context, resp *oidc.IntrospectionResponse, tokenID, sub, clientID string) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	g, ok := st.access[tokenID]
	if !ok || time.Now().After(g.expires) {
		return errors.New("token revoked, expired or unknown") // the op answers active: false
	}
	resp.Issuer = st.issuer
	resp.Subject = g.subject
	resp.Audience = slices.Clone(g.audience)
	resp.Scope = slices.Clone(g.scopes)
	resp.ClientID = g.clientID
	resp.Expiration = oidc.FromTime(g.expires)
	resp.JWTID = tokenID
	resp.TokenType = oidc.BearerToken
	if u, ok := st.usersBySub[g.subject]; ok {
		resp.Username = u.Username
		resp.Claims = userClaims(u)
	}
	return nil
}

func (st *storage) GetPrivateClaimsFromScopes(_ context.Context, sub, _ string, _ []string) (map[string]any, error) {
	return st.privateClaims(sub, nil), nil
}

// GetPrivateClaimsFromRequest fills JWT access tokens of the code, refresh
// and client credentials grants.
func (st *storage) GetPrivateClaimsFromRequest(_ context.Context, req op.TokenRequest, _ []string) (map[string]any, error) {
	return st.privateClaims(req.GetSubject(), req.GetScopes()), nil
}

func (st *storage) privateClaims(sub string, scopes []string) map[string]any {
	st.mu.Lock()
	defer st.mu.Unlock()
	c := map[string]any{}
	if u, ok := st.usersBySub[sub]; ok {
		c = userClaims(u)
	}
	if len(scopes) > 0 {
		c["scope"] = strings.Join(scopes, " ")
	}
	return c
}

func (st *storage) GetKeyByIDAndClientID(context.Context, string, string) (*jose.JSONWebKey, error) {
	return nil, errors.New("jwt profile grant not supported")
}

func (st *storage) ValidateJWTProfileScopes(context.Context, string, []string) ([]string, error) {
	return nil, errors.New("jwt profile grant not supported")
}

func (st *storage) Health(context.Context) error { return nil }

// --- ClientCredentialsStorage ---

func (st *storage) ClientCredentials(ctx context.Context, id, secret string) (op.Client, error) {
	if err := st.AuthorizeClientIDSecret(ctx, id, secret); err != nil {
		return nil, err
	}
	return st.GetClientByClientID(ctx, id)
}

func (st *storage) ClientCredentialsTokenRequest(ctx context.Context, id string, scopes []string) (op.TokenRequest, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	c, ok := st.clients[id]
	if !ok {
		return nil, fmt.Errorf("client %q: %w", id, errNotFound)
	}
	aud := resourcesFrom(ctx)
	if !validResource(aud) {
		return nil, oidc.ErrInvalidRequest().WithDescription("resource must be an absolute URI without a fragment (RFC 8707)")
	}
	if len(aud) == 0 {
		aud = defaultAudience(c)
	}
	return &clientCredentialsRequest{clientID: id, audience: aud, scopes: slices.Clone(scopes)}, nil
}

// --- TokenExchangeStorage ---

// ValidateTokenExchangeRequest accepts a subject token this server issued
// (checked by the op) and issues an access token for the requested
// resource or audience, or the client's default audience.
func (st *storage) ValidateTokenExchangeRequest(_ context.Context, req op.TokenExchangeRequest) error {
	if req.GetRequestedTokenType() == "" {
		req.SetRequestedTokenType(oidc.AccessTokenType)
	}
	if req.GetRequestedTokenType() != oidc.AccessTokenType {
		return oidc.ErrInvalidRequest().WithDescription("only access tokens are issued by token exchange here")
	}
	if !validResource(req.GetResourses()) {
		return oidc.ErrInvalidTarget().WithDescription("resource must be an absolute URI without a fragment (RFC 8707)")
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if _, ok := st.usersBySub[req.GetExchangeSubject()]; !ok {
		if _, ok := st.clients[req.GetExchangeSubject()]; !ok {
			return oidc.ErrInvalidRequest().WithDescription("unknown subject")
		}
	}
	req.SetCurrentScopes(req.GetScopes())
	return nil
}

func (st *storage) CreateTokenExchangeRequest(context.Context, op.TokenExchangeRequest) error {
	return nil
}

func (st *storage) GetPrivateClaimsFromTokenExchangeRequest(_ context.Context, req op.TokenExchangeRequest) (map[string]any, error) {
	return st.privateClaims(req.GetSubject(), req.GetScopes()), nil
}

func (st *storage) SetUserinfoFromTokenExchangeRequest(_ context.Context, ui *oidc.UserInfo, req op.TokenExchangeRequest) error {
	return st.setUserinfo(ui, req.GetSubject())
}

// --- request and key types ---

type authRequest struct {
	id          string
	created     time.Time
	clientID    string
	redirectURI string
	state       string
	nonce       string
	scopes      []string
	audience    []string
	respType    oidc.ResponseType
	respMode    oidc.ResponseMode
	challenge   *oidc.CodeChallenge
	subject     string
	done        bool
	authTime    time.Time
}

func (a *authRequest) GetID() string  { return a.id }
func (a *authRequest) GetACR() string { return "" }
func (a *authRequest) GetAMR() []string {
	if a.done {
		return []string{"pwd"}
	}
	return nil
}
func (a *authRequest) GetAudience() []string                 { return a.audience }
func (a *authRequest) GetAuthTime() time.Time                { return a.authTime }
func (a *authRequest) GetClientID() string                   { return a.clientID }
func (a *authRequest) GetCodeChallenge() *oidc.CodeChallenge { return a.challenge }
func (a *authRequest) GetNonce() string                      { return a.nonce }
func (a *authRequest) GetRedirectURI() string                { return a.redirectURI }
func (a *authRequest) GetResponseType() oidc.ResponseType    { return a.respType }
func (a *authRequest) GetResponseMode() oidc.ResponseMode    { return a.respMode }
func (a *authRequest) GetScopes() []string                   { return a.scopes }
func (a *authRequest) GetState() string                      { return a.state }
func (a *authRequest) GetSubject() string                    { return a.subject }
func (a *authRequest) Done() bool                            { return a.done }

type refreshRequest struct {
	g      *grant
	scopes []string
}

func (r *refreshRequest) GetAMR() []string            { return r.g.amr }
func (r *refreshRequest) GetAudience() []string       { return r.g.audience }
func (r *refreshRequest) GetAuthTime() time.Time      { return r.g.authTime }
func (r *refreshRequest) GetClientID() string         { return r.g.clientID }
func (r *refreshRequest) GetScopes() []string         { return r.scopes }
func (r *refreshRequest) GetSubject() string          { return r.g.subject }
func (r *refreshRequest) SetCurrentScopes(s []string) { r.scopes = s }

type clientCredentialsRequest struct {
	clientID string
	audience []string
	scopes   []string
}

func (r *clientCredentialsRequest) GetSubject() string    { return r.clientID }
func (r *clientCredentialsRequest) GetAudience() []string { return r.audience }
func (r *clientCredentialsRequest) GetScopes() []string   { return r.scopes }

type opKey struct{ k *signingKey }

func (k opKey) SignatureAlgorithm() jose.SignatureAlgorithm { return k.k.alg }
func (k opKey) Key() any                                    { return k.k.priv }
func (k opKey) ID() string                                  { return k.k.id }

type publicKey struct{ k *signingKey }

func (k publicKey) ID() string                         { return k.k.id }
func (k publicKey) Algorithm() jose.SignatureAlgorithm { return k.k.alg }
func (k publicKey) Use() string                        { return "sig" }
func (k publicKey) Key() any                           { return k.k.public() }

type opClient struct {
	c      *Client
	issuer string
}

func (c *opClient) GetID() string                    { return c.c.ID }
func (c *opClient) RedirectURIs() []string           { return c.c.RedirectURIs }
func (c *opClient) PostLogoutRedirectURIs() []string { return nil }
func (c *opClient) ApplicationType() op.ApplicationType {
	if c.c.Secret == "" {
		return op.ApplicationTypeNative
	}
	return op.ApplicationTypeWeb
}
func (c *opClient) AuthMethod() oidc.AuthMethod {
	if c.c.Secret == "" {
		return oidc.AuthMethodNone
	}
	return oidc.AuthMethodBasic
}
func (c *opClient) ResponseTypes() []oidc.ResponseType {
	return []oidc.ResponseType{oidc.ResponseTypeCode}
}
func (c *opClient) GrantTypes() []oidc.GrantType { return c.c.Grants }
func (c *opClient) LoginURL(id string) string {
	return c.issuer + "/login?authRequestID=" + id
}
func (c *opClient) AccessTokenType() op.AccessTokenType {
	if c.c.Opaque {
		return op.AccessTokenTypeBearer
	}
	return op.AccessTokenTypeJWT
}
func (c *opClient) IDTokenLifetime() time.Duration { return 5 * time.Minute }
func (c *opClient) DevMode() bool                  { return true }
func (c *opClient) RestrictAdditionalIdTokenScopes() func([]string) []string {
	return func(s []string) []string { return s }
}
func (c *opClient) RestrictAdditionalAccessTokenScopes() func([]string) []string {
	return func(s []string) []string { return s }
}
func (c *opClient) IsScopeAllowed(string) bool           { return true }
func (c *opClient) IDTokenUserinfoClaimsAssertion() bool { return false }
func (c *opClient) ClockSkew() time.Duration             { return 0 }
