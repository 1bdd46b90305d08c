package config

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"
)

// OAuth is `server.oauth`: agents sign in with OAuth 2.1 as MCP clients
// expect (the MCP authorization spec), and the gateway is a resource
// server that checks their access tokens. Static server.tokens keep
// working beside it.
//
//	server:
//	  oauth:
//	    issuer: https://login.example.com     # the authorization server's issuer URL
//	    resource: https://gw.example.com/mcp   # this endpoint's URL: the audience tokens must carry (RFC 8707)
//	    identity_claim: email                  # email (verified, lower-cased) or sub (the default)
//	    groups_claim: groups                   # optional: each group becomes a Cedar Group parent
//	    scopes: [mcp:tools]                    # every one is required (403 insufficient_scope)
//	    jwks_uri: https://login.example.com/keys  # optional: else from RFC 8414 / OpenID discovery
//	    algorithms: [RS256, ES256]             # optional: the accepted JWS algorithms
//	    clock_skew: 30s                        # optional: leeway on exp, nbf and iat (at most 5m)
//	    jwks_refresh_floor: 30s                # optional: the JWKS is fetched at most this often
type OAuth struct {
	Issuer           string        `yaml:"issuer" json:"issuer"`
	Resource         string        `yaml:"resource" json:"resource"`
	IdentityClaim    string        `yaml:"identity_claim" json:"identity_claim,omitempty"`
	GroupsClaim      string        `yaml:"groups_claim" json:"groups_claim,omitempty"`
	Scopes           []string      `yaml:"scopes" json:"scopes,omitempty"`
	JWKSURI          string        `yaml:"jwks_uri" json:"jwks_uri,omitempty"`
	Algorithms       []string      `yaml:"algorithms" json:"algorithms,omitempty"`
	ClockSkew        time.Duration `yaml:"clock_skew" json:"clock_skew,omitempty"`
	JWKSRefreshFloor time.Duration `yaml:"jwks_refresh_floor" json:"jwks_refresh_floor,omitempty"`
}

// The OAuth defaults and bounds.
const (
	DefaultOAuthClockSkew        = 30 * time.Second
	MaxOAuthClockSkew            = 5 * time.Minute
	DefaultOAuthJWKSRefreshFloor = 30 * time.Second
)

// OAuthAlgorithms are the JWS algorithms server.oauth.algorithms may list,
// and the default list: public-key signatures only. "none" and the HMAC
// algorithms (HS256...) are never accepted: a verifier that takes HMAC can
// be fed a token "signed" with the issuer's public key as the secret.
var OAuthAlgorithms = []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}

// IdentityClaimOrDefault is IdentityClaim or "sub".
func (o *OAuth) IdentityClaimOrDefault() string {
	if o.IdentityClaim == "" {
		return "sub"
	}
	return o.IdentityClaim
}

// AlgorithmsOrDefault is Algorithms or OAuthAlgorithms.
func (o *OAuth) AlgorithmsOrDefault() []string {
	if len(o.Algorithms) == 0 {
		return slices.Clone(OAuthAlgorithms)
	}
	return slices.Clone(o.Algorithms)
}

// ClockSkewOrDefault is ClockSkew or DefaultOAuthClockSkew.
func (o *OAuth) ClockSkewOrDefault() time.Duration {
	if o.ClockSkew == 0 {
		return DefaultOAuthClockSkew
	}
	return o.ClockSkew
}

// JWKSRefreshFloorOrDefault is JWKSRefreshFloor or
// DefaultOAuthJWKSRefreshFloor.
func (o *OAuth) JWKSRefreshFloorOrDefault() time.Duration {
	if o.JWKSRefreshFloor == 0 {
		return DefaultOAuthJWKSRefreshFloor
	}
	return o.JWKSRefreshFloor
}

