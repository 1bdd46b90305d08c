// Package oauth makes the gateway an OAuth 2.1 resource server, as the MCP
// authorization spec asks: it verifies agents' JWT access tokens offline
// against the issuer's JWKS (cached, fetched again on an unknown key ID but
// never more often than a floor), accepting public-key algorithms only
// (never "none", never HMAC), checking iss, aud (this gateway's resource
// URL, RFC 8707), exp, nbf and iat with a small skew, and the required
// scopes; it names the verified identity (sub, or a verified email) and
// its groups; and it answers refused requests as RFC 6750 and RFC 9728
// say (WWW-Authenticate with resource_metadata, 403 insufficient_scope)
// and serves the Protected Resource Metadata.
//
// All JOSE is go-jose's (github.com/go-jose/go-jose/v4); nothing here
// parses or checks a signature by hand.
package oauth

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// Errors of Verify. ErrInvalidToken and ErrInsufficientScope are the RFC
// 6750 error codes (401 and 403); ErrUnavailable means the issuer's keys
// could not be had, so no token can be checked (503).
var (
	ErrInvalidToken      = errors.New("invalid_token")
	ErrInsufficientScope = errors.New("insufficient_scope")
	ErrUnavailable       = errors.New("authorization server keys unavailable")
)

// PublicKeyAlgorithms are the JWS algorithms a Verifier may accept, and
// its default: public-key signatures only. "none" and the HMAC algorithms
// (HS256...) never are: a verifier that takes HMAC can be fed a token
// "signed" with the issuer's public key as the secret. (server.oauth's
// list, config.OAuthAlgorithms, is the same: TestOAuthAlgorithmListsAgree.)
var PublicKeyAlgorithms = []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}

// The defaults of Config.
const (
	DefaultClockSkew    = 30 * time.Second
	DefaultRefreshFloor = 30 * time.Second
)

// Config configures a Verifier.
type Config struct {
	// Issuer is the authorization server's issuer URL: tokens' iss must be
	// exactly this.
	Issuer string
	// Resource is this gateway's resource URL: tokens' aud must include it
	// (a trailing slash aside).
	Resource string
	// IdentityClaim is "sub" (the default) or "email".
	IdentityClaim string
	// GroupsClaim names a claim holding the identity's groups ("" none).
	GroupsClaim string
	// Scopes are all required.
	Scopes []string
	// JWKSURI is where the issuer's keys are; "" discovers it from the
	// issuer's metadata (RFC 8414, then OpenID discovery).
	JWKSURI string
	// Algorithms are the accepted JWS algorithms; empty means
	// PublicKeyAlgorithms. "none" and HMAC are refused by New.
	Algorithms []string
	// ClockSkew is the leeway on exp, nbf and iat (0: 30s).
	ClockSkew time.Duration
	// RefreshFloor is the least time between two JWKS fetches (0: 30s).
	RefreshFloor time.Duration
	// MaxAge is how long a fetched JWKS is used before it is fetched again
	// in the background (0: 1 hour).
	MaxAge time.Duration
	// HTTPClient fetches metadata and keys (nil: a client with a 10s
	// timeout).
	HTTPClient *http.Client
	// Now is the clock tokens' exp, nbf and iat are checked against (nil:
	// time.Now). The JWKS floor and age are always in real time.
	Now func() time.Time
	// CacheSize bounds the verified-token cache (0: 4096; negative: no
	// cache). An agent sends the same access token on every request: a
	// token seen before is looked up by its SHA-256 instead of having its
	// signature checked again; its expiry, and that its key is still
	// published, are checked on every hit.
	CacheSize int
}

// Identity is what a verified access token says about its bearer.
type Identity struct {
	// Name is the identity the gateway knows the agent by: the sub claim,
	// or the email claim lower-cased (only when email_verified is true).
	Name string
	// Subject is the sub claim.
	Subject string
	// Issuer is the iss claim.
	Issuer string
	// JTI is the token's jti claim ("" when it has none).
	JTI string
	// ClientID is the client_id (or azp) claim.
	ClientID string
	// Groups are the groups claim's values, sorted, without duplicates.
	Groups []string
	// Scopes are the token's scopes (scope, or scp).
	Scopes []string
	// Expiry is the exp claim.
	Expiry time.Time
}

// Verifier checks access tokens. It is safe for concurrent use.
type Verifier struct {
	cfg   Config
	algs  []jose.SignatureAlgorithm
	keys  *keyCache
	now   func() time.Time
	cache *tokenCache
}

