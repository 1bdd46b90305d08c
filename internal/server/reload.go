package server

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/confidential-mcp/cmcp/internal/config"
	"github.com/confidential-mcp/cmcp/internal/gateway"
	"github.com/confidential-mcp/cmcp/internal/upstream"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// What SIGHUP changes. It re-reads the configuration file; a file that does
// not load changes nothing (recorded: reload_rejected, and the policy's
// "rejected" when a policy runs). From a file that loads it applies the
// policy (policy.go, validated and pinned as before), the agents' bearer
// tokens (server.tokens) and the admin token (admin.token_sha256), each
// set replaced as a whole for every request from then on and recorded
// (tokens_reloaded). An HTTP session opened with a bearer token that no
// longer maps to the identity it mapped to (withdrawn, rotated, or moved to
// another identity) is ended, its open GET stream with it, and so are the
// sessions of an identity left without any token; sessions a client
// certificate identified are otherwise untouched. Every HTTP request is
// authenticated again anyway, so a request with a token no longer in force
// is refused (401, or 403 on another identity's session). The credential
// files of HTTP upstreams (bearer_token_file, headers_from_file, as named
// at start) are read again and a changed credential is sent with every
// request from then on, open connections included (recorded:
// upstream_credentials_reloaded); one that cannot be read changes nothing
// for its upstream. Credentials from environment variables are read only
// at start. Every other setting that differs from the
// file the gateway started with takes effect only after a restart: SIGHUP
// names those settings in a warning.

// reloadTargets is what a SIGHUP reload can change besides the policy.
type reloadTargets struct {
	// started is the configuration as read from the file at start (before
	// command-line overrides), to tell which settings need a restart.
	started *config.Config
	// ups are the gateway's upstreams (their credential files are read
	// again).
	ups []gateway.UpstreamOptions
	gateway.ReloadTargets
}

// reloadConfig is what SIGHUP does (see above). It returns what went wrong,
// each problem also logged and recorded.
func reloadConfig(ctx context.Context, g *gateway.Gateway, path string, rt *reloadTargets) error {
	cfg, err := config.Load(path)
	if err != nil {
		err = fmt.Errorf("reload refused: %w", err)
		g.Logger().Error("SIGHUP: the configuration is invalid; nothing was changed (tokens, admin token and policy stay in force)", "config", path, "err", err)
		g.Record(ctx, &record.Admin{Action: gateway.AdminReloadRejected, Actor: gateway.ReloadActor, Reason: err.Error()})
		if eng := g.PolicyEngine(); eng != nil {
			g.Record(ctx, &record.Policy{Event: "rejected", Previous: eng.Bundle().Digest(), Mode: string(eng.Mode()), Reason: err.Error()})
		}
		return err
	}
	restart := restartOnlyChanges(rt.started, cfg)
	terr := g.ReloadTokens(ctx, reloadedTokens(cfg), &rt.ReloadTargets, &restart)
	if len(restart) > 0 {
		g.Logger().Warn("SIGHUP: these settings changed in the configuration but take effect only after a restart; the running gateway keeps the ones it started with",
			"settings", strings.Join(restart, ", "), "config", path)
	}
	cerr := reloadUpstreamCredentials(ctx, g, rt.ups)
	var perr error
	if g.PolicyEngine() != nil {
		g.Logger().Info("SIGHUP: reloading the policy", "config", path)
		perr = reloadPolicyFrom(ctx, g, cfg) // logs and records either outcome
	}
	// Warm spares made before the reload (its credentials, the files it
	// measured then) are not handed out after it.
	g.DrainSpares("configuration reloaded (SIGHUP)")
	return errors.Join(terr, cerr, perr)
}