// validate checks server.oauth; paths are from the server section.
func (o *OAuth) validate() error {
	if o.Issuer == "" {
		return valueAt("oauth").hintf("set issuer: the authorization server's issuer URL (the iss of its tokens)", "server.oauth.issuer is required")
	}
	if err := checkOAuthURL(o.Issuer, false); err != nil {
		return valueAt("oauth", "issuer").hintf("give the issuer exactly as its tokens' iss claim names it, e.g. https://login.example.com", "server.oauth.issuer %q: %v", o.Issuer, err)
	}
	if o.Resource == "" {
		return valueAt("oauth").hintf("set resource: the URL agents reach this gateway's MCP endpoint at, e.g. https://gw.example.com/mcp", "server.oauth.resource is required: it is the audience a token must carry to be accepted here (RFC 8707)")
	}
	if err := checkOAuthURL(o.Resource, false); err != nil {
		return valueAt("oauth", "resource").hintf("give this gateway's MCP endpoint URL, e.g. https://gw.example.com/mcp", "server.oauth.resource %q: %v", o.Resource, err)
	}
	if u, _ := url.Parse(o.Resource); u.Scheme != strings.ToLower(u.Scheme) || u.Host != strings.ToLower(u.Host) || u.RawQuery != "" {
		return valueAt("oauth", "resource").hintf("write the scheme and host in lower case, without a query", "server.oauth.resource %q is not a canonical resource URI: clients send it byte for byte as the audience (RFC 8707, RFC 9728)", o.Resource)
	}
	if o.JWKSURI != "" {
		if err := checkOAuthURL(o.JWKSURI, true); err != nil {
			return valueAt("oauth", "jwks_uri").errorf("server.oauth.jwks_uri %q: %v", o.JWKSURI, err)
		}
	}
	switch o.IdentityClaim {
	case "", "sub", "email":
	default:
		return valueAt("oauth", "identity_claim").hintf("sub names an account for good; email is readable in policies and is accepted only when email_verified is true",
			"server.oauth.identity_claim %q: want sub or email", o.IdentityClaim)
	}
	if o.GroupsClaim != "" && !claimNameOK(o.GroupsClaim) {
		return valueAt("oauth", "groups_claim").errorf("server.oauth.groups_claim %q: want a claim name (letters, digits, _ - : / .)", o.GroupsClaim)
	}
	for i, s := range o.Scopes {
		if s == "" || strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r == '"' || r == '\\' || r > '~' }) {
			return valueAt("oauth", "scopes", i).errorf("server.oauth.scopes[%d] %q: a scope is printable ASCII without spaces, quotes or backslashes (RFC 6749 section 3.3)", i, s)
		}
		if j := slices.Index(o.Scopes, s); j < i {
			return valueAt("oauth", "scopes", i).errorf("server.oauth.scopes[%d] %q is listed twice (first as scopes[%d])", i, s, j)
		}
	}
	for i, a := range o.Algorithms {
		if !slices.Contains(OAuthAlgorithms, a) {
			hint := "list public-key algorithms only: " + strings.Join(OAuthAlgorithms, ", ")
			if strings.EqualFold(a, "none") || strings.HasPrefix(strings.ToUpper(a), "HS") {
				return valueAt("oauth", "algorithms", i).hintf(hint, "server.oauth.algorithms[%d] %q is never accepted: an unsigned or HMAC token proves nothing about its issuer here", i, a)
			}
			return valueAt("oauth", "algorithms", i).hintf(hint, "server.oauth.algorithms[%d] %q: unknown JWS algorithm", i, a)
		}
	}
	if o.ClockSkew < 0 || o.ClockSkew > MaxOAuthClockSkew {
		return valueAt("oauth", "clock_skew").errorf("server.oauth.clock_skew %s: want between 0 and %s (unset: %s)", o.ClockSkew, MaxOAuthClockSkew, DefaultOAuthClockSkew)
	}
	if o.JWKSRefreshFloor < 0 {
		return valueAt("oauth", "jwks_refresh_floor").errorf("server.oauth.jwks_refresh_floor %s: negative (unset: %s)", o.JWKSRefreshFloor, DefaultOAuthJWKSRefreshFloor)
	}
	return nil
}

// checkOAuthURL checks an issuer, resource or JWKS URL: absolute, https
// (http only to a loopback host), no fragment, no user info; a query only
// where query is true.
func checkOAuthURL(s string, query bool) error {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		if ue, ok := err.(*url.Error); ok {
			return ue.Err // not the url again
		}
		return err
	case u.Scheme != "https" && u.Scheme != "http" || u.Host == "":
		return fmt.Errorf("want an https:// URL with a host")
	case u.Scheme == "http" && !IsLoopbackHost(u.Hostname()):
		return fmt.Errorf("plaintext http:// is accepted only to a loopback address (127.0.0.0/8, ::1 or localhost)")
	case u.Fragment != "" || strings.Contains(s, "#"):
		return fmt.Errorf("a fragment (#...) is not allowed")
	case u.User != nil:
		return fmt.Errorf("user info (user@) is not allowed")
	case u.RawQuery != "" && !query:
		return fmt.Errorf("a query (?...) is not allowed")
	}
	return nil
}

func claimNameOK(s string) bool {
	return !strings.ContainsFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_-:/.", r))
	})
}
