package credential_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/zitadel/oidc/v3/pkg/oidc"

	"github.com/confidential-mcp/cmcp/internal/credential"
	"github.com/confidential-mcp/cmcp/internal/credential/credtest"
	"github.com/confidential-mcp/cmcp/internal/oauthtest"
)

var (
	userAlice = oauthtest.User{Subject: "u-alice", Email: "alice@example.com", EmailVerified: true, Password: "alice-pw"}
	userBob   = oauthtest.User{Subject: "u-bob", Email: "bob@example.com", EmailVerified: true, Password: "bob-pw"}
	agentApp  = oauthtest.Client{ID: "agent", RedirectURIs: []string{"http://127.0.0.1:1/callback"}}
	gwClient  = oauthtest.Client{ID: "gateway", Secret: "gateway-secret"}
)

// trustAS makes u accept the JWTs as issues for u's own URL (audience),
// as the subject they name.
func trustAS(u *credtest.Upstream, as *oauthtest.Server) {
	u.Trust(as.SubjectOf(u.URL))
}

func TestTokenExchangeMintsForEachIdentity(t *testing.T) {
	as := oauthtest.Start(t, oauthtest.Options{Users: []oauthtest.User{userAlice, userBob}, Clients: []oauthtest.Client{agentApp, gwClient}})
	u := credtest.Start(t)
	trustAS(u, as)
	src := &credential.TokenExchange{Client: &credential.OAuthClient{Upstream: "remote", Issuer: as.Issuer, ClientID: "gateway", ClientSecret: credential.NewSecret("gateway-secret")}}
	b := credential.NewBroker("remote", src, credential.Options{Audience: u.URL, Retry: fastRetry})
	for _, user := range []oauthtest.User{userAlice, userBob} {
		// The agent's own token, from signing in (code flow with PKCE).
		agentTok, err := as.CodeFlowToken(t.Context(), "agent", user.Email, "https://gw.example/mcp", "mcp:tools")
		if err != nil {
			t.Fatal(err)
		}
		id := credential.Identity{Name: user.Email, Token: credential.NewSecret(agentTok.AccessToken)}
		cs, err := connect(t, u, b, id)
		if err != nil {
			t.Fatalf("%s: %v", user.Email, err)
		}
		w, err := whoami(t, cs)
		if err != nil || w.Identity != user.Subject {
			t.Fatalf("%s reached the upstream as %q (%v), want its own subject %s", user.Email, w.Identity, err, user.Subject)
		}
		// The agent's own token never reached the upstream.
		for _, h := range u.Seen() {
			if strings.Contains(h, agentTok.AccessToken) {
				t.Fatalf("the agent's own token was forwarded upstream")
			}
		}
	}
	if n := as.Issued(oidc.GrantTypeTokenExchange); n != 2 {
		t.Errorf("%d exchanges, want one per identity", n)
	}
	// A static-token agent has no token to exchange: a clear refusal.
	_, err := b.Get(context.Background(), credential.Identity{Name: "ci-bot"})
	if err == nil || !strings.Contains(err.Error(), `"ci-bot" signed in without an OAuth token`) {
		t.Fatalf("exchange without a subject token: %v", err)
	}
	// A subject token the server does not accept: its OAuth error, and
	// neither the subject token nor the client secret in the message.
	_, err = b.Get(context.Background(), credential.Identity{Name: "mallory", Token: credential.NewSecret("forged-subject-token")})
	var oe *credential.OAuthError
	if !errors.As(err, &oe) || oe.Status != 400 || strings.Contains(err.Error(), "forged-subject-token") || strings.Contains(err.Error(), "gateway-secret") {
		t.Fatalf("forged subject token: %v", err)
	}
}

func TestClientCredentialsIsOneServiceIdentity(t *testing.T) {
	as := oauthtest.Start(t, oauthtest.Options{Clients: []oauthtest.Client{gwClient}})
	u := credtest.Start(t)
	trustAS(u, as)
	var minted []credential.Minted
	src := &credential.ClientCredentials{Client: &credential.OAuthClient{Upstream: "svc", TokenEndpoint: as.TokenEndpoint(), ClientID: "gateway", ClientSecret: credential.NewSecret("gateway-secret"), Resource: u.URL}}
	b := credential.NewBroker("svc", src, credential.Options{Retry: fastRetry, OnMint: func(m credential.Minted) { minted = append(minted, m) }})
	for _, name := range []string{"alice", "bob"} {
		cs, err := connect(t, u, b, credential.Identity{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		if w, err := whoami(t, cs); err != nil || w.Identity != "gateway" {
			t.Fatalf("%s: %v %v", name, w, err)
		}
	}
	if n := as.Issued(oidc.GrantTypeClientCredentials); n != 1 || len(minted) != 1 || minted[0].Identity != "client:gateway" || minted[0].Expiry.IsZero() {
		t.Errorf("issued %d, records %+v: want one credential for the service identity", n, minted)
	}
	// A wrong secret: the server's refusal, without the secret.
	bad := credential.NewBroker("svc", &credential.ClientCredentials{Client: &credential.OAuthClient{Upstream: "svc", Issuer: as.Issuer, ClientID: "gateway", ClientSecret: credential.NewSecret("wrong-secret")}}, credential.Options{})
	_, err := bad.Get(context.Background(), credential.Identity{Name: "alice"})
	var oe *credential.OAuthError
	if !errors.As(err, &oe) || !slices.Contains([]int{400, 401}, oe.Status) || strings.Contains(err.Error(), "wrong-secret") {
		t.Fatalf("wrong client secret: %v", err)
	}
}

func TestDiscoverAuthServerChecksTheIssuer(t *testing.T) {
	as := oauthtest.Start(t, oauthtest.Options{IssuerPath: "/tenant1"})
	m, err := credential.DiscoverAuthServer(t.Context(), nil, as.Issuer)
	if err != nil || m.TokenEndpoint != as.TokenEndpoint() || m.AuthorizationEndpoint == "" {
		t.Fatalf("%+v %v", m, err)
	}
	_, err = credential.DiscoverAuthServer(t.Context(), nil, as.Issuer+"x")
	if err == nil {
		t.Fatal("discovered an issuer that is not the server's")
	}
}
