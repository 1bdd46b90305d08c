package oauth_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/confidential-mcp/cmcp/internal/oauth"
	"github.com/confidential-mcp/cmcp/internal/oauthtest"
)

const resource = "http://127.0.0.1:9/mcp"

var (
	alice = oauthtest.User{Subject: "u-alice", Email: "Alice@Example.COM", EmailVerified: true, Groups: []string{"oncall", "eng", "eng"}, Password: "pw"}
	bob   = oauthtest.User{Subject: "u-bob", Email: "bob@example.com", EmailVerified: false}
	agent = oauthtest.Client{ID: "agent", RedirectURIs: []string{"http://127.0.0.1:1/cb"}}
)

func startOP(t *testing.T, opts oauthtest.Options) *oauthtest.Server {
	t.Helper()
	opts.Users = append(opts.Users, alice, bob)
	opts.Clients = append(opts.Clients, agent)
	return oauthtest.Start(t, opts)
}

func newVerifier(t testing.TB, s *oauthtest.Server, mod func(*oauth.Config)) *oauth.Verifier {
	t.Helper()
	cfg := oauth.Config{Issuer: s.Issuer, Resource: resource, IdentityClaim: "email", GroupsClaim: "groups", Scopes: []string{"mcp:tools"}, RefreshFloor: time.Hour}
	if mod != nil {
		mod(&cfg)
	}
	v, err := oauth.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func codeFlow(t *testing.T, s *oauthtest.Server, user, res string, scopes ...string) string {
	t.Helper()
	tok, err := s.CodeFlowToken(t.Context(), "agent", user, res, scopes...)
	if err != nil {
		t.Fatal(err)
	}
	return tok.AccessToken
}

func TestVerifyATokenFromTheAuthorizationServer(t *testing.T) {
	s := startOP(t, oauthtest.Options{})
	v := newVerifier(t, s, nil)
	id, err := v.Verify(t.Context(), codeFlow(t, s, alice.Email, resource, "mcp:tools", "extra"))
	if err != nil {
		t.Fatal(err)
	}
	if id.Name != "alice@example.com" || id.Subject != alice.Subject || id.Issuer != s.Issuer || id.JTI == "" || id.ClientID != "agent" {
		t.Errorf("identity = %+v", id)
	}
	if !slices.Equal(id.Groups, []string{"eng", "oncall"}) || !slices.Equal(id.Scopes, []string{"mcp:tools", "extra"}) {
		t.Errorf("groups %v, scopes %v", id.Groups, id.Scopes)
	}
	if time.Until(id.Expiry) < time.Minute {
		t.Errorf("expiry %v", id.Expiry)
	}
	// identity_claim sub names the account by its subject.
	vs := newVerifier(t, s, func(c *oauth.Config) { c.IdentityClaim = "sub"; c.GroupsClaim = "" })
	id, err = vs.Verify(t.Context(), codeFlow(t, s, bob.Email, resource, "mcp:tools"))
	if err != nil || id.Name != bob.Subject || id.Groups != nil {
		t.Errorf("sub identity = %+v, %v", id, err)
	}
}

// sign makes a compact JWS of claims with key under alg, with header
// fields extra (kid...). It is how an attacker makes tokens, with go-jose.
func sign(t *testing.T, alg jose.SignatureAlgorithm, key any, claims map[string]any, extra map[jose.HeaderKey]any) string {
	t.Helper()
	opts := &jose.SignerOptions{ExtraHeaders: extra}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: key}, opts)
	if err != nil {
		t.Fatal(err)
	}
	payload, _ := json.Marshal(claims)
	jws, err := signer.Sign(payload)
	if err != nil {
		t.Fatal(err)
	}
	out, err := jws.CompactSerialize()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func b64(v any) string {
	b, _ := json.Marshal(v)
	return base64.RawURLEncoding.EncodeToString(b)
}

