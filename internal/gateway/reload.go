package gateway

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/confidential-mcp/cmcp/internal/config"
	"github.com/confidential-mcp/cmcp/internal/upstream"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/digest"
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

// Admin record actions of a SIGHUP reload (actor "SIGHUP").
const (
	AdminTokensReloaded = "tokens_reloaded"
	AdminReloadRejected = "reload_rejected"
	// AdminUpstreamCredentialsReloaded names the HTTP upstreams whose
	// credential files held another credential on SIGHUP (never the value).
	AdminUpstreamCredentialsReloaded = "upstream_credentials_reloaded"
	reloadActor                      = "SIGHUP"
)

// reloadTargets is what a SIGHUP reload can change besides the policy.
type reloadTargets struct {
	// started is the configuration as read from the file at start (before
	// command-line overrides), to tell which settings need a restart.
	started *config.Config
	// tokens are the HTTP front's bearer tokens; nil for serve --stdio.
	tokens *TokenSet
	// open: the HTTP front started without tokens or client certificates
	// (development mode), which a reload does not change.
	open bool
	// admin is the admin listener, once it runs.
	admin atomic.Pointer[Admin]
}

// reloadConfig is what SIGHUP does (see above). It returns what went wrong,
// each problem also logged and recorded.
func (g *Gateway) reloadConfig(ctx context.Context, path string, rt *reloadTargets) error {
	cfg, err := config.Load(path)
	if err != nil {
		err = fmt.Errorf("reload refused: %w", err)
		g.logger.Error("SIGHUP: the configuration is invalid; nothing was changed (tokens, admin token and policy stay in force)", "config", path, "err", err)
		g.record(ctx, &auditlog.Admin{Action: AdminReloadRejected, Actor: reloadActor, Reason: err.Error()})
		if eng := g.opts.Policy; eng != nil {
			g.record(ctx, &auditlog.Policy{Event: "rejected", Previous: eng.Bundle().Digest(), Mode: string(eng.Mode()), Reason: err.Error()})
		}
		return err
	}
	restart := restartOnlyChanges(rt.started, cfg)
	terr := g.reloadTokens(ctx, cfg, rt, &restart)
	if len(restart) > 0 {
		g.logger.Warn("SIGHUP: these settings changed in the configuration but take effect only after a restart; the running gateway keeps the ones it started with",
			"settings", strings.Join(restart, ", "), "config", path)
	}
	cerr := g.reloadUpstreamCredentials(ctx)
	var perr error
	if g.opts.Policy != nil {
		g.logger.Info("SIGHUP: reloading the policy", "config", path)
		perr = g.reloadPolicyFrom(ctx, cfg) // logs and records either outcome
	}
	return errors.Join(terr, cerr, perr)
}

// reloadUpstreamCredentials reads the HTTP upstreams' credential files
// again (upstream.HTTPUpstream.ReloadCredentials), and logs and records
// which upstreams' credentials changed.
func (g *Gateway) reloadUpstreamCredentials(ctx context.Context) error {
	var changed, fromEnv []string
	var errs []error
	for _, name := range g.order {
		h, ok := g.ups[name].opts.Upstream.(*upstream.HTTPUpstream)
		if !ok {
			continue
		}
		if h.CredentialsFromEnvironment() {
			fromEnv = append(fromEnv, name)
		}
		switch c, err := h.ReloadCredentials(); {
		case err != nil:
			g.logger.Error("SIGHUP: an upstream's credential file could not be read again; the credentials read before stay in force", "upstream", name, "err", err)
			errs = append(errs, err)
			// A rotation that did not take must show in the log as well:
			// the old credential stays in force. The error names the file,
			// never its contents.
			reason := fmt.Sprintf("upstream %q: credentials not re-read (%v); the credentials read before stay in force", name, err)
			if rerr := g.record(ctx, &auditlog.Admin{Action: AdminReloadRejected, Actor: reloadActor, Reason: reason}); rerr != nil {
				errs = append(errs, fmt.Errorf("the failed credential reload could not be recorded: %w", rerr))
			}
		case c:
			changed = append(changed, name)
		}
	}
	if len(fromEnv) > 0 {
		g.logger.Info("SIGHUP: upstream credentials from environment variables are read only at start; a restart applies new values", "upstreams", strings.Join(fromEnv, ", "))
	}
	if len(changed) == 0 {
		return errors.Join(errs...)
	}
	reason := fmt.Sprintf("credentials re-read from their files, in force for every request from now on: %s", strings.Join(changed, ", "))
	g.logger.Warn("SIGHUP: upstream credentials reloaded", "upstreams", strings.Join(changed, ", "))
	if rerr := g.record(ctx, &auditlog.Admin{Action: AdminUpstreamCredentialsReloaded, Actor: reloadActor, Reason: reason}); rerr != nil {
		errs = append(errs, fmt.Errorf("the reloaded upstream credentials are in force but their change could not be recorded: %w", rerr))
	}
	return errors.Join(errs...)
}