// New returns a Verifier. It fetches nothing yet: keys are fetched on the
// first Verify (or Prefetch).
func New(cfg Config) (*Verifier, error) {
	if cfg.Issuer == "" || cfg.Resource == "" {
		return nil, errors.New("oauth verifier: issuer and resource are required")
	}
	switch cfg.IdentityClaim {
	case "":
		cfg.IdentityClaim = "sub"
	case "sub", "email":
	default:
		return nil, fmt.Errorf("oauth verifier: identity claim %q: want sub or email", cfg.IdentityClaim)
	}
	if len(cfg.Algorithms) == 0 {
		cfg.Algorithms = PublicKeyAlgorithms
	}
	v := &Verifier{cfg: cfg, now: cfg.Now}
	for _, a := range cfg.Algorithms {
		if !slices.Contains(PublicKeyAlgorithms, a) {
			return nil, fmt.Errorf("oauth verifier: algorithm %q is not accepted: public-key algorithms only (%s)", a, strings.Join(PublicKeyAlgorithms, ", "))
		}
		v.algs = append(v.algs, jose.SignatureAlgorithm(a))
	}
	if v.cfg.ClockSkew == 0 {
		v.cfg.ClockSkew = DefaultClockSkew
	}
	if v.now == nil {
		v.now = time.Now
	}
	v.keys = newKeyCache(&v.cfg, time.Now) // fetch times are real time, whatever Now says
	switch {
	case cfg.CacheSize == 0:
		v.cache = newTokenCache(4096)
	case cfg.CacheSize > 0:
		v.cache = newTokenCache(cfg.CacheSize)
	}
	return v, nil
}

// Prefetch fetches the issuer's metadata (when needed) and keys now, so
// that a mistake in server.oauth shows at start rather than at the first
// agent's request.
func (v *Verifier) Prefetch(ctx context.Context) error {
	_, err := v.keys.refresh(ctx, true)
	return err
}

// Config is the verifier's configuration, with defaults filled in.
func (v *Verifier) Config() Config { return v.cfg }

// accessClaims are the claims Verify reads: the registered ones and the
// few more it uses, decoded from the verified payload in one pass.
type accessClaims struct {
	jwt.Claims
	Scope         any             `json:"scope"`
	Scp           any             `json:"scp"`
	Email         any             `json:"email"`
	EmailVerified any             `json:"email_verified"`
	ClientID      string          `json:"client_id"`
	Azp           string          `json:"azp"`
	Groups        json.RawMessage `json:"groups"`
}

// Verify checks raw, a bearer token, and returns the identity it proves
// (shared: do not modify it). An error wraps ErrInvalidToken (the token
// proves nothing: 401), ErrInsufficientScope (a valid token without a
// required scope: 403; the identity is returned too) or ErrUnavailable (no
// keys to check with: 503). No error holds the token.
func (v *Verifier) Verify(ctx context.Context, raw string) (*Identity, error) {
	if v.cache == nil {
		id, _, err := v.verify(ctx, raw)
		return id, err
	}
	sum := sha256.Sum256([]byte(raw))
	if id, ok := v.cache.get(sum, v.now().Add(-v.cfg.ClockSkew), v.keys.set.Load()); ok {
		return id, nil
	}
	id, kid, err := v.verify(ctx, raw)
	if err == nil {
		v.cache.put(sum, id, kid, v.now().Add(-v.cfg.ClockSkew))
	}
	return id, err
}

