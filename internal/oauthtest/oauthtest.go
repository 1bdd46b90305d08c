// Package oauthtest runs a real OAuth 2.1 / OpenID Connect authorization
// server for tests: zitadel/oidc's op package (the provider, its token,
// authorize, JWKS, introspection and revocation endpoints) over an in-memory
// storage, served over real HTTP on 127.0.0.1.
//
// It issues JWT access tokens (or opaque ones, per client) whose audience,
// scopes, email, email_verified, groups and lifetime the test chooses; it runs
// the authorization code flow with PKCE (the login page is a plain HTML form
// that [Browser] drives as a browser would), the client credentials grant,
// refresh tokens and RFC 8693 token exchange; and it rotates its signing
// keys. It also serves the RFC 8414 authorization server metadata beside the
// OpenID discovery document.
//
// The package is for tests only: nothing the cmcp binary links imports it.
package oauthtest

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"
)

// A User can sign in at the login page and is the subject of the tokens
// issued for it.
type User struct {
	// Subject is the token's sub claim. Required.
	Subject string
	// Username is what the login form takes; it defaults to Email, then to
	// Subject.
	Username string
	// Password for the login form. Empty means "password".
	Password string
	// Email and EmailVerified become the email and email_verified claims
	// of access and ID tokens (omitted when Email is empty).
	Email         string
	EmailVerified bool
	// Groups becomes the groups claim (omitted when empty).
	Groups []string
	// Claims are extra claims put into this user's access tokens.
	Claims map[string]any
}

// A Client is an OAuth client registered at the server.
type Client struct {
	// ID is the client_id. Required.
	ID string
	// Secret makes a confidential client (client_secret_basic or _post);
	// empty makes a public client, which must use PKCE.
	Secret string
	// RedirectURIs the authorization code flow may return to.
	RedirectURIs []string
	// Grants the client may use. Empty means: authorization_code and
	// refresh_token, plus client_credentials and token_exchange for a
	// confidential client.
	Grants []oidc.GrantType
	// Opaque makes the client's access tokens opaque (checked by RFC 7662
	// introspection) instead of JWTs.
	Opaque bool
	// Audience of tokens issued when the request names no resource (RFC
	// 8707) or audience. Empty means the client ID.
	Audience []string
}

// Options configures a Server.
type Options struct {
	Users   []User
	Clients []Client
	// TokenLifetime of access tokens; zero means 5 minutes.
	TokenLifetime time.Duration
	// Algorithm of the signing keys: jose.RS256 (the default) or jose.ES256.
	Algorithm jose.SignatureAlgorithm
	// IssuerPath puts the issuer under a path ("/tenant1"), to test RFC 8414
	// path-inserted metadata discovery.
	IssuerPath string
	// Addr is the address to listen on ("": 127.0.0.1, a free port).
	Addr string
}

// Server is a running authorization server.
type Server struct {
	// Issuer is the issuer URL: http://127.0.0.1:<port>[IssuerPath].
	Issuer string

	http    *httptest.Server
	st      *storage
	prov    *op.Provider
	prefix  string
	handler http.Handler
}

