package server

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/confidential-mcp/cmcp/internal/config"
	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/confidential-mcp/cmcp/internal/gateway"
	"github.com/confidential-mcp/cmcp/internal/policy"
)

// PolicyFromConfig loads the bundle named by the configuration's policy
// section and starts an engine on it; nil without a policy section. A bundle
// that does not parse, does not validate or does not match policy.expect is
// an error that names the file, line and reason.
func PolicyFromConfig(ctx context.Context, cfg *config.Config, logger *slog.Logger) (*policy.Engine, error) {
	p := cfg.Policy
	if p == nil {
		return nil, nil
	}
	mode, err := policy.ParseMode(p.Mode)
	if err != nil {
		return nil, exitcode.WithCode(exitcode.ExitConfig, fmt.Errorf("%s: %w", cfg.Path, err))
	}
	b, err := policy.Load(ctx, cfg.Resolve(p.Dir), policy.LoadOptions{Expect: p.Expect})
	if err != nil {
		return nil, fmt.Errorf("%s: policy: %w", cfg.Path, err)
	}
	if p.Expect.IsZero() && logger != nil {
		logger.Warn("the policy bundle is not pinned: any bundle in its directory is accepted; pin it", "policy.expect", b.Digest().String())
	}
	return policy.NewEngine(b, mode, p.Groups), nil
}

// ReloadPolicyFromConfig reads the configuration file again and reloads
// the bundle its policy section names, with the pin, mode and groups it
// gives now. Nothing else in the file is applied (SIGHUP does more:
// reload.go). A refused reload is recorded and the old bundle stays in
// force.
func ReloadPolicyFromConfig(ctx context.Context, g *gateway.Gateway, path string) error {
	eng := g.PolicyEngine()
	if eng == nil {
		return fmt.Errorf("no policy is configured: a policy section can only be added with a restart (the genesis record names the policy)")
	}
	cfg, err := config.Load(path)
	if err != nil {
		return g.RejectPolicyReload(ctx, fmt.Errorf("reload refused: %w", err))
	}
	return reloadPolicyFrom(ctx, g, cfg)
}

// reloadPolicyFrom reloads the bundle the loaded configuration cfg names
// (the gateway runs a policy).
func reloadPolicyFrom(ctx context.Context, g *gateway.Gateway, cfg *config.Config) error {
	reject := func(err error) error { return g.RejectPolicyReload(ctx, err) }
	path := cfg.Path
	if cfg.Policy == nil {
		return reject(fmt.Errorf("reload refused: %s has no policy section any more; a gateway drops its policy only with a restart", path))
	}
	mode, err := policy.ParseMode(cfg.Policy.Mode)
	if err != nil {
		return reject(fmt.Errorf("reload refused: %w", err))
	}
	return g.ReloadPolicy(ctx, cfg.Resolve(cfg.Policy.Dir), cfg.Policy.Expect, mode, cfg.Policy.Groups)
}

// reloadOnSIGHUP reloads the configuration file at path on every SIGHUP
// (reload.go: the policy, the agents' tokens and the admin token; other
// changes are named as needing a restart) until ctx ends or the returned
// stop is called.
func reloadOnSIGHUP(ctx context.Context, g *gateway.Gateway, path string, rt *reloadTargets, logger *slog.Logger) (stop func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-done:
				return
			case <-hup:
				logger.Info("SIGHUP: reloading the configuration", "config", path)
				reloadConfig(ctx, g, path, rt) // logs and records every outcome
			}
		}
	}()
	return func() {
		signal.Stop(hup)
		close(done)
	}
}
