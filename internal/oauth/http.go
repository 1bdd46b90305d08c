package oauth

import (
	"errors"
	"net/http"
	"net/url"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
)

// metadataPrefix is RFC 9728's well-known path.
const metadataPrefix = "/.well-known/oauth-protected-resource"

// ResourceMetadataURL is the RFC 9728 metadata URL of resource: the
// well-known path inserted between its host and its path
// (https://gw.example/mcp -> https://gw.example/.well-known/oauth-protected-resource/mcp).
func ResourceMetadataURL(resource string) string {
	u, err := url.Parse(resource)
	if err != nil {
		return ""
	}
	return u.Scheme + "://" + u.Host + metadataPrefix + strings.TrimSuffix(u.Path, "/")
}

// MetadataPaths are the paths to serve the Protected Resource Metadata at
// on this gateway's listener: the path-inserted one, and the root one
// that clients try when the resource's own is missing (MCP
// authorization, 2025-11-25).
func (v *Verifier) MetadataPaths() []string {
	u, _ := url.Parse(v.cfg.Resource)
	p := strings.TrimSuffix(u.Path, "/")
	if p == "" {
		return []string{metadataPrefix}
	}
	return []string{metadataPrefix + p, metadataPrefix}
}

// Metadata is this gateway's RFC 9728 Protected Resource Metadata: the
// resource, its authorization server (the issuer), the scopes it needs
// and that tokens come in the Authorization header only.
func (v *Verifier) Metadata() *oauthex.ProtectedResourceMetadata {
	return &oauthex.ProtectedResourceMetadata{
		Resource:               v.cfg.Resource,
		AuthorizationServers:   []string{v.cfg.Issuer},
		ScopesSupported:        v.cfg.Scopes,
		BearerMethodsSupported: []string{"header"},
		ResourceName:           "cmcp gateway",
	}
}

// MetadataHandler serves Metadata (GET, and the CORS preflight), with
// go-sdk's handler.
func (v *Verifier) MetadataHandler() http.Handler {
	return auth.ProtectedResourceMetadataHandler(v.Metadata())
}

// Challenge sets the WWW-Authenticate header of a refused request and
// returns its status: err nil means no token was sent (401 with the
// resource metadata and scopes, no error code, RFC 6750 section 3.1);
// ErrInsufficientScope is 403 insufficient_scope; ErrUnavailable is 503
// (no challenge: the token was not judged); anything else is 401
// invalid_token. The description is err's text, which never holds the
// token.
func (v *Verifier) Challenge(h http.Header, err error) int {
	params := []string{`resource_metadata="` + ResourceMetadataURL(v.cfg.Resource) + `"`}
	if len(v.cfg.Scopes) > 0 {
		params = append(params, `scope="`+strings.Join(v.cfg.Scopes, " ")+`"`)
	}
	status := http.StatusUnauthorized
	switch {
	case err == nil:
	case errors.Is(err, ErrUnavailable):
		h.Set("Retry-After", "5")
		return http.StatusServiceUnavailable
	case errors.Is(err, ErrInsufficientScope):
		status = http.StatusForbidden
		params = append([]string{`error="insufficient_scope"`, `error_description="` + quotable(err.Error()) + `"`}, params...)
	default:
		params = append([]string{`error="invalid_token"`, `error_description="` + quotable(err.Error()) + `"`}, params...)
	}
	h.Set("WWW-Authenticate", "Bearer "+strings.Join(params, ", "))
	return status
}

// quotable makes s fit an RFC 6750 quoted value (%x20-21 / %x23-5B /
// %x5D-7E): double quotes become single ones, other bytes '?', and it is
// cut at 200 bytes.
func quotable(s string) string {
	b := []byte(s)
	if len(b) > 200 {
		b = append(b[:197], "..."...)
	}
	for i, c := range b {
		switch {
		case c == '"':
			b[i] = '\''
		case c < 0x20 || c > 0x7e || c == '\\':
			b[i] = '?'
		}
	}
	return string(b)
}
