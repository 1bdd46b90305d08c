package credential

import (
	"fmt"
	"os/exec"
	"path/filepath"

	"github.com/confidential-mcp/cmcp/internal/config"
)

// Env is how a source reads what the configuration names: the gateway's
// environment (client_secret_env) and files (client_secret_file).
type Env struct {
	LookupEnv func(string) (string, bool)
	OnMint    func(Minted)
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
		s, err := oauthSource(name, c, env)
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
func oauthSource(name string, c *config.CredentialSource, _ Env) (Source, error) {
	return nil, fmt.Errorf("upstream %q: credential source %s is not available yet", name, c.Source)
}
