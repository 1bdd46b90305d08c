package gateway

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"

	"github.com/confidential-mcp/cmcp/internal/oauth"
	"github.com/confidential-mcp/cmcp/internal/oauthtest"
	"github.com/confidential-mcp/cmcp/internal/policy"
)

var (
	opAlice = oauthtest.User{Subject: "u-alice", Email: "Alice@Example.com", EmailVerified: true, Groups: []string{"ops"}, Password: "alice-pw"}
	opBob   = oauthtest.User{Subject: "u-bob", Email: "bob@example.com", EmailVerified: true, Password: "bob-pw"}
	opAgent = oauthtest.Client{ID: "agent", RedirectURIs: []string{"http://127.0.0.1:1/callback"}}
)

// oauthGateway is a gateway whose HTTP front accepts the test authorization
// server's tokens (identity: verified email, groups: groups claim, scope
// mcp:tools required) beside a static token for "static-agent", under the
// allow-list policy (group ops may do everything).
type oauthGateway struct {
	*harness
	op       *oauthtest.Server
	resource string
}

func newOAuthGateway(t *testing.T) *oauthGateway {
	t.Helper()
	op := oauthtest.Start(t, oauthtest.Options{Users: []oauthtest.User{opAlice, opBob}, Clients: []oauthtest.Client{opAgent}})
	b, err := policy.Load(context.Background(), "../../examples/policy/allow-list", policy.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	og := &oauthGateway{op: op}
	og.harness = newHarness(t, hconf{
		tokens: []Token{{Identity: "static-agent", Digest: TokenDigest("static-secret")}},
		policy: policy.NewEngine(b, policy.Enforcing, map[string][]string{"ops": {"static-agent"}}),
		oauth: func(resource string) *oauth.Verifier {
			og.resource = resource
			v, err := oauth.New(oauth.Config{Issuer: op.Issuer, Resource: resource, IdentityClaim: "email", GroupsClaim: "groups", Scopes: []string{"mcp:tools"}})
			if err != nil {
				t.Fatal(err)
			}
			return v
		},
	})
	return og
}

// token runs the code flow for user and returns the access token.
func (og *oauthGateway) token(t *testing.T, user oauthtest.User, resource string, scopes ...string) string {
	t.Helper()
	if len(scopes) == 0 {
		scopes = []string{"mcp:tools"}
	}
	tok, err := og.op.CodeFlowToken(t.Context(), "agent", user.Email, resource, scopes...)
	if err != nil {
		t.Fatal(err)
	}
	return tok.AccessToken
}

// TestOAuthAgentSignsInWithGoSDK: go-sdk's MCP client, with go-sdk's own
// OAuth handler, meets the gateway's 401, reads its Protected Resource
// Metadata, signs in at the authorization server (PKCE and resource; the
// login form posted as a person would) and calls a tool as the verified
// identity, whose groups claim made it a member of ops for the policy. The
// session record names the identity, the issuer and the token's jti; the
// token itself is in no record and no log line.
func TestOAuthAgentSignsInWithGoSDK(t *testing.T) {
	og := newOAuthGateway(t)
	var logins int
	h, err := auth.NewAuthorizationCodeHandler(&auth.AuthorizationCodeHandlerConfig{
		PreregisteredClient: &oauthex.ClientCredentials{ClientID: "agent"},
		RedirectURL:         opAgent.RedirectURIs[0],
		AuthorizationCodeFetcher: func(ctx context.Context, a *auth.AuthorizationArgs) (*auth.AuthorizationResult, error) {
			logins++
			back, err := (&oauthtest.Browser{}).SignIn(ctx, a.URL, opAlice.Email, opAlice.Password)
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
	client := mcp.NewClient(&mcp.Implementation{Name: "oauth-agent", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: og.url, OAuthHandler: h, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatalf("connect through go-sdk's OAuth handler: %v", err)
	}
	defer cs.Close()
	res, err := call(t, cs, "t__echo", map[string]any{"text": "hi"})
	if err != nil || res.IsError {
		t.Fatalf("call as alice (ops by her token): %+v, %v", res, err)
	}
	if logins != 1 {
		t.Errorf("%d logins, want 1", logins)
	}
	ts, err := h.TokenSource(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := ts.Token()
	if err != nil {
		t.Fatal(err)
	}
	jti := jwtClaim(t, tok.AccessToken, "jti")

	rs := og.records()
	starts := kinds(rs, "session")
	if len(starts) == 0 {
		t.Fatal("no session record")
	}
	sb := starts[0].Body
	if sb["agent"] != "alice@example.com" || sb["issuer"] != og.op.Issuer || sb["token_id"] != jti || !slices.Equal(anyStrings(sb["groups"]), []string{"ops"}) {
		t.Errorf("session record %v: want agent alice@example.com, issuer %s, token_id %s, groups [ops]", sb, og.op.Issuer, jti)
	}
	calls := kinds(rs, "call")
	if len(calls) != 1 || calls[0].Body["agent"] != "alice@example.com" || calls[0].Body["decision"] != "allow" {
		t.Fatalf("call records %v", calls)
	}
	if pi, _ := calls[0].Body["policy_input"].(map[string]any); !slices.Equal(anyStrings(pi["groups"]), []string{"ops"}) {
		t.Errorf("policy_input %v: want groups [ops]", pi)
	}
	noTokenAnywhere(t, og.harness, tok.AccessToken)
}

func anyStrings(v any) []string {
	l, _ := v.([]any)
	out := make([]string, 0, len(l))
	for _, s := range l {
		out = append(out, s.(string))
	}
	return out
}

// jwtClaim reads a claim of a token the test itself got (unverified).
func jwtClaim(t *testing.T, tok, name string) any {
	t.Helper()
	parts := strings.Split(tok, ".")
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var c map[string]any
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	return c[name]
}

// noTokenAnywhere: the token (or its signature, the part a log could
// carry alone) is in no audit file and no log line.
func noTokenAnywhere(t *testing.T, h *harness, tok string) {
	t.Helper()
	sig := tok[strings.LastIndex(tok, ".")+1:]
	err := filepath.WalkDir(h.dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if strings.Contains(string(b), sig) {
			t.Errorf("%s holds the access token", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(h.logs.String(), sig) {
		t.Error("the gateway's log holds the access token")
	}
}

// post sends an initialize (or, with a session, a ping) with the token
// and returns the response.
func post(t *testing.T, url, token, session string) (*http.Response, string) {
	t.Helper()
	body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`
	if session != "" {
		body = `{"jsonrpc":"2.0","id":2,"method":"ping"}`
	}
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if session != "" {
		req.Header.Set("Mcp-Session-Id", session)
		req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	return res, string(b)
}

// TestOAuthRefusalsAtTheFront: each token that proves nothing here is
// refused with 401 invalid_token and the RFC 9728 challenge, a request
// without one with the bare challenge, a valid token without the scope
// with 403 insufficient_scope; a static token still works beside OAuth,
// and the metadata is served where the challenge says.
func TestOAuthRefusalsAtTheFront(t *testing.T) {
	og := newOAuthGateway(t)
	other := oauthtest.Start(t, oauthtest.Options{Users: []oauthtest.User{opAlice}, Clients: []oauthtest.Client{opAgent}})
	metaURL := oauth.ResourceMetadataURL(og.resource)

	good := func() map[string]any { return og.op.Claims(opAlice.Subject, []string{og.resource}, "mcp:tools") }
	with := func(k string, v any) map[string]any { c := good(); c[k] = v; return c }
	signed := func(c map[string]any) string {
		tok, err := og.op.Sign(c)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	b64 := func(v any) string { b, _ := json.Marshal(v); return base64.RawURLEncoding.EncodeToString(b) }
	jwk := og.op.PublicJWK()
	spki, _ := x509.MarshalPKIXPublicKey(jwk.Key)
	pubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: spki})
	hmacWithPublicKey := func() string {
		s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.HS256, Key: pubPEM}, (&jose.SignerOptions{}).WithHeader("kid", og.op.KeyID()))
		if err != nil {
			t.Fatal(err)
		}
		p, _ := json.Marshal(good())
		jws, _ := s.Sign(p)
		out, _ := jws.CompactSerialize()
		return out
	}()
	forged := func() string {
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		s, _ := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: k}, (&jose.SignerOptions{}).WithHeader("kid", og.op.KeyID()))
		p, _ := json.Marshal(good())
		jws, _ := s.Sign(p)
		out, _ := jws.CompactSerialize()
		return out
	}()

	for _, tc := range []struct {
		name, token string
		status      int
		challenge   []string // in WWW-Authenticate
	}{
		{"no token", "", 401, []string{`resource_metadata="` + metaURL + `"`, `scope="mcp:tools"`}},
		{"forged", forged, 401, []string{`error="invalid_token"`, `resource_metadata="` + metaURL + `"`}},
		{"another authorization server", og.tokenFrom(t, other), 401, []string{`error="invalid_token"`}},
		{"expired", signed(with("exp", time.Now().Add(-time.Hour).Unix())), 401, []string{`error="invalid_token"`, "expired"}},
		{"wrong audience", og.token(t, opAlice, "http://127.0.0.1:9/elsewhere"), 401, []string{`error="invalid_token"`, "audience"}},
		{"wrong issuer", signed(with("iss", "https://evil.example")), 401, []string{`error="invalid_token"`, "issued by"}},
		{"alg none", b64(map[string]any{"alg": "none", "kid": og.op.KeyID()}) + "." + b64(good()) + ".", 401, []string{`error="invalid_token"`}},
		{"HMAC with the public key", hmacWithPublicKey, 401, []string{`error="invalid_token"`}},
		{"not a token at all", "hello", 401, []string{`error="invalid_token"`}},
		{"without the scope", og.token(t, opAlice, og.resource, "other"), 403, []string{`error="insufficient_scope"`, `scope="mcp:tools"`, `resource_metadata="` + metaURL + `"`}},
		{"a static token", "static-secret", 200, nil},
		{"a good OAuth token", og.token(t, opAlice, og.resource), 200, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, body := post(t, og.url, tc.token, "")
			if res.StatusCode != tc.status {
				t.Fatalf("status %d (%s), want %d", res.StatusCode, body, tc.status)
			}
			wa := res.Header.Get("WWW-Authenticate")
			for _, w := range tc.challenge {
				if !strings.Contains(wa, w) {
					t.Errorf("WWW-Authenticate %q lacks %q", wa, w)
				}
			}
			if tc.token == "" && strings.Contains(wa, "error=") {
				t.Errorf("a request without a token got an error code: %q", wa)
			}
		})
	}

	// The metadata the challenge names.
	res, err := http.Get(metaURL)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var prm oauthex.ProtectedResourceMetadata
	if err := json.NewDecoder(res.Body).Decode(&prm); err != nil {
		t.Fatal(err)
	}
	if prm.Resource != og.resource || !slices.Equal(prm.AuthorizationServers, []string{og.op.Issuer}) || !slices.Equal(prm.ScopesSupported, []string{"mcp:tools"}) {
		t.Fatalf("metadata %+v", prm)
	}
}

func (og *oauthGateway) tokenFrom(t *testing.T, op *oauthtest.Server) string {
	t.Helper()
	tok, err := op.CodeFlowToken(t.Context(), "agent", opAlice.Email, og.resource, "mcp:tools")
	if err != nil {
		t.Fatal(err)
	}
	return tok.AccessToken
}

// TestOAuthSessionIsBoundToItsIdentity: a session belongs to the identity
// whose token opened it. Bob's valid token on Alice's session is refused
// (403, hijack); Alice's expired token ends the request (401); a fresh
// token of hers (refreshed: another jti) continues the session, and the
// log records it as a session token event.
func TestOAuthSessionIsBoundToItsIdentity(t *testing.T) {
	og := newOAuthGateway(t)
	alice := og.token(t, opAlice, og.resource)
	res, body := post(t, og.url, alice, "")
	sid := res.Header.Get("Mcp-Session-Id")
	if res.StatusCode != 200 || sid == "" {
		t.Fatalf("initialize as alice: %d %s", res.StatusCode, body)
	}
	// Alice's session is started once the client says it is initialized.
	req, _ := http.NewRequest(http.MethodPost, og.url, strings.NewReader(`{"jsonrpc":"2.0","method":"notifications/initialized"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+alice)
	req.Header.Set("Mcp-Session-Id", sid)
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	if r, err := http.DefaultClient.Do(req); err != nil || r.StatusCode/100 != 2 {
		t.Fatalf("initialized: %v %v", r, err)
	} else {
		r.Body.Close()
	}

	bob := og.token(t, opBob, og.resource)
	if res, body := post(t, og.url, bob, sid); res.StatusCode != http.StatusForbidden || !strings.Contains(body, "belongs to another identity") {
		t.Fatalf("bob on alice's session: %d %s, want 403", res.StatusCode, body)
	}
	expired := og.op.Claims(opAlice.Subject, []string{og.resource}, "mcp:tools")
	expired["exp"] = time.Now().Add(-time.Hour).Unix()
	old, err := og.op.Sign(expired)
	if err != nil {
		t.Fatal(err)
	}
	if res, body := post(t, og.url, old, sid); res.StatusCode != http.StatusUnauthorized || !strings.Contains(res.Header.Get("WWW-Authenticate"), "expired") {
		t.Fatalf("alice's expired token on her session: %d %s %q, want 401 expired", res.StatusCode, body, res.Header.Get("WWW-Authenticate"))
	}
	fresh := og.token(t, opAlice, og.resource)
	if res, body := post(t, og.url, fresh, sid); res.StatusCode != 200 {
		t.Fatalf("alice's fresh token on her session: %d %s", res.StatusCode, body)
	}
	var events []string
	for _, r := range kinds(og.records(), "session") {
		if r.Body["id"] == sid {
			events = append(events, r.Body["event"].(string)+":"+r.Body["token_id"].(string))
		}
	}
	want := []string{"start:" + jwtClaim(t, alice, "jti").(string), "token:" + jwtClaim(t, fresh, "jti").(string)}
	if !slices.Equal(events, want) {
		t.Fatalf("session records %v, want %v", events, want)
	}
}
