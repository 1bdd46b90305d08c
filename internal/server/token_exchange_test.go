package server

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/zitadel/oidc/v3/pkg/oidc"

	"github.com/confidential-mcp/cmcp/internal/credential/credtest"
	"github.com/confidential-mcp/cmcp/internal/front/httpfront"
	"github.com/confidential-mcp/cmcp/internal/oauthtest"
)

// TestServeTokenExchangeAsEachOAuthAgent: serve with server.oauth and an
// HTTP upstream whose credential is token_exchange (RFC 8693) at the same
// zitadel OP. Two agents signed in with OAuth each reach the upstream with
// a token exchanged for their own verified access token (the upstream
// sees each person's own subject), the upstream never sees an agent's own
// token, and the OP exchanges once per agent; a static-token agent is refused.
func TestServeTokenExchangeAsEachOAuthAgent(t *testing.T) {
	alice := oauthtest.User{Subject: "u-alice", Email: "alice@example.com", EmailVerified: true, Password: "alice-pw"}
	bob := oauthtest.User{Subject: "u-bob", Email: "bob@example.com", EmailVerified: true, Password: "bob-pw"}
	as := oauthtest.Start(t, oauthtest.Options{Users: []oauthtest.User{alice, bob}, Clients: []oauthtest.Client{
		{ID: "agent", RedirectURIs: []string{"http://127.0.0.1:1/callback"}},
		{ID: "gateway", Secret: "gateway-secret"},
	}})
	u := credtest.Start(t)
	u.Trust(as.SubjectOf(u.URL))
	addr := freePort(t)
	resource := "http://" + addr + "/mcp"
	cfg := fmt.Sprintf(`version: 1
server:
  listen: %s
  tee: software
  tokens: [{identity: ci-bot, sha256: %q}]
  oauth:
    issuer: %s
    resource: %s
    identity_claim: email
    scopes: [mcp:tools]
audit:
  dir: audit
upstreams:
  - name: remote
    http:
      url: %s
      credential:
        source: token_exchange
        oauth:
          issuer: %s
          client_id: gateway
          client_secret_env: GATEWAY_CLIENT_SECRET
`, addr, httpfront.TokenDigest("ci-bot-token").String(), as.Issuer, resource, u.URL, as.Issuer)
	endpoint, auditDir := serveYAML(t, t.TempDir(), cfg, append(os.Environ(), "GATEWAY_CLIENT_SECRET=gateway-secret"))

	var agentTokens []string
	for _, p := range []oauthtest.User{alice, bob, alice} {
		// The agent's own access token for the gateway, from its person
		// signing in (code flow with PKCE).
		tok, err := as.CodeFlowToken(t.Context(), "agent", p.Email, resource, "mcp:tools")
		if err != nil {
			t.Fatal(err)
		}
		agentTokens = append(agentTokens, tok.AccessToken)
		cs, err := connectWith(endpoint, tok.AccessToken)
		if err != nil {
			t.Fatalf("%s: %v", p.Email, err)
		}
		w, err := whoamiVia(t, cs)
		cs.Close()
		if err != nil || w.Identity != p.Subject {
			t.Fatalf("%s's call reached the upstream as %q (%v), want its own subject %s", p.Email, w.Identity, err, p.Subject)
		}
	}
	if n := as.Issued(oidc.GrantTypeTokenExchange); n != 2 {
		t.Errorf("%d exchanges, want one per agent (the second call of alice uses the cached one)", n)
	}
	seen := u.Seen()
	if len(seen) == 0 {
		t.Fatal("the upstream saw no credential")
	}
	for _, h := range seen {
		for _, a := range agentTokens {
			if strings.Contains(h, a) {
				t.Fatalf("an agent's own token reached the upstream")
			}
		}
	}
	// A static-token agent has no token to exchange: a clear refusal.
	cs, err := connectWith(endpoint, "ci-bot-token")
	if err != nil {
		t.Fatal(err)
	}
	_, err = whoamiVia(t, cs)
	cs.Close()
	if err == nil || !strings.Contains(err.Error(), "signed in without an OAuth token") {
		t.Fatalf("static-token agent: %v, want a refusal naming the missing OAuth token", err)
	}
	// No record holds an agent's token or an exchanged one.
	raw := fmt.Sprint(readRecords(t, auditDir))
	for _, s := range append(agentTokens, seen...) {
		if tok := strings.TrimPrefix(s, "Bearer "); tok != "" && strings.Contains(raw, tok) {
			t.Fatalf("the audit log holds a token")
		}
	}
}