// reloadTokens puts the configuration's agent tokens and admin token in
// force, records the change and ends the HTTP sessions opened with a token
// that no longer maps to their identity and the sessions of identities left
// without a token. A change it cannot apply without a restart is added to
// restart.
func (g *Gateway) reloadTokens(ctx context.Context, cfg *config.Config, rt *reloadTargets, restart *[]string) error {
	var notes []string
	var removed []string
	var nowOf map[digest.Digest]string // token -> identity, once tokens changed
	if rt.tokens != nil {
		var next []Token
		if cfg.Server != nil {
			next = tokens(cfg.Server)
		}
		prev := rt.tokens.Load()
		switch {
		case sameTokens(prev, next):
		case rt.open:
			*restart = append(*restart, "server.tokens (the gateway started without authentication)")
		default:
			rt.tokens.Store(next)
			was, now := identitiesOf(prev), identitiesOf(next)
			for id := range was {
				if !now[id] {
					removed = append(removed, id)
				}
			}
			slices.Sort(removed)
			nowOf = map[digest.Digest]string{}
			for _, t := range next {
				nowOf[t.Digest] = t.Identity
			}
			withdrawn := 0
			for _, t := range prev {
				if nowOf[t.Digest] != t.Identity {
					withdrawn++
				}
			}
			note := fmt.Sprintf("server.tokens: %d tokens for %d identities in force (were %d for %d)", len(next), len(now), len(prev), len(was))
			if withdrawn > 0 {
				note += fmt.Sprintf("; %d tokens withdrawn or moved to another identity, the sessions they opened ended", withdrawn)
			}
			if len(removed) > 0 {
				note += fmt.Sprintf("; identities left without a token, their sessions ended: %s", strings.Join(removed, ", "))
			}
			notes = append(notes, note)
			if len(next) == 0 {
				g.logger.Warn("SIGHUP: server.tokens is empty now: every bearer token is refused until tokens are configured again (the gateway does not switch to unauthenticated development mode)")
			}
		}
	}
	if adm := rt.admin.Load(); adm != nil && cfg.Admin != nil && !cfg.Admin.TokenSHA256.Equal(adm.TokenDigest()) {
		if err := adm.SetTokenDigest(cfg.Admin.TokenSHA256); err != nil {
			return err // config validation requires a token: not reached
		}
		notes = append(notes, "admin.token_sha256: another admin token is in force")
	}
	if len(notes) == 0 {
		g.logger.Info("SIGHUP: server.tokens and admin.token_sha256 are unchanged")
		return nil
	}
	reason := strings.Join(notes, "; ")
	g.logger.Warn("SIGHUP: tokens reloaded", "change", reason)
	var err error
	if rerr := g.record(ctx, &auditlog.Admin{Action: AdminTokensReloaded, Actor: reloadActor, Reason: reason}); rerr != nil {
		err = fmt.Errorf("the reloaded tokens are in force but their change could not be recorded: %w", rerr)
	}
	if nowOf != nil {
		gone := map[string]bool{}
		for _, id := range removed {
			gone[id] = true
		}
		for _, s := range g.sessionList() {
			switch {
			case s.front != "http":
			case gone[s.principal]:
				go s.end(endedFor("the agent's identity no longer has a bearer token (server.tokens reloaded on SIGHUP)"))
			case !s.tokensInForce(nowOf):
				go s.end(endedFor("a bearer token that opened the session or one of its streams no longer maps to its identity (server.tokens reloaded on SIGHUP)"))
			}
		}
	}
	return err
}

func identitiesOf(ts []Token) map[string]bool {
	out := map[string]bool{}
	for _, t := range ts {
		out[t.Identity] = true
	}
	return out
}

// sameTokens reports whether a and b map the same digests to the same
// identities, in any order.
func sameTokens(a, b []Token) bool {
	if len(a) != len(b) {
		return false
	}
	m := map[string]string{}
	for _, t := range a {
		m[t.Digest.String()] = t.Identity
	}
	for _, t := range b {
		if id, ok := m[t.Digest.String()]; !ok || id != t.Identity {
			return false
		}
	}
	return true
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
