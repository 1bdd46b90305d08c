package config

import (
	"maps"
	"net/url"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// CredentialSource is an HTTP upstream's `credential:` section: the
// gateway mints the credential for each calling identity instead of
// sending one static credential for everyone (docs/credentials.md).
//
//	http:
//	  url: https://api.example.com/mcp
//	  credential:
//	    source: exec                # exec, client_credentials, token_exchange or authorization_code
//	    exec:
//	      command: /usr/local/bin/mint-token   # run without a shell
//	      args: [--profile, prod]
//	      env: {AWS_REGION: eu-west-1}          # its whole environment (PATH has a default)
//	      timeout: 10s
//	    audience: https://api.example.com       # given to the source (default: the url)
//	    cache_size: 1024            # identities kept (LRU)
//	    refresh_skew: 60s           # minted again this long before it expires
//	    retry: {attempts: 6, initial: 250ms, max: 8s}   # 401 on a fresh credential
type CredentialSource struct {
	Source      string           `yaml:"source" json:"source"`
	Exec        *CredentialExec  `yaml:"exec" json:"exec,omitempty"`
	OAuth       *CredentialOAuth `yaml:"oauth" json:"oauth,omitempty"`
	Audience    string           `yaml:"audience" json:"audience,omitempty"`
	CacheSize   int              `yaml:"cache_size" json:"cache_size,omitempty"`
	RefreshSkew time.Duration    `yaml:"refresh_skew" json:"refresh_skew,omitempty"`
	Retry       *CredentialRetry `yaml:"retry" json:"retry,omitempty"`
}

// CredentialExec is the exec source's helper program.
type CredentialExec struct {
	// Command is an absolute path, a path relative to the configuration
	// file (Load makes it absolute), or a name looked up on the gateway's
	// PATH when serve starts.
	Command string            `yaml:"command" json:"command"`
	Args    []string          `yaml:"args" json:"args,omitempty"`
	Env     map[string]string `yaml:"env" json:"env,omitempty"`
	Timeout time.Duration     `yaml:"timeout" json:"timeout,omitempty"`
}

// CredentialOAuth is the OAuth client of the client_credentials,
// token_exchange and authorization_code sources.
type CredentialOAuth struct {
	// Issuer is the authorization server (its metadata is discovered,
	// RFC 8414 / OpenID discovery); or give TokenEndpoint (and, for
	// authorization_code, AuthorizationEndpoint) directly.
	Issuer                string `yaml:"issuer" json:"issuer,omitempty"`
	TokenEndpoint         string `yaml:"token_endpoint" json:"token_endpoint,omitempty"`
	AuthorizationEndpoint string `yaml:"authorization_endpoint" json:"authorization_endpoint,omitempty"`
	ClientID              string `yaml:"client_id" json:"client_id"`
	// ClientSecretEnv / ClientSecretFile name where the client secret is
	// (at most one; none for a public client).
	ClientSecretEnv  string   `yaml:"client_secret_env" json:"client_secret_env,omitempty"`
	ClientSecretFile string   `yaml:"client_secret_file" json:"client_secret_file,omitempty"`
	Scopes           []string `yaml:"scopes" json:"scopes,omitempty"`
	// Resource is the RFC 8707 resource indicator sent with the requests.
	Resource string `yaml:"resource" json:"resource,omitempty"`
	// SubjectTokenType is token_exchange's subject_token_type (default
	// urn:ietf:params:oauth:token-type:access_token).
	SubjectTokenType string `yaml:"subject_token_type" json:"subject_token_type,omitempty"`
	// LoginURL is, for authorization_code, the gateway's external URL of
	// this upstream's sign-in pages, served on the MCP listener under its
	// path: LoginURL/start?id=... is the link a URL elicitation sends a
	// person to, and LoginURL/callback the redirect URI to register.
	LoginURL string `yaml:"login_url" json:"login_url,omitempty"`
	// AllowPlaintext permits http:// endpoints that are not loopback.
	AllowPlaintext bool `yaml:"allow_plaintext" json:"allow_plaintext,omitempty"`
}

// CredentialRetry is the backoff for a 401 on a freshly minted credential.
type CredentialRetry struct {
	Attempts int           `yaml:"attempts" json:"attempts,omitempty"`
	Initial  time.Duration `yaml:"initial" json:"initial,omitempty"`
	Max      time.Duration `yaml:"max" json:"max,omitempty"`
}

// Credential sources.
const (
	SourceExec              = "exec"
	SourceClientCredentials = "client_credentials"
	SourceTokenExchange     = "token_exchange"
	SourceAuthorizationCode = "authorization_code"
)

// PerIdentity reports whether the source mints a different credential for
// each identity (all but client_credentials).
func (c *CredentialSource) PerIdentity() bool { return c.Source != SourceClientCredentials }

// credentialEntry is where an http: section's credential: is in the file,
// for errors: its YAML node (nil when there is none) and its field name,
// like "upstreams[0] (api).http.credential".
type credentialEntry struct {
	cn *yaml.Node
	f  string
}

// at is the node at path below the credential: node, or the deepest one
// of path that is there.
func (e credentialEntry) at(path ...string) *yaml.Node {
	n := e.cn
	for _, p := range path {
		v := valueNode(n, p)
		if v == nil {
			return n
		}
		n = v
	}
	return n
}

// validateCredential checks an http: section's credential: (hn is the
// http: node, f the field prefix, dir the configuration's directory).
func (l *loader) validateCredential(hn *yaml.Node, f string, u *Upstream, dir string) {
	c := u.HTTP.Credential
	if c == nil {
		return
	}
	e := credentialEntry{cn: valueNode(hn, "credential"), f: f + ".http.credential"}
	if !l.validateCredentialKind(e, c) {
		return
	}
	l.validateCredentialAuthorization(e, u)
	l.validateCredentialSettings(e, c)
	if c.Source == SourceExec {
		l.validateExecCredential(e, c, dir)
		return
	}
	l.validateOAuthCredential(e, u, dir)
}

// validateCredentialKind checks the source: and reports whether it is one
// cmcp knows.
func (l *loader) validateCredentialKind(e credentialEntry, c *CredentialSource) bool {
	switch c.Source {
	case SourceExec, SourceClientCredentials, SourceTokenExchange, SourceAuthorizationCode:
		return true
	case "":
		l.errorf(e.cn, e.f+".source", "", "missing: exec, client_credentials, token_exchange or authorization_code")
	default:
		l.errorf(e.at("source"), e.f+".source", "", "%q: want exec, client_credentials, token_exchange or authorization_code", c.Source)
	}
	return false
}

// validateCredentialAuthorization checks that nothing else of u sets the
// Authorization header the source sets, and that a credential minted per
// identity is not used on a shared connection.
func (l *loader) validateCredentialAuthorization(e credentialEntry, u *Upstream) {
	h, c := u.HTTP, u.HTTP.Credential
	if h.BearerTokenEnv != "" || h.BearerTokenFile != "" {
		l.errorf(e.cn, e.f, "remove bearer_token_env / bearer_token_file: the source sets Authorization for each call",
			"a credential source and a static bearer token both set Authorization")
	}
	for name := range h.HeadersFromEnv {
		if strings.EqualFold(name, "Authorization") {
			l.errorf(e.cn, e.f, "remove the Authorization header", "a credential source and headers_from_env both set Authorization")
		}
	}
	for name := range h.HeadersFromFile {
		if strings.EqualFold(name, "Authorization") {
			l.errorf(e.cn, e.f, "remove the Authorization header", "a credential source and headers_from_file both set Authorization")
		}
	}
	if c.PerIdentity() && u.Shared() {
		l.errorf(e.cn, e.f, "use lifecycle: per-session (the default), or source: client_credentials for one service identity",
			"a %s credential is minted per identity, which a shared connection (lifecycle: shared) cannot carry", c.Source)
	}
}

// validateCredentialSettings checks the settings every source has: how many
// identities' credentials are kept and when they are minted again, the
// retry of a 401, and the audience.
func (l *loader) validateCredentialSettings(e credentialEntry, c *CredentialSource) {
	if c.CacheSize < 0 || c.CacheSize > 1_000_000 {
		l.errorf(e.at("cache_size"), e.f+".cache_size", "", "%d: want 1 to 1000000 (default 1024)", c.CacheSize)
	}
	if c.RefreshSkew < 0 {
		l.errorf(e.at("refresh_skew"), e.f+".refresh_skew", "", "negative duration")
	}
	if r := c.Retry; r != nil {
		if r.Attempts < 0 || r.Attempts > 20 {
			l.errorf(e.at("retry", "attempts"), e.f+".retry.attempts", "", "%d: want 0 to 20 (default 6)", r.Attempts)
		}
		if r.Initial < 0 || r.Max < 0 {
			l.errorf(e.at("retry"), e.f+".retry", "", "negative duration")
		} else if r.Initial > 0 && r.Max > 0 && r.Max < r.Initial {
			l.errorf(e.at("retry", "max"), e.f+".retry.max", "", "%s is less than initial %s", r.Max, r.Initial)
		}
	}
	if c.Audience != "" {
		if pu, err := url.Parse(c.Audience); err != nil || pu.Scheme == "" {
			l.errorf(e.at("audience"), e.f+".audience", "", "%q: want an absolute URI", c.Audience)
		}
	}
}

// validateExecCredential checks the exec source's helper program and
// makes a relative path to it absolute (relative to dir).
func (l *loader) validateExecCredential(e credentialEntry, c *CredentialSource, dir string) {
	if c.OAuth != nil {
		l.errorf(e.at("oauth"), e.f+".oauth", "remove it", "applies to the OAuth sources, not exec")
	}
	x := c.Exec
	if x == nil || x.Command == "" {
		l.errorf(e.at("exec"), e.f+".exec.command", "", "missing: the helper program to run")
		return
	}
	if strings.ContainsRune(x.Command, '/') {
		x.Command = absPath(dir, x.Command)
	}
	if x.Timeout < 0 {
		l.errorf(e.at("exec", "timeout"), e.f+".exec.timeout", "", "negative duration")
	}
	for _, k := range slices.Sorted(maps.Keys(x.Env)) {
		if !envNameRE.MatchString(k) {
			l.errorf(e.at("exec", "env"), e.f+".exec.env", "", "%q is not a valid environment variable name", k)
		}
	}
}

// validateOAuthCredential checks the OAuth client of the
// client_credentials, token_exchange and authorization_code sources and
// makes its client secret file absolute (relative to dir).
func (l *loader) validateOAuthCredential(e credentialEntry, u *Upstream, dir string) {
	c := u.HTTP.Credential
	if c.Exec != nil {
		l.errorf(e.at("exec"), e.f+".exec", "remove it", "applies to source: exec only")
	}
	o := c.OAuth
	if o == nil {
		l.errorf(e.cn, e.f+".oauth", "", "missing: the OAuth client (client_id, and issuer or token_endpoint)")
		return
	}
	if o.ClientID == "" {
		l.errorf(e.at("oauth"), e.f+".oauth.client_id", "", "missing: the client id registered at the authorization server")
	}
	if o.Issuer == "" && o.TokenEndpoint == "" && c.Source != SourceAuthorizationCode {
		l.errorf(e.at("oauth"), e.f+".oauth", "", "missing: issuer (its metadata is discovered) or token_endpoint")
	}
	l.validateOAuthLogin(e, c.Source, o, u.Name)
	l.validateOAuthEndpoints(e, o)
	l.validateOAuthSecret(e, c.Source, o)
	o.ClientSecretFile = absPath(dir, o.ClientSecretFile)
}

// validateOAuthLogin checks what the authorization_code source (and only
// it) needs to send a person to sign in: its endpoints and login_url
// (name is the upstream's).
func (l *loader) validateOAuthLogin(e credentialEntry, source string, o *CredentialOAuth, name string) {
	if source == SourceAuthorizationCode {
		// Without issuer and endpoints: discovered from the upstream's
		// 401 and its protected resource metadata (RFC 9728).
		if o.TokenEndpoint != "" && o.AuthorizationEndpoint == "" && o.Issuer == "" {
			l.errorf(e.at("oauth"), e.f+".oauth.authorization_endpoint", "", "missing: authorization_code needs it with token_endpoint (or give issuer)")
		}
		if o.LoginURL == "" {
			l.errorf(e.at("oauth"), e.f+".oauth.login_url", "e.g. https://gateway.example/oauth/upstream/"+name+" (register <login_url>/callback at the authorization server)",
				"missing: the gateway's URL of the sign-in pages a URL elicitation sends a person to")
		}
	} else if o.LoginURL != "" {
		l.errorf(e.at("oauth", "login_url"), e.f+".oauth.login_url", "remove it", "applies to source: authorization_code only")
	}
	if o.LoginURL != "" {
		if pu, err := url.Parse(o.LoginURL); err == nil && (pu.Path == "" || pu.Path == "/" || strings.HasSuffix(pu.Path, "/") || pu.RawQuery != "" || pu.Fragment != "") {
			l.errorf(e.at("oauth", "login_url"), e.f+".oauth.login_url", "", "%q: want a path of its own without a trailing slash, query or fragment, e.g. /oauth/upstream/%s", o.LoginURL, name)
		}
	}
}

// validateOAuthEndpoints checks the OAuth client's URLs: https://, or
// plaintext http:// to a loopback address unless allow_plaintext, and no
// user info or query.
func (l *loader) validateOAuthEndpoints(e credentialEntry, o *CredentialOAuth) {
	for _, ep := range []struct{ key, v string }{{"issuer", o.Issuer}, {"token_endpoint", o.TokenEndpoint}, {"authorization_endpoint", o.AuthorizationEndpoint}, {"login_url", o.LoginURL}} {
		if ep.v == "" {
			continue
		}
		pu, err := url.Parse(ep.v)
		switch {
		case err != nil || pu.Host == "" || (pu.Scheme != "https" && pu.Scheme != "http"):
			l.errorf(e.at("oauth", ep.key), e.f+".oauth."+ep.key, "", "%q: want an https:// URL", ep.v)
		case pu.Scheme == "http" && !o.AllowPlaintext && !IsLoopbackHost(pu.Hostname()):
			l.errorf(e.at("oauth", ep.key), e.f+".oauth."+ep.key, "use https://, or set allow_plaintext: true",
				"plaintext http:// to %s, which is not a loopback address, would send credentials in the clear", pu.Host)
		case pu.User != nil || pu.RawQuery != "":
			l.errorf(e.at("oauth", ep.key), e.f+".oauth."+ep.key, "", "carries user info or a query; put the client secret in client_secret_env / client_secret_file")
		}
	}
}

// validateOAuthSecret checks where the OAuth client's secret is, that the
// sources of a confidential client (client_credentials, token_exchange)
// have one, and that subject_token_type is given to token_exchange only.
func (l *loader) validateOAuthSecret(e credentialEntry, source string, o *CredentialOAuth) {
	if o.ClientSecretEnv != "" && o.ClientSecretFile != "" {
		l.errorf(e.at("oauth", "client_secret_file"), e.f+".oauth", "", "set client_secret_env or client_secret_file, not both")
	}
	if o.ClientSecretEnv != "" && !envNameRE.MatchString(o.ClientSecretEnv) {
		l.errorf(e.at("oauth", "client_secret_env"), e.f+".oauth.client_secret_env", "", "%q is not a valid environment variable name", o.ClientSecretEnv)
	}
	if (source == SourceClientCredentials || source == SourceTokenExchange) && o.ClientSecretEnv == "" && o.ClientSecretFile == "" {
		l.errorf(e.at("oauth"), e.f+".oauth.client_secret_env", "", "missing: %s authenticates the gateway as a confidential client (client_secret_env or client_secret_file)", source)
	}
	if o.SubjectTokenType != "" && source != SourceTokenExchange {
		l.errorf(e.at("oauth", "subject_token_type"), e.f+".oauth.subject_token_type", "remove it", "applies to source: token_exchange only")
	}
}

// credentialSourceEnv adds the client secrets' variables to creds.
func credentialSourceEnv(f string, h *HTTP, out map[string]string) {
	if h.Credential != nil && h.Credential.OAuth != nil && h.Credential.OAuth.ClientSecretEnv != "" {
		if _, dup := out[h.Credential.OAuth.ClientSecretEnv]; !dup {
			out[h.Credential.OAuth.ClientSecretEnv] = f + ".credential.oauth.client_secret_env"
		}
	}
}
