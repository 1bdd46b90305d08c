package gateway

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/credential"
)

// Per-identity upstream credentials (internal/credential, docs/credentials.md):
// the few places the gateway core meets them.

// perIdentity reports whether st's connections carry a credential minted
// for the session's identity: such an upstream has no connection without
// a session (no catalog probe at start, no background re-probe), and its
// catalog is learnt on the first identity's connection.
func (st *upState) perIdentity() bool {
	return st.opts.Credentials != nil && st.opts.Credentials.PerIdentity()
}

// identityFor is who a connection of st for session s serves: the
// session's agent, its groups (the policy's and its OAuth token's, sorted,
// once each) and, for an agent signed in with OAuth, its latest verified
// access token, which a token_exchange source sends as the subject token
// to its token endpoint and nowhere else (nil without a credential source
// or a session).
func (st *upState) identityFor(s *session) *credential.Identity {
	if st.opts.Credentials == nil || s == nil {
		return nil
	}
	id := &credential.Identity{Name: s.principal}
	var groups []string
	if e := st.g.opts.Policy; e != nil {
		groups = append(groups, e.GroupsOf(s.principal)...)
	}
	groups = append(groups, s.credGroups()...)
	if len(groups) > 0 {
		slices.Sort(groups)
		id.Groups = slices.Compact(groups)
	}
	if t := s.authToken.Load(); t != nil {
		id.Token = *t
	}
	return id
}

// loadFor loads st's catalog; a per-identity upstream's as s's identity
// (its connection is then s's own).
func (st *upState) loadFor(ctx context.Context, s *session) error {
	if !st.perIdentity() {
		return st.load(ctx)
	}
	if s == nil {
		return fmt.Errorf("upstream %q: its credential is minted per identity; it is connected on an agent's first call", st.name)
	}
	_, err := s.upstreamFor(ctx, st.name)
	return err
}

// credentialFault is the answer to an agent whose call needs it to sign in
// at the upstream's authorization server first (credential.Fault), nil if
// err is not that.
func (s *session) credentialFault(err error) *jsonrpc.Error {
	ss := s.downSession()
	var ip *mcp.InitializeParams
	if ss != nil {
		ip = ss.InitializeParams()
	}
	urlMode := ip != nil && ip.Capabilities != nil && ip.Capabilities.Elicitation != nil && ip.Capabilities.Elicitation.URL != nil
	return credential.Fault(err, urlMode)
}

// NotifyElicitationComplete sends notifications/elicitation/complete for
// the URL elicitation elicitationID to identity's sessions (clients ignore
// an id they did not get): its person finished signing in.
func (g *Gateway) NotifyElicitationComplete(identity, elicitationID string) {
	for _, s := range g.sessionList() {
		if s.principal != identity {
			continue
		}
		if ss := s.downSession(); ss != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = ss.NotifyElicitationComplete(ctx, &mcp.ElicitationCompleteParams{ElicitationID: elicitationID})
			cancel()
		}
	}
}

// forgetCredentials drops the upstream credentials (and authorization_code
// grants) of identities a reload left without a token.
func (g *Gateway) forgetCredentials(ids []string) {
	if len(ids) == 0 {
		return
	}
	for _, st := range g.ups {
		if b := st.opts.Credentials; b != nil {
			if n := b.Forget(ids...); n > 0 {
				g.logger.Info("SIGHUP: upstream credentials of identities left without a token dropped", "upstream", st.name, "identities", n)
			}
		}
	}
}