// Start runs a server until the test ends.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	s, err := New(opts)
	if err != nil {
		t.Fatalf("start test authorization server: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// New runs a server until Close.
func New(opts Options) (*Server, error) {
	if opts.TokenLifetime == 0 {
		opts.TokenLifetime = 5 * time.Minute
	}
	if opts.Algorithm == "" {
		opts.Algorithm = jose.RS256
	}
	if opts.IssuerPath != "" && (!strings.HasPrefix(opts.IssuerPath, "/") || strings.HasSuffix(opts.IssuerPath, "/")) {
		return nil, fmt.Errorf("issuer path %q: want a path starting, and not ending, with /", opts.IssuerPath)
	}
	s := &Server{prefix: opts.IssuerPath}
	s.http = httptest.NewUnstartedServer(http.HandlerFunc(s.serveHTTP))
	if opts.Addr != "" {
		l, err := net.Listen("tcp", opts.Addr)
		if err != nil {
			s.http.Listener.Close()
			return nil, err
		}
		s.http.Listener.Close()
		s.http.Listener = l
	}
	s.Issuer = "http://" + s.http.Listener.Addr().String() + opts.IssuerPath

	st, err := newStorage(s.Issuer, opts)
	if err != nil {
		s.http.Listener.Close()
		return nil, err
	}
	s.st = st
	var cryptoKey [32]byte
	if _, err := io.ReadFull(rand.Reader, cryptoKey[:]); err != nil {
		s.http.Listener.Close()
		return nil, err
	}
	prov, err := op.NewProvider(&op.Config{
		CryptoKey:             cryptoKey,
		CodeMethodS256:        true,
		AuthMethodPost:        true,
		GrantTypeRefreshToken: true,
	}, st, op.StaticIssuer(s.Issuer),
		op.WithAllowInsecure(),
		op.WithLogger(slog.New(slog.DiscardHandler)),
	)
	if err != nil {
		s.http.Listener.Close()
		return nil, fmt.Errorf("create provider: %w", err)
	}
	s.prov = prov
	mux := http.NewServeMux()
	mux.HandleFunc("GET /login", s.loginPage)
	mux.HandleFunc("POST /login", op.NewIssuerInterceptor(prov.IssuerFromRequest).HandlerFunc(s.loginSubmit))
	mux.Handle("/", withResource(prov))
	s.handler = mux
	s.http.Start()
	return s, nil
}

// serveHTTP strips the issuer path and answers RFC 8414 metadata requests
// (/.well-known/oauth-authorization-server[path]) with the provider's
// discovery document.
func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/.well-known/oauth-authorization-server"+s.prefix {
		r2 := r.Clone(r.Context())
		r2.URL.Path = "/.well-known/openid-configuration"
		s.handler.ServeHTTP(w, r2)
		return
	}
	if s.prefix != "" {
		rest, ok := strings.CutPrefix(r.URL.Path, s.prefix)
		if !ok || (rest != "" && rest[0] != '/') {
			http.NotFound(w, r)
			return
		}
		r2 := r.Clone(r.Context())
		r2.URL.Path = rest
		r2.URL.RawPath = ""
		r = r2
	}
	if r.URL.Path == "/keys" && r.Method == http.MethodGet {
		s.st.mu.Lock()
		s.st.jwksFetches++
		s.st.mu.Unlock()
	}
	s.handler.ServeHTTP(w, r)
}

// Close stops the server.
func (s *Server) Close() { s.http.Close() }

// URL returns the issuer URL joined with path ("/oauth/token").
func (s *Server) URL(path string) string { return s.Issuer + path }

// AuthorizationEndpoint, TokenEndpoint, JWKSURL, IntrospectionEndpoint and
// RevocationEndpoint are the provider's endpoint URLs.
func (s *Server) AuthorizationEndpoint() string { return s.URL("/authorize") }
func (s *Server) TokenEndpoint() string         { return s.URL("/oauth/token") }
func (s *Server) JWKSURL() string               { return s.URL("/keys") }
func (s *Server) IntrospectionEndpoint() string { return s.URL("/oauth/introspect") }
func (s *Server) RevocationEndpoint() string    { return s.URL("/revoke") }

// AddUser registers (or replaces) a user.
func (s *Server) AddUser(u User) { s.st.addUser(u) }

// AddClient registers (or replaces) a client.
func (s *Server) AddClient(c Client) { s.st.addClient(c) }

// SetTokenLifetime changes the lifetime of access tokens issued from now on.
func (s *Server) SetTokenLifetime(d time.Duration) {
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	s.st.lifetime = d
}

// RotateKey makes a new signing key current and returns its key ID. The
// previous keys stay in the JWKS (tokens they signed still verify) until
// RetireOldKeys.
func (s *Server) RotateKey() (string, error) { return s.st.rotate() }

// RetireOldKeys removes every key but the current one from the JWKS.
func (s *Server) RetireOldKeys() { s.st.retire() }

// KeyID is the current signing key's ID.
func (s *Server) KeyID() string {
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	return s.st.keys[len(s.st.keys)-1].id
}