// TestRefusedTokens: every token that does not prove an identity for this
// gateway is refused as invalid_token (401); a valid one without the
// required scope as insufficient_scope (403); and no error holds the token.
func TestRefusedTokens(t *testing.T) {
	s := startOP(t, oauthtest.Options{})
	other := oauthtest.Start(t, oauthtest.Options{Users: []oauthtest.User{alice}, Clients: []oauthtest.Client{agent}})
	v := newVerifier(t, s, nil)
	// Fetch the keys once so that the unknown-kid cases are refused by
	// the floor, not by a failed fetch.
	if _, err := v.Verify(t.Context(), codeFlow(t, s, alice.Email, resource, "mcp:tools")); err != nil {
		t.Fatal(err)
	}
	good := func() map[string]any { return s.Claims(alice.Subject, []string{resource}, "mcp:tools") }
	with := func(k string, val any) map[string]any { c := good(); c[k] = val; return c }
	signed := func(c map[string]any) string {
		tok, err := s.Sign(c)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	jwk := s.PublicJWK()
	spki, _ := x509.MarshalPKIXPublicKey(jwk.Key)
	pubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: spki})
	pubJWK, _ := jwk.MarshalJSON()
	attacker, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	attackerRSA, _ := rsa.GenerateKey(rand.Reader, 2048)
	kid := map[jose.HeaderKey]any{"kid": s.KeyID()}
	tampered := func() string {
		parts := strings.Split(signed(good()), ".")
		return parts[0] + "." + b64(with("sub", "u-mallory")) + "." + parts[2]
	}()

	for _, tc := range []struct {
		name, token string
		want        error
	}{
		{"forged: signed by another RSA key under the issuer's kid", sign(t, jose.RS256, attackerRSA, good(), kid), oauth.ErrInvalidToken},
		{"forged: ES256 under the issuer's RS256 kid", sign(t, jose.ES256, attacker, good(), kid), oauth.ErrInvalidToken},
		{"forged: another authorization server's token", codeFlow(t, other, alice.Email, resource, "mcp:tools"), oauth.ErrInvalidToken},
		{"tampered payload", tampered, oauth.ErrInvalidToken},
		{"expired", signed(with("exp", time.Now().Add(-2*time.Minute).Unix())), oauth.ErrInvalidToken},
		{"not yet valid", signed(with("nbf", time.Now().Add(5*time.Minute).Unix())), oauth.ErrInvalidToken},
		{"issued in the future", signed(with("iat", time.Now().Add(5*time.Minute).Unix())), oauth.ErrInvalidToken},
		{"no exp", signed(with("exp", nil)), oauth.ErrInvalidToken},
		{"wrong audience", codeFlow(t, s, alice.Email, "http://127.0.0.1:9/other", "mcp:tools"), oauth.ErrInvalidToken},
		{"no audience", signed(with("aud", nil)), oauth.ErrInvalidToken},
		{"wrong issuer", signed(with("iss", "https://evil.example")), oauth.ErrInvalidToken},
		{"alg none", b64(map[string]any{"alg": "none", "kid": s.KeyID()}) + "." + b64(good()) + ".", oauth.ErrInvalidToken},
		{"HMAC with the public key (PEM) as secret", sign(t, jose.HS256, pubPEM, good(), kid), oauth.ErrInvalidToken},
		{"HMAC with the public key (JWK) as secret", sign(t, jose.HS256, pubJWK, good(), kid), oauth.ErrInvalidToken},
		{"unverified email", signed(s.Claims(bob.Subject, []string{resource}, "mcp:tools")), oauth.ErrInvalidToken},
		{"no email", signed(with("email", nil)), oauth.ErrInvalidToken},
		{"groups not strings", signed(with("groups", []any{1, 2})), oauth.ErrInvalidToken},
		{"no sub", signed(with("sub", "")), oauth.ErrInvalidToken},
		{"garbage", "not.a.jwt", oauth.ErrInvalidToken},
		{"opaque", "2YotnFZFEjr1zCsicMWpAA", oauth.ErrInvalidToken},
		{"without the required scope", codeFlow(t, s, alice.Email, resource, "other"), oauth.ErrInsufficientScope},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, err := v.Verify(t.Context(), tc.token)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Verify = %+v, %v; want %v", id, err, tc.want)
			}
			if len(tc.token) > 8 && strings.Contains(err.Error(), tc.token) {
				t.Fatalf("the error holds the token: %v", err)
			}
			t.Log(err)
		})
	}
}

// TestAlgorithmAllowList: a token signed with an algorithm the verifier
// was not configured for is refused even with the issuer's real key.
func TestAlgorithmAllowList(t *testing.T) {
	s := startOP(t, oauthtest.Options{Algorithm: jose.ES256})
	v := newVerifier(t, s, func(c *oauth.Config) { c.Algorithms = []string{"RS256"} })
	_, err := v.Verify(t.Context(), codeFlow(t, s, alice.Email, resource, "mcp:tools"))
	if !errors.Is(err, oauth.ErrInvalidToken) {
		t.Fatalf("ES256 token with only RS256 allowed: %v", err)
	}
	for _, alg := range []string{"none", "HS256"} {
		if _, err := oauth.New(oauth.Config{Issuer: s.Issuer, Resource: resource, Algorithms: []string{alg}}); err == nil {
			t.Errorf("New accepted algorithm %s", alg)
		}
	}
}

