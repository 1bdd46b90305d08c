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

// validateCredential checks an http: section's credential: (hn is the
// http: node, f the field prefix, dir the configuration's directory).
func (l *loader) validateCredential(hn *yaml.Node, f string, u *Upstream, dir string) {
	c := u.HTTP.Credential
	if c == nil {
		return
	}
	cn := valueNode(hn, "credential")
	at := func(path ...string) *yaml.Node {
		n := cn
		for _, p := range path {
			v := valueNode(n, p)
			if v == nil {
				return n
			}
			n = v
		}
		return n
	}
	f += ".http.credential"
	h := u.HTTP
	switch c.Source {
	case SourceExec, SourceClientCredentials, SourceTokenExchange, SourceAuthorizationCode:
	case "":
		l.errorf(cn, f+".source", "", "missing: exec, client_credentials, token_exchange or authorization_code")
		return
	default:
		l.errorf(at("source"), f+".source", "", "%q: want exec, client_credentials, token_exchange or authorization_code", c.Source)
		return
	}
	if h.BearerTokenEnv != "" || h.BearerTokenFile != "" {
		l.errorf(cn, f, "remove bearer_token_env / bearer_token_file: the source sets Authorization for each call",
			"a credential source and a static bearer token both set Authorization")
	}
	for name := range h.HeadersFromEnv {
		if strings.EqualFold(name, "Authorization") {
			l.errorf(cn, f, "remove the Authorization header", "a credential source and headers_from_env both set Authorization")
		}
	}
	for name := range h.HeadersFromFile {
		if strings.EqualFold(name, "Authorization") {
			l.errorf(cn, f, "remove the Authorization header", "a credential source and headers_from_file both set Authorization")
		}
	}
	if c.PerIdentity() && u.Shared() {
		l.errorf(cn, f, "use lifecycle: per-session (the default), or source: client_credentials for one service identity",
			"a %s credential is minted per identity, which a shared connection (lifecycle: shared) cannot carry", c.Source)
	}
	if c.CacheSize < 0 || c.CacheSize > 1_000_000 {
		l.errorf(at("cache_size"), f+".cache_size", "", "%d: want 1 to 1000000 (default 1024)", c.CacheSize)
	}
	if c.RefreshSkew < 0 {
		l.errorf(at("refresh_skew"), f+".refresh_skew", "", "negative duration")
	}
	if r := c.Retry; r != nil {
		if r.Attempts < 0 || r.Attempts > 20 {
			l.errorf(at("retry", "attempts"), f+".retry.attempts", "", "%d: want 0 to 20 (default 6)", r.Attempts)
		}
		if r.Initial < 0 || r.Max < 0 {
			l.errorf(at("retry"), f+".retry", "", "negative duration")
		} else if r.Initial > 0 && r.Max > 0 && r.Max < r.Initial {
			l.errorf(at("retry", "max"), f+".retry.max", "", "%s is less than initial %s", r.Max, r.Initial)
		}
	}
	if c.Audience != "" {
		if pu, err := url.Parse(c.Audience); err != nil || pu.Scheme == "" {
			l.errorf(at("audience"), f+".audience", "", "%q: want an absolute URI", c.Audience)
		}
	}
	if c.Source == SourceExec {
		if c.OAuth != nil {
			l.errorf(at("oauth"), f+".oauth", "remove it", "applies to the OAuth sources, not exec")
		}
		e := c.Exec
		if e == nil || e.Command == "" {
			l.errorf(at("exec"), f+".exec.command", "", "missing: the helper program to run")
			return
		}
		if strings.ContainsRune(e.Command, '/') {
			e.Command = absPath(dir, e.Command)
		}
		if e.Timeout < 0 {
			l.errorf(at("exec", "timeout"), f+".exec.timeout", "", "negative duration")
		}
		for _, k := range slices.Sorted(maps.Keys(e.Env)) {
			if !envNameRE.MatchString(k) {
				l.errorf(at("exec", "env"), f+".exec.env", "", "%q is not a valid environment variable name", k)
			}
		}
		return
	}
	if c.Exec != nil {
		l.errorf(at("exec"), f+".exec", "remove it", "applies to source: exec only")
	}
	o := c.OAuth
	if o == nil {
		l.errorf(cn, f+".oauth", "", "missing: the OAuth client (client_id, and issuer or token_endpoint)")
		return
	}
	if o.ClientID == "" {
		l.errorf(at("oauth"), f+".oauth.client_id", "", "missing: the client id registered at the authorization server")
	}
	if o.Issuer == "" && o.TokenEndpoint == "" && c.Source != SourceAuthorizationCode {
		l.errorf(at("oauth"), f+".oauth", "", "missing: issuer (its metadata is discovered) or token_endpoint")
	}
	if c.Source == SourceAuthorizationCode {
		// Without issuer and endpoints: discovered from the upstream's
		// 401 and its protected resource metadata (RFC 9728).
		if o.TokenEndpoint != "" && o.AuthorizationEndpoint == "" && o.Issuer == "" {
			l.errorf(at("oauth"), f+".oauth.authorization_endpoint", "", "missing: authorization_code needs it with token_endpoint (or give issuer)")
		}
		if o.LoginURL == "" {
			l.errorf(at("oauth"), f+".oauth.login_url", "e.g. https://gateway.example/oauth/upstream/"+u.Name+" (register <login_url>/callback at the authorization server)",
				"missing: the gateway's URL of the sign-in pages a URL elicitation sends a person to")
		}
	} else if o.LoginURL != "" {
		l.errorf(at("oauth", "login_url"), f+".oauth.login_url", "remove it", "applies to source: authorization_code only")
	}
	if o.LoginURL != "" {
		if pu, err := url.Parse(o.LoginURL); err == nil && (pu.Path == "" || pu.Path == "/" || strings.HasSuffix(pu.Path, "/") || pu.RawQuery != "" || pu.Fragment != "") {
			l.errorf(at("oauth", "login_url"), f+".oauth.login_url", "", "%q: want a path of its own without a trailing slash, query or fragment, e.g. /oauth/upstream/%s", o.LoginURL, u.Name)
		}
	}
	for _, e := range []struct{ key, v string }{{"issuer", o.Issuer}, {"token_endpoint", o.TokenEndpoint}, {"authorization_endpoint", o.AuthorizationEndpoint}, {"login_url", o.LoginURL}} {
		if e.v == "" {
			continue
		}
		pu, err := url.Parse(e.v)
		switch {
		case err != nil || pu.Host == "" || (pu.Scheme != "https" && pu.Scheme != "http"):
			l.errorf(at("oauth", e.key), f+".oauth."+e.key, "", "%q: want an https:// URL", e.v)
		case pu.Scheme == "http" && !o.AllowPlaintext && !IsLoopbackHost(pu.Hostname()):
			l.errorf(at("oauth", e.key), f+".oauth."+e.key, "use https://, or set allow_plaintext: true",
				"plaintext http:// to %s, which is not a loopback address, would send credentials in the clear", pu.Host)
		case pu.User != nil || pu.RawQuery != "":
			l.errorf(at("oauth", e.key), f+".oauth."+e.key, "", "carries user info or a query; put the client secret in client_secret_env / client_secret_file")
		}
	}
	if o.ClientSecretEnv != "" && o.ClientSecretFile != "" {
		l.errorf(at("oauth", "client_secret_file"), f+".oauth", "", "set client_secret_env or client_secret_file, not both")
	}
	if o.ClientSecretEnv != "" && !envNameRE.MatchString(o.ClientSecretEnv) {
		l.errorf(at("oauth", "client_secret_env"), f+".oauth.client_secret_env", "", "%q is not a valid environment variable name", o.ClientSecretEnv)
	}
	if (c.Source == SourceClientCredentials || c.Source == SourceTokenExchange) && o.ClientSecretEnv == "" && o.ClientSecretFile == "" {
		l.errorf(at("oauth"), f+".oauth.client_secret_env", "", "missing: %s authenticates the gateway as a confidential client (client_secret_env or client_secret_file)", c.Source)
	}
	if o.SubjectTokenType != "" && c.Source != SourceTokenExchange {
		l.errorf(at("oauth", "subject_token_type"), f+".oauth.subject_token_type", "remove it", "applies to source: token_exchange only")
	}
	o.ClientSecretFile = absPath(dir, o.ClientSecretFile)
}

// credentialSourceEnv adds the client secrets' variables to creds.
func credentialSourceEnv(f string, h *HTTP, out map[string]string) {
	if h.Credential != nil && h.Credential.OAuth != nil && h.Credential.OAuth.ClientSecretEnv != "" {
		if _, dup := out[h.Credential.OAuth.ClientSecretEnv]; !dup {
			out[h.Credential.OAuth.ClientSecretEnv] = f + ".credential.oauth.client_secret_env"
		}
	}
}
