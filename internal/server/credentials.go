package server

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"

	"github.com/confidential-mcp/cmcp/internal/config"
	"github.com/confidential-mcp/cmcp/internal/credential"
	"github.com/confidential-mcp/cmcp/internal/gateway"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// credentialEnv is how a source reads what the configuration names: the
// gateway's environment (client_secret_env) and files
// (client_secret_file); and where what it does is told.
type credentialEnv struct {
	LookupEnv func(string) (string, bool)
	OnMint    func(credential.Minted)
	// OnSignIn is called when an identity finished an authorization_code
	// sign-in (elicitationID: the URL elicitation it completes).
	OnSignIn func(identity, elicitationID string)
}

// credentialBroker builds the broker of upstream name from its
// credential: section (validated by config.Load). endpoint is the
// upstream's URL without its query, the default audience.
func credentialBroker(name, endpoint string, c *config.CredentialSource, env credentialEnv) (*credential.Broker, error) {
	errf := func(format string, args ...any) error {
		return fmt.Errorf("upstream %q: credential: "+format, append([]any{name}, args...)...)
	}
	var src credential.Source
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
		src = &credential.Exec{Command: cmd, Args: e.Args, Env: e.Env, Timeout: e.Timeout}
	default:
		s, err := oauthSource(name, endpoint, c, env)
		if err != nil {
			return nil, err
		}
		src = s
	}
	o := credential.Options{Audience: c.Audience, CacheSize: c.CacheSize, RefreshSkew: c.RefreshSkew, OnMint: env.OnMint}
	if o.Audience == "" {
		o.Audience = endpoint
	}
	if r := c.Retry; r != nil {
		o.Retry = credential.Retry{Attempts: r.Attempts, Initial: r.Initial, Max: r.Max}
	}
	return credential.NewBroker(name, src, o), nil
}

// oauthSource builds the OAuth sources.
func oauthSource(name, endpoint string, c *config.CredentialSource, env credentialEnv) (credential.Source, error) {
	o := c.OAuth
	cl := &credential.OAuthClient{Upstream: name, Issuer: o.Issuer, TokenEndpoint: o.TokenEndpoint, AuthorizationEndpoint: o.AuthorizationEndpoint,
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
		cl.ClientSecret = credential.NewSecret(v)
	case o.ClientSecretFile != "":
		b, err := os.ReadFile(o.ClientSecretFile)
		if err != nil {
			return nil, fmt.Errorf("upstream %q: credential.oauth.client_secret_file: %w", name, err)
		}
		v, err := config.Credential(b)
		if err != nil {
			return nil, fmt.Errorf("upstream %q: credential.oauth.client_secret_file: %s %w", name, o.ClientSecretFile, err)
		}
		cl.ClientSecret = credential.NewSecret(v)
	}
	switch c.Source {
	case config.SourceClientCredentials:
		return &credential.ClientCredentials{Client: cl}, nil
	case config.SourceTokenExchange:
		return &credential.TokenExchange{Client: cl, SubjectTokenType: o.SubjectTokenType}, nil
	case config.SourceAuthorizationCode:
		return &credential.AuthorizationCode{Client: cl, LoginURL: o.LoginURL, OnComplete: env.OnSignIn}, nil
	}
	return nil, fmt.Errorf("upstream %q: unknown credential source %q", name, c.Source)
}

// mintRecorder writes a credential_minted record for every credential a
// broker mints, once the audit log is open (the brokers are built
// before), and tells an identity's sessions that its sign-in completed.
type mintRecorder struct {
	log    atomic.Pointer[auditlog.Writer]
	logger atomic.Pointer[slog.Logger]
	gw     atomic.Pointer[gateway.Gateway]
}

func (m *mintRecorder) record(c credential.Minted) {
	w := m.log.Load()
	if w == nil {
		return
	}
	rec := &record.CredentialMinted{Upstream: c.Upstream, Identity: c.Identity, Source: c.Source, Reason: c.Reason, Fingerprint: c.Fingerprint}
	if !c.Expiry.IsZero() {
		rec.Expires = c.Expiry.UTC().Format("2006-01-02T15:04:05Z07:00")
	}
	if _, err := w.Append(context.Background(), rec); err != nil {
		if l := m.logger.Load(); l != nil {
			l.Error("audit append failed for a minted credential", "upstream", c.Upstream, "identity", c.Identity, "err", err)
		}
	}
}

func (m *mintRecorder) signedIn(identity, elicitationID string) {
	if g := m.gw.Load(); g != nil {
		g.NotifyElicitationComplete(identity, elicitationID)
	}
}

// loginHandlers mounts the sign-in pages of the authorization_code
// upstreams on mux, each under its login_url's path.
func loginHandlers(mux *http.ServeMux, ups []gateway.UpstreamOptions) error {
	for _, u := range ups {
		if u.Credentials == nil {
			continue
		}
		ac, ok := u.Credentials.SourceImpl().(*credential.AuthorizationCode)
		if !ok {
			continue
		}
		lu, err := url.Parse(ac.LoginURL)
		if err != nil {
			return fmt.Errorf("upstream %q: login_url: %w", u.Credentials.Upstream(), err)
		}
		mux.Handle(lu.Path+"/", http.StripPrefix(lu.Path, ac.Handler()))
	}
	return nil
}