// TestKeyRotationFetchesOnceAndTheFloorHolds: a token under a key the
// verifier has not seen makes it fetch the JWKS once more; then, within
// the floor, tokens with made-up key IDs fetch nothing.
func TestKeyRotationFetchesOnceAndTheFloorHolds(t *testing.T) {
	s := startOP(t, oauthtest.Options{})
	v := newVerifier(t, s, func(c *oauth.Config) { c.RefreshFloor = time.Nanosecond })
	if _, err := v.Verify(t.Context(), codeFlow(t, s, alice.Email, resource, "mcp:tools")); err != nil {
		t.Fatal(err)
	}
	// Discovery is one metadata GET, keys one JWKS GET.
	if n := s.JWKSFetches(); n != 1 {
		t.Fatalf("JWKS fetches after the first token: %d, want 1", n)
	}
	if _, err := s.RotateKey(); err != nil {
		t.Fatal(err)
	}
	s.RetireOldKeys()
	for range 3 {
		if _, err := v.Verify(t.Context(), codeFlow(t, s, alice.Email, resource, "mcp:tools")); err != nil {
			t.Fatalf("token under the rotated key: %v", err)
		}
	}
	if n := s.JWKSFetches(); n != 2 {
		t.Fatalf("JWKS fetches after rotation: %d, want 2 (one for the new kid)", n)
	}

	floored := newVerifier(t, s, func(c *oauth.Config) { c.RefreshFloor = time.Hour })
	if _, err := floored.Verify(t.Context(), codeFlow(t, s, alice.Email, resource, "mcp:tools")); err != nil {
		t.Fatal(err)
	}
	before := s.JWKSFetches()
	attacker, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	for i := range 50 {
		tok := sign(t, jose.ES256, attacker, s.Claims(alice.Subject, []string{resource}, "mcp:tools"), map[jose.HeaderKey]any{"kid": "made-up-" + string(rune('a'+i%26))})
		if _, err := floored.Verify(t.Context(), tok); !errors.Is(err, oauth.ErrInvalidToken) {
			t.Fatalf("made-up kid: %v", err)
		}
	}
	if n := s.JWKSFetches() - before; n != 0 {
		t.Fatalf("50 tokens with made-up key IDs within the floor fetched the JWKS %d times, want 0", n)
	}
}

func TestDiscoveryOfAnIssuerUnderAPath(t *testing.T) {
	s := startOP(t, oauthtest.Options{IssuerPath: "/tenant1"})
	v := newVerifier(t, s, nil)
	if err := v.Prefetch(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(t.Context(), codeFlow(t, s, alice.Email, resource, "mcp:tools")); err != nil {
		t.Fatal(err)
	}
	// The configured issuer must be the metadata's exactly.
	bad, err := oauth.New(oauth.Config{Issuer: s.Issuer + "/", Resource: resource})
	if err != nil {
		t.Fatal(err)
	}
	if err := bad.Prefetch(t.Context()); !errors.Is(err, oauth.ErrUnavailable) || !strings.Contains(err.Error(), "names issuer") {
		t.Fatalf("Prefetch with a different issuer: %v", err)
	}
}

func TestUnreachableIssuerIsUnavailableNotInvalid(t *testing.T) {
	s := startOP(t, oauthtest.Options{})
	tok := codeFlow(t, s, alice.Email, resource, "mcp:tools")
	v := newVerifier(t, s, nil)
	s.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := v.Verify(ctx, tok); !errors.Is(err, oauth.ErrUnavailable) {
		t.Fatalf("Verify with the issuer down: %v, want ErrUnavailable", err)
	}
}

// TestCachedTokensStillExpireAndLoseTheirKey: a token verified once is
// remembered, but past its expiry (plus skew) it is refused as any expired
// token, and once its key is no longer published (rotated out and the JWKS
// fetched again) it is refused too.
func TestCachedTokensStillExpireAndLoseTheirKey(t *testing.T) {
	s := startOP(t, oauthtest.Options{})
	var now atomic.Pointer[time.Time]
	t0 := time.Now()
	now.Store(&t0)
	v := newVerifier(t, s, func(c *oauth.Config) {
		c.Now = func() time.Time { return *now.Load() }
		c.RefreshFloor = time.Nanosecond
		c.ClockSkew = 10 * time.Second
	})
	c := s.Claims(alice.Subject, []string{resource}, "mcp:tools")
	c["exp"] = t0.Add(time.Minute).Unix()
	tok, err := s.Sign(c)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := v.Verify(t.Context(), tok); err != nil {
			t.Fatal(err)
		}
	}
	later := t0.Add(time.Minute + 11*time.Second)
	now.Store(&later)
	if _, err := v.Verify(t.Context(), tok); !errors.Is(err, oauth.ErrInvalidToken) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("cached token past its expiry: %v", err)
	}
	now.Store(&t0)

	tok, err = s.Sign(s.Claims(alice.Subject, []string{resource}, "mcp:tools"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(t.Context(), tok); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RotateKey(); err != nil {
		t.Fatal(err)
	}
	s.RetireOldKeys()
	// A token under the new key makes the verifier fetch the JWKS, which
	// no longer holds the old key.
	if _, err := v.Verify(t.Context(), codeFlow(t, s, alice.Email, resource, "mcp:tools")); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(t.Context(), tok); !errors.Is(err, oauth.ErrInvalidToken) {
		t.Fatalf("cached token whose key was retired: %v", err)
	}
}