// reloadUpstreamCredentials reads the credential files of the HTTP
// upstreams of ups again (upstream.HTTPUpstream.ReloadCredentials), and logs and records
// which upstreams' credentials changed.
func reloadUpstreamCredentials(ctx context.Context, g *gateway.Gateway, ups []gateway.UpstreamOptions) error {
	var changed, fromEnv []string
	var errs []error
	for _, u := range ups {
		h, ok := u.Upstream.(*upstream.HTTPUpstream)
		if !ok {
			continue
		}
		name := h.Name()
		if h.CredentialsFromEnvironment() {
			fromEnv = append(fromEnv, name)
		}
		switch c, err := h.ReloadCredentials(); {
		case err != nil:
			g.Logger().Error("SIGHUP: an upstream's credential file could not be read again; the credentials read before stay in force", "upstream", name, "err", err)
			errs = append(errs, err)
			// A rotation that did not take must show in the log as well:
			// the old credential stays in force. The error names the file,
			// never its contents.
			reason := fmt.Sprintf("upstream %q: credentials not re-read (%v); the credentials read before stay in force", name, err)
			if rerr := g.Record(ctx, &record.Admin{Action: gateway.AdminReloadRejected, Actor: gateway.ReloadActor, Reason: reason}); rerr != nil {
				errs = append(errs, fmt.Errorf("the failed credential reload could not be recorded: %w", rerr))
			}
		case c:
			changed = append(changed, name)
		}
	}
	if len(fromEnv) > 0 {
		g.Logger().Info("SIGHUP: upstream credentials from environment variables are read only at start; a restart applies new values", "upstreams", strings.Join(fromEnv, ", "))
	}
	if len(changed) == 0 {
		return errors.Join(errs...)
	}
	reason := fmt.Sprintf("credentials re-read from their files, in force for every request from now on: %s", strings.Join(changed, ", "))
	g.Logger().Warn("SIGHUP: upstream credentials reloaded", "upstreams", strings.Join(changed, ", "))
	if rerr := g.Record(ctx, &record.Admin{Action: gateway.AdminUpstreamCredentialsReloaded, Actor: gateway.ReloadActor, Reason: reason}); rerr != nil {
		errs = append(errs, fmt.Errorf("the reloaded upstream credentials are in force but their change could not be recorded: %w", rerr))
	}
	return errors.Join(errs...)
}

// reloadedTokens are the credentials cfg puts in force.
func reloadedTokens(cfg *config.Config) gateway.ReloadedTokens {
	var next gateway.ReloadedTokens
	if cfg.Server != nil {
		next.Agents = tokens(cfg.Server)
	}
	if cfg.Admin != nil {
		d := cfg.Admin.TokenSHA256
		next.Admin = &d
	}
	return next
}

// restartOnlyChanges names the settings that differ between the file the
// gateway started with and cfg and that a reload does not apply. The
// policy section's changes are the policy reload's (it refuses a removed
// one); a policy section added where none ran needs a restart.
func restartOnlyChanges(started, cfg *config.Config) []string {
	var out []string
	so, sn := config.Server{}, config.Server{}
	if started.Server != nil {
		so = *started.Server
	}
	if cfg.Server != nil {
		sn = *cfg.Server
	}
	so.Tokens, sn.Tokens = nil, nil
	vo, vn, ty := reflect.ValueOf(so), reflect.ValueOf(sn), reflect.TypeOf(so)
	for i := range ty.NumField() {
		if !reflect.DeepEqual(vo.Field(i).Interface(), vn.Field(i).Interface()) {
			name, _, _ := strings.Cut(ty.Field(i).Tag.Get("yaml"), ",")
			out = append(out, "server."+name)
		}
	}
	if !reflect.DeepEqual(started.Audit, cfg.Audit) {
		out = append(out, "audit")
	}
	if !reflect.DeepEqual(started.Upstreams, cfg.Upstreams) {
		out = append(out, "upstreams")
	}
	if !reflect.DeepEqual(started.Catalog, cfg.Catalog) {
		out = append(out, "catalog")
	}
	switch {
	case started.Admin == nil && cfg.Admin != nil:
		out = append(out, "admin (added)")
	case started.Admin != nil && cfg.Admin == nil:
		out = append(out, "admin (removed)")
	case started.Admin != nil && started.Admin.Listen != cfg.Admin.Listen:
		out = append(out, "admin.listen")
	}
	if started.Policy == nil && cfg.Policy != nil {
		out = append(out, "policy (added)")
	}
	return out
}
