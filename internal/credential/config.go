package credential

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/confidential-mcp/cmcp/internal/config"
)

// Env is how a source reads what the configuration names: the gateway's
// environment (client_secret_env) and files (client_secret_file).
type Env struct {
	LookupEnv func(string) (string, bool)
	OnMint    func(Minted)
	// OnSignIn is called when an identity finished an authorization_code
	// sign-in (elicitationID: the URL elicitation it completes).
	OnSignIn func(identity, elicitationID string)
}

// FromConfig builds the broker of upstream name from its credential:
// section (validated by config.Load). endpoint is the upstream's URL
// without its query, the default audience.
func FromConfig(name, endpoint string, c *config.CredentialSource, env Env) (*Broker, error) {
	errf := func(format string, args ...any) error {
		return fmt.Errorf("upstream %q: credential: "+format, append([]any{name}, args...)...)
	}
	var src Source
	switch c.Source {
	case config.SourceExec:
		e := c.Exec
		cmd := e.Command
		if !filepath.IsAbs(cmd) {
			p, err := exec.LookPath(cmd)
			if err != nil {
				return nil, errf("exec.command %q: %w", cmd, err)
			}
			if p, err = filepath.Abs(p); err != nil {
				return nil, errf("exec.command %q: %w", cmd, err)
			}
			cmd = p
		}
		src = &Exec{Command: cmd, Args: e.Args, Env: e.Env, Timeout: e.Timeout}
	default:
		s, err := oauthSource(name, endpoint, c, env)
		if err != nil {
			return nil, err
		}
		src = s
	}
	o := Options{Audience: c.Audience, CacheSize: c.CacheSize, RefreshSkew: c.RefreshSkew, OnMint: env.OnMint}
	if o.Audience == "" {
		o.Audience = endpoint
	}
	if r := c.Retry; r != nil {
		o.Retry = Retry{Attempts: r.Attempts, Initial: r.Initial, Max: r.Max}
	}
	return NewBroker(name, src, o), nil
}

// oauthSource builds the OAuth sources.
func oauthSource(name, endpoint string, c *config.CredentialSource, env Env) (Source, error) {
	o := c.OAuth
	cl := &OAuthClient{Upstream: name, Issuer: o.Issuer, TokenEndpoint: o.TokenEndpoint, AuthorizationEndpoint: o.AuthorizationEndpoint,
		ClientID: o.ClientID, Scopes: o.Scopes, Resource: o.Resource, ResourceURL: endpoint}
	switch {
	case o.ClientSecretEnv != "":
		lookup := env.LookupEnv
		if lookup == nil {
			lookup = os.LookupEnv
		}
		v, ok := lookup(o.ClientSecretEnv)
		if !ok || v == "" {
			return nil, fmt.Errorf("upstream %q: credential.oauth.client_secret_env: environment variable %s is not set (or empty) in the gateway's environment", name, o.ClientSecretEnv)
		}
		cl.ClientSecret = NewSecret(v)
	case o.ClientSecretFile != "":
		b, err := os.ReadFile(o.ClientSecretFile)
		if err != nil {
			return nil, fmt.Errorf("upstream %q: credential.oauth.client_secret_file: %w", name, err)
		}
		v, err := config.Credential(b)
		if err != nil {
			return nil, fmt.Errorf("upstream %q: credential.oauth.client_secret_file: %s %w", name, o.ClientSecretFile, err)
		}
		cl.ClientSecret = NewSecret(v)
	}
	switch c.Source {
	case config.SourceClientCredentials:
		return &ClientCredentials{Client: cl}, nil
	case config.SourceTokenExchange:
		return &TokenExchange{Client: cl, SubjectTokenType: o.SubjectTokenType}, nil
	case config.SourceAuthorizationCode:
		return &AuthorizationCode{Client: cl, LoginURL: o.LoginURL, OnComplete: env.OnSignIn}, nil
	}
	return nil, fmt.Errorf("upstream %q: unknown credential source %q", name, c.Source)
}
