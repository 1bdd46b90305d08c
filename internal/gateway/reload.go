package gateway

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/confidential-mcp/cmcp/internal/front/httpfront"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// Admin record actions of a SIGHUP reload (actor "SIGHUP").
const (
	AdminTokensReloaded = "tokens_reloaded"
	AdminReloadRejected = "reload_rejected"
	// AdminUpstreamCredentialsReloaded names the HTTP upstreams whose
	// credential files held another credential on SIGHUP (never the value).
	AdminUpstreamCredentialsReloaded = "upstream_credentials_reloaded"
	// ReloadActor is the actor of the records a SIGHUP reload writes.
	ReloadActor = "SIGHUP"
)

// ReloadTargets is what a reload changes besides the policy.
type ReloadTargets struct {
	// Tokens are the HTTP front's bearer tokens; nil for serve --stdio.
	Tokens *httpfront.TokenSet
	// Open: the HTTP front started without tokens or client certificates
	// (development mode), which a reload does not change.
	Open bool
	// Admin is the admin listener (an AdminToken: *admin.Admin), once it
	// runs.
	Admin atomic.Value
}

// AdminToken is the admin listener's bearer token in force, which a
// reload replaces.
type AdminToken interface {
	TokenDigest() digest.Digest
	SetTokenDigest(d digest.Digest) error
}

// ReloadedTokens are the credentials a reloaded configuration puts in
// force.
type ReloadedTokens struct {
	// Agents are server.tokens (nil: no server section).
	Agents []httpfront.Token
	// Admin is admin.token_sha256 (nil: no admin section).
	Admin *digest.Digest
}

// ReloadTokens puts the reloaded agent tokens and admin token next in
// force, records the change and ends the HTTP sessions opened with a token
// that no longer maps to their identity and the sessions of identities left
// without a token. A change it cannot apply without a restart is added to
// restart.
func (g *Gateway) ReloadTokens(ctx context.Context, next ReloadedTokens, rt *ReloadTargets, restart *[]string) error {
	var notes []string
	var removed []string
	var nowOf map[digest.Digest]string // token -> identity, once tokens changed
	if rt.Tokens != nil {
		next := next.Agents
		switch change := httpfront.CompareTokens(rt.Tokens.Load(), next); {
		case change == nil:
		case rt.Open:
			*restart = append(*restart, "server.tokens (the gateway started without authentication)")
		default:
			rt.Tokens.Store(next)
			removed, nowOf = change.Removed, change.NowOf
			g.forgetCredentials(removed)
			notes = append(notes, change.Note)
			if len(next) == 0 {
				g.logger.Warn("SIGHUP: server.tokens is empty now: every bearer token is refused until tokens are configured again (the gateway does not switch to unauthenticated development mode)")
			}
		}
	}
	if adm, _ := rt.Admin.Load().(AdminToken); adm != nil && next.Admin != nil && !next.Admin.Equal(adm.TokenDigest()) {
		if err := adm.SetTokenDigest(*next.Admin); err != nil {
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
	if rerr := g.record(ctx, &record.Admin{Action: AdminTokensReloaded, Actor: ReloadActor, Reason: reason}); rerr != nil {
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
