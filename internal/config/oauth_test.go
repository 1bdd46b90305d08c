package config

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestOAuthSection(t *testing.T) {
	c, err := LoadBytes("c.yaml", []byte(gwBase+`server:
  listen: 0.0.0.0:8443
  tls: {cert: a.crt, key: a.key}
  oauth:
    issuer: https://login.example.com/tenant1
    resource: https://gw.example.com/mcp
    identity_claim: email
    groups_claim: groups
    scopes: [mcp:tools, "read"]
    algorithms: [ES256]
    clock_skew: 10s
    jwks_refresh_floor: 1m
`))
	if err != nil {
		t.Fatal(err)
	}
	o := c.Server.OAuth
	if o.Issuer != "https://login.example.com/tenant1" || o.Resource != "https://gw.example.com/mcp" || o.IdentityClaimOrDefault() != "email" ||
		o.GroupsClaim != "groups" || !slices.Equal(o.Scopes, []string{"mcp:tools", "read"}) || !slices.Equal(o.AlgorithmsOrDefault(), []string{"ES256"}) ||
		o.ClockSkewOrDefault() != 10*time.Second || o.JWKSRefreshFloorOrDefault() != time.Minute {
		t.Fatalf("oauth: %+v", o)
	}
	// OAuth authenticates: a non-loopback listener is allowed.
	if _, err := c.CheckListeners("", false); err != nil {
		t.Fatalf("CheckListeners with server.oauth: %v", err)
	}

	c, err = LoadBytes("c.yaml", []byte(gwBase+"server:\n  oauth: {issuer: 'http://127.0.0.1:9/', resource: 'http://127.0.0.1:8080/mcp'}\n"))
	if err != nil {
		t.Fatal(err)
	}
	o = c.Server.OAuth
	if o.IdentityClaimOrDefault() != "sub" || !slices.Equal(o.AlgorithmsOrDefault(), OAuthAlgorithms) ||
		o.ClockSkewOrDefault() != DefaultOAuthClockSkew || o.JWKSRefreshFloorOrDefault() != DefaultOAuthJWKSRefreshFloor {
		t.Fatalf("defaults: %+v", o)
	}
	for _, a := range OAuthAlgorithms {
		if a == "none" || strings.HasPrefix(a, "HS") {
			t.Fatalf("default algorithms include %s", a)
		}
	}
}

// TestOAuthSectionErrors: every bad server.oauth value is refused at its
// line, saying what is wrong.
func TestOAuthSectionErrors(t *testing.T) {
	const ok = "issuer: https://as.example, resource: https://gw.example/mcp"
	for _, tc := range []struct{ name, oauth, want, line string }{
		{"no issuer", "{resource: https://gw.example/mcp}", "server.oauth.issuer is required", "c.yaml:7:"},
		{"no resource", "{issuer: https://as.example}", "server.oauth.resource is required", "c.yaml:7:"},
		{"issuer not a URL", "{issuer: as.example, resource: https://gw.example/mcp}", `server.oauth.issuer "as.example": want an https:// URL`, "c.yaml:7:"},
		{"plaintext issuer", "{issuer: 'http://as.example', resource: https://gw.example/mcp}", "plaintext http:// is accepted only to a loopback", "c.yaml:7:"},
		{"issuer fragment", "{issuer: 'https://as.example/#x', resource: https://gw.example/mcp}", "fragment", "c.yaml:7:"},
		{"resource query", "{issuer: https://as.example, resource: 'https://gw.example/mcp?a=b'}", "a query (?...) is not allowed", "c.yaml:7:"},
		{"resource upper case", "{issuer: https://as.example, resource: 'https://GW.example/mcp'}", "not a canonical resource URI", "c.yaml:7:"},
		{"identity claim", "{" + ok + ", identity_claim: name}", `server.oauth.identity_claim "name": want sub or email`, "c.yaml:7:"},
		{"groups claim", "{" + ok + ", groups_claim: 'a b'}", `server.oauth.groups_claim "a b"`, "c.yaml:7:"},
		{"scope with space", "{" + ok + ", scopes: ['a b']}", `server.oauth.scopes[0] "a b"`, "c.yaml:7:"},
		{"scope twice", "{" + ok + ", scopes: [a, a]}", "listed twice", "c.yaml:7:"},
		{"alg none", "{" + ok + ", algorithms: [none]}", `server.oauth.algorithms[0] "none" is never accepted`, "c.yaml:7:"},
		{"alg HMAC", "{" + ok + ", algorithms: [RS256, HS256]}", `server.oauth.algorithms[1] "HS256" is never accepted`, "c.yaml:7:"},
		{"alg unknown", "{" + ok + ", algorithms: [XX1]}", "unknown JWS algorithm", "c.yaml:7:"},
		{"skew too large", "{" + ok + ", clock_skew: 1h}", "server.oauth.clock_skew 1h0m0s: want between 0 and 5m0s", "c.yaml:7:"},
		{"floor negative", "{" + ok + ", jwks_refresh_floor: -1s}", "negative", "c.yaml:7:"},
		{"jwks plaintext", "{" + ok + ", jwks_uri: 'http://as.example/keys'}", "server.oauth.jwks_uri", "c.yaml:7:"},
		{"unknown key", "{" + ok + ", audience: x}", `unknown key "audience" in server.oauth`, "c.yaml:7:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadBytes("c.yaml", []byte(gwBase+"server:\n  oauth: "+tc.oauth+"\n"))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.line) {
				t.Fatalf("error does not name the line %s: %v", tc.line, err)
			}
		})
	}
	// In block style, the error is at the value's own line.
	_, err := LoadBytes("c.yaml", []byte(gwBase+"server:\n  oauth:\n    issuer: https://as.example\n    resource: https://gw.example/mcp\n    algorithms: [RS256, none]\n"))
	if err == nil || !strings.Contains(err.Error(), "c.yaml:10:") {
		t.Fatalf("err = %v, want it at c.yaml:10", err)
	}
}