// PublicJWK is the current signing key's public half, as published.
func (s *Server) PublicJWK() jose.JSONWebKey {
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	k := s.st.keys[len(s.st.keys)-1]
	return jose.JSONWebKey{Key: k.public(), KeyID: k.id, Algorithm: string(k.alg), Use: "sig"}
}

// SubjectOf returns a check of the access tokens this server issues for
// audience, as a resource server makes it (credtest.Upstream.Trust): the
// token is an RS256 JWT signed with the current key, of this issuer, for
// audience, and valid now; it returns the subject.
func (s *Server) SubjectOf(audience string) func(raw string) (string, error) {
	return func(raw string) (string, error) {
		tok, err := jwt.ParseSigned(raw, []jose.SignatureAlgorithm{jose.RS256})
		if err != nil {
			return "", err
		}
		var std jwt.Claims
		if err := tok.Claims(s.PublicJWK(), &std); err != nil {
			return "", err
		}
		if err := std.Validate(jwt.Expected{Issuer: s.Issuer, AnyAudience: jwt.Audience{audience}, Time: time.Now()}); err != nil {
			return "", err
		}
		return std.Subject, nil
	}
}

// Issued counts the access tokens issued so far for a grant type
// (authorization_code, refresh_token, client_credentials,
// urn:ietf:params:oauth:grant-type:token-exchange).
func (s *Server) Issued(grant oidc.GrantType) int {
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	return s.st.issued[grant]
}

// JWKSFetches counts GET requests to the JWKS endpoint.
func (s *Server) JWKSFetches() int {
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	return s.st.jwksFetches
}

// Claims returns the claims the server puts into an access token for the
// user with subject sub (sub need not be registered): iss, sub, aud, exp
// (now + the token lifetime), iat, nbf, jti, client_id, scope and the user's
// email, email_verified, groups and extra claims. Change them and Sign the
// result to make tokens a flow would not issue (expired, other audience).
func (s *Server) Claims(sub string, aud []string, scopes ...string) map[string]any {
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	now := time.Now()
	c := map[string]any{
		"iss":       s.Issuer,
		"sub":       sub,
		"aud":       aud,
		"exp":       now.Add(s.st.lifetime).Unix(),
		"iat":       now.Unix(),
		"nbf":       now.Unix(),
		"jti":       rand.Text(),
		"client_id": "oauthtest",
	}
	if len(scopes) > 0 {
		c["scope"] = strings.Join(scopes, " ")
	}
	if u, ok := s.st.usersBySub[sub]; ok {
		for k, v := range userClaims(u) {
			c[k] = v
		}
	}
	return c
}

// Sign signs claims with the current signing key (its kid in the header),
// as the token endpoint would.
func (s *Server) Sign(claims map[string]any) (string, error) {
	sk, err := s.st.SigningKey(context.Background())
	if err != nil {
		return "", err
	}
	signer, err := op.SignerFromKey(sk)
	if err != nil {
		return "", err
	}
	payload, err := json.Marshal(claims)
	if err != nil {
		return "", err
	}
	jws, err := signer.Sign(payload)
	if err != nil {
		return "", err
	}
	return jws.CompactSerialize()
}

// resourceKey carries the RFC 8707 resource parameters of an authorize or
// token request to the storage (zitadel's op does not read them).
type resourceKey struct{}

func withResource(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := r.ParseForm(); err == nil {
			if res := r.Form["resource"]; len(res) > 0 {
				r = r.WithContext(context.WithValue(r.Context(), resourceKey{}, slices.Clone(res)))
			}
		}
		next.ServeHTTP(w, r)
	})
}

func resourcesFrom(ctx context.Context) []string {
	res, _ := ctx.Value(resourceKey{}).([]string)
	return res
}

// validResource reports whether every resource is an absolute URI without
// a fragment (RFC 8707 section 2).
func validResource(res []string) bool {
	for _, r := range res {
		u, err := url.Parse(r)
		if err != nil || !u.IsAbs() || u.Fragment != "" {
			return false
		}
	}
	return true
}