// verify is Verify without the cache; it also returns the key ID used.
func (v *Verifier) verify(ctx context.Context, raw string) (*Identity, string, error) {
	// go-jose parses the compact JWS, refusing any algorithm not listed
	// (so "none" and HMAC), and checks the signature; the verified payload
	// is then decoded once.
	jws, err := jose.ParseSignedCompact(raw, v.algs)
	if err != nil {
		return nil, "", invalid("not a JWS-signed JWT with an accepted algorithm (%s): %v", algList(v.algs), err)
	}
	h := jws.Signatures[0].Header
	key, err := v.keys.key(ctx, h.KeyID, jose.SignatureAlgorithm(h.Algorithm))
	if err != nil {
		return nil, "", err
	}
	payload, err := jws.Verify(key)
	if err != nil {
		return nil, "", invalid("signature does not verify with the issuer's key %q", short(h.KeyID))
	}
	var ac accessClaims
	if err := json.Unmarshal(payload, &ac); err != nil {
		return nil, "", invalid("claims: %v", err)
	}
	std := &ac.Claims
	if std.Expiry == nil {
		return nil, "", invalid("no exp claim: tokens without an expiry are not accepted")
	}
	err = std.ValidateWithLeeway(jwt.Expected{Issuer: v.cfg.Issuer, Time: v.now()}, v.cfg.ClockSkew)
	switch {
	case errors.Is(err, jwt.ErrInvalidIssuer):
		return nil, "", invalid("issued by %q, not by %s", short(std.Issuer), v.cfg.Issuer)
	case errors.Is(err, jwt.ErrExpired):
		return nil, "", invalid("expired at %s", std.Expiry.Time().UTC().Format(time.RFC3339))
	case err != nil:
		return nil, "", invalid("%v", err)
	}
	if !slices.ContainsFunc(std.Audience, v.matchesResource) {
		return nil, "", invalid("its audience %q does not include this gateway's resource %s (RFC 8707)", short(strings.Join(std.Audience, " ")), v.cfg.Resource)
	}
	if std.Subject == "" {
		return nil, "", invalid("no sub claim")
	}
	id := &Identity{
		Subject:  std.Subject,
		Issuer:   std.Issuer,
		JTI:      std.ID,
		ClientID: ac.ClientID,
		Expiry:   std.Expiry.Time(),
	}
	if id.ClientID == "" {
		id.ClientID = ac.Azp
	}
	switch v.cfg.IdentityClaim {
	case "email":
		email, err := verifiedEmail(ac.Email, ac.EmailVerified)
		if err != nil {
			return nil, "", err
		}
		id.Name = email
	default:
		if strings.ContainsFunc(std.Subject, unicode.IsControl) {
			return nil, "", invalid("sub holds control characters")
		}
		id.Name = std.Subject
	}
	if g := v.cfg.GroupsClaim; g != "" {
		rawGroups := ac.Groups
		if g != "groups" {
			var all map[string]json.RawMessage
			if err := json.Unmarshal(payload, &all); err != nil {
				return nil, "", invalid("claims: %v", err)
			}
			rawGroups = all[g]
		}
		if id.Groups, err = groups(rawGroups, g); err != nil {
			return nil, "", err
		}
	}
	if id.Scopes, err = scopes(ac.Scope, ac.Scp); err != nil {
		return nil, "", err
	}
	if missing := v.Missing(id.Scopes); len(missing) > 0 {
		return id, "", fmt.Errorf("%w: the token lacks scope %s", ErrInsufficientScope, strings.Join(missing, " "))
	}
	return id, h.KeyID, nil
}

// Missing lists the required scopes not in have.
func (v *Verifier) Missing(have []string) []string {
	var missing []string
	for _, s := range v.cfg.Scopes {
		if !slices.Contains(have, s) {
			missing = append(missing, s)
		}
	}
	return missing
}

// matchesResource: aud names this resource, a trailing slash aside (as
// go-sdk's oauthex.MatchesResource allows).
func (v *Verifier) matchesResource(aud string) bool {
	return strings.TrimSuffix(aud, "/") == strings.TrimSuffix(v.cfg.Resource, "/")
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidToken}, args...)...)
}

func algList(algs []jose.SignatureAlgorithm) string {
	s := make([]string, len(algs))
	for i, a := range algs {
		s[i] = string(a)
	}
	return strings.Join(s, ", ")
}

// verifiedEmail canonicalises the email claim, which must be verified.
func verifiedEmail(email, verified any) (string, error) {
	e, ok := email.(string)
	if !ok || e == "" {
		return "", invalid("no email claim, and server.oauth.identity_claim is email")
	}
	// Some issuers (AWS Cognito) send the boolean as a string.
	if verified != true && verified != "true" {
		return "", invalid("email %q is not verified (email_verified is not true)", short(e))
	}
	local, domain, ok := strings.Cut(e, "@")
	if !ok || local == "" || domain == "" || strings.Contains(domain, "@") ||
		strings.ContainsFunc(e, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) {
		return "", invalid("email claim %q is not an address", short(e))
	}
	return strings.ToLower(e), nil
}

// groups reads the groups claim: a list of strings (or one string).
func groups(raw json.RawMessage, name string) ([]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err != nil {
		var one string
		if json.Unmarshal(raw, &one) != nil {
			return nil, invalid("claim %s is neither a list of strings nor a string", name)
		}
		list = []string{one}
	}
	for _, g := range list {
		if g == "" || strings.ContainsFunc(g, unicode.IsControl) {
			return nil, invalid("claim %s holds an empty group or one with control characters", name)
		}
	}
	slices.Sort(list)
	return slices.Compact(list), nil
}

// scopes reads scope (a space-separated string, RFC 8693 and RFC 9068) or
// scp (a list, as Okta and Entra send).
func scopes(scope, scp any) ([]string, error) {
	for _, c := range []any{scope, scp} {
		switch c := c.(type) {
		case nil:
		case string:
			return strings.Fields(c), nil
		case []any:
			out := make([]string, 0, len(c))
			for _, s := range c {
				str, ok := s.(string)
				if !ok {
					return nil, invalid("scope list holds a non-string")
				}
				out = append(out, str)
			}
			return out, nil
		default:
			return nil, invalid("scope claim is neither a string nor a list")
		}
	}
	return nil, nil
}
