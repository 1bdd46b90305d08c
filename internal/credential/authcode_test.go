package credential_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/zitadel/oidc/v3/pkg/oidc"

	"github.com/confidential-mcp/cmcp/internal/credential"
	"github.com/confidential-mcp/cmcp/internal/credential/credtest"
	"github.com/confidential-mcp/cmcp/internal/oauthtest"
)

// signIn follows the elicitation's URL as the person's browser: the
// gateway's start page redirects to the authorization server, the person
// signs in there (the real login form), and the browser comes back to the
// gateway's callback, whose page it returns.
func signIn(t *testing.T, link, username, password string) (int, string) {
	t.Helper()
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noFollow.Get(link)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusFound {
		t.Fatalf("start page: %s", resp.Status)
	}
	authorize := resp.Header.Get("Location")
	if !strings.Contains(authorize, "code_challenge_method=S256") || !strings.Contains(authorize, "code_challenge=") {
		t.Fatalf("the sign-in does not use PKCE: %s", authorize)
	}
	back, err := (&oauthtest.Browser{}).SignIn(t.Context(), authorize, username, password)
	if err != nil {
		t.Fatal(err)
	}
	resp, err = http.Get(back.String())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestAuthorizationCodeElicitationThenCallAsThatPerson: a first call
// without a grant gets the URL elicitation (-32042); the person signs in
// at the upstream's authorization server (driven as a browser against the
// real OP); the retried call reaches the upstream as that person; another
// identity still has to sign in itself; a revoked access token is
// replaced from the refresh token, which never leaves the gateway.
func TestAuthorizationCodeElicitationThenCallAsThatPerson(t *testing.T) {
	u := credtest.Start(t)
	gw := httptest.NewServer(nil)
	defer gw.Close()
	loginURL := gw.URL + "/oauth/upstream/remote"
	as := oauthtest.Start(t, oauthtest.Options{Users: []oauthtest.User{userAlice, userBob},
		Clients: []oauthtest.Client{{ID: "cmcp-gateway", Secret: "gw-secret", RedirectURIs: []string{loginURL + "/callback"}}}})
	trustAS(u, as)
	u.Advertise(as.Issuer)
	var completed []string
	src := &credential.AuthorizationCode{
		// No issuer configured: discovered from the upstream's 401 and
		// its protected resource metadata (RFC 9728), which also gives
		// the resource the tokens are for.
		Client:     &credential.OAuthClient{Upstream: "remote", ResourceURL: u.URL, ClientID: "cmcp-gateway", ClientSecret: credential.NewSecret("gw-secret"), Scopes: []string{oidc.ScopeOfflineAccess}},
		LoginURL:   loginURL,
		OnComplete: func(identity, id string) { completed = append(completed, identity+" "+id) },
	}
	gw.Config.Handler = http.StripPrefix("/oauth/upstream/remote", src.Handler())
	b := credential.NewBroker("remote", src, credential.Options{Retry: fastRetry})
	alice := credential.Identity{Name: "alice@example.com"}

	_, err := connect(t, u, b, alice)
	var need *credential.AuthorizationRequiredError
	if !errors.As(err, &need) || need.Identity != alice.Name || !strings.HasPrefix(need.URL, loginURL+"/start?id=") {
		t.Fatalf("first call without a grant: %v", err)
	}
	// What the agent gets: the MCP URL elicitation.
	var we *jsonrpc.Error
	if !errors.As(need.Elicitation(), &we) || we.Code != mcp.CodeURLElicitationRequired {
		t.Fatalf("elicitation error: %#v", need.Elicitation())
	}
	var data struct {
		Elicitations []mcp.ElicitParams `json:"elicitations"`
	}
	if err := json.Unmarshal(we.Data, &data); err != nil || len(data.Elicitations) != 1 || data.Elicitations[0].Mode != "url" ||
		data.Elicitations[0].URL != need.URL || data.Elicitations[0].ElicitationID != need.ElicitationID {
		t.Fatalf("elicitation data %s: %v", we.Data, err)
	}
	if u.Refused() != 0 || len(u.Seen()) != 0 {
		t.Errorf("the upstream was called without a credential (%d requests)", len(u.Seen()))
	}
	// A second call before signing in: the same link.
	_, err = connect(t, u, b, alice)
	var again *credential.AuthorizationRequiredError
	if !errors.As(err, &again) || again.ElicitationID != need.ElicitationID {
		t.Fatalf("second call: %v", err)
	}

	status, body := signIn(t, need.URL, userAlice.Email, userAlice.Password)
	if status != http.StatusOK || !strings.Contains(body, "Signed in to remote as alice@example.com") {
		t.Fatalf("callback page: %d %s", status, body)
	}
	if len(completed) != 1 || completed[0] != alice.Name+" "+need.ElicitationID {
		t.Errorf("completion: %v", completed)
	}
	// The retried call succeeds as that person.
	cs, err := connect(t, u, b, alice)
	if err != nil {
		t.Fatalf("retried call: %v", err)
	}
	if w, err := whoami(t, cs); err != nil || w.Identity != userAlice.Subject {
		t.Fatalf("alice reached the upstream as %q (%v)", w.Identity, err)
	}
	// The sign-in link is used up.
	resp, err := http.Get(need.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("a used sign-in link answered %s", resp.Status)
	}

	// Bob has no grant: alice's does not serve him.
	_, err = connect(t, u, b, credential.Identity{Name: "bob@example.com"})
	if !errors.As(err, &need) || need.Identity != "bob@example.com" {
		t.Fatalf("bob without a grant: %v", err)
	}

	// Alice's access token revoked upstream: a new one from her refresh
	// token, at once, and the call goes on as her.
	u.Revoke(userAlice.Subject)
	if w, err := whoami(t, cs); err != nil || w.Identity != userAlice.Subject {
		t.Fatalf("after revocation: %q %v", w.Identity, err)
	}
	if n := as.Issued(oidc.GrantTypeRefreshToken); n != 1 {
		t.Errorf("refresh grants: %d, want 1", n)
	}
	for _, h := range u.Seen() {
		if strings.Contains(h, "gw-secret") {
			t.Fatal("the client secret reached the upstream")
		}
	}
}

func TestAuthorizationCodeCallbackRefusesAForeignState(t *testing.T) {
	as := oauthtest.Start(t, oauthtest.Options{})
	src := &credential.AuthorizationCode{Client: &credential.OAuthClient{Upstream: "remote", Issuer: as.Issuer, ClientID: "x"}, LoginURL: "http://127.0.0.1:1/l"}
	srv := httptest.NewServer(src.Handler())
	defer srv.Close()
	for _, path := range []string{"/callback?state=forged&code=abc", "/callback?code=abc", "/start?id=unknown"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode < 400 {
			t.Errorf("%s: %s", path, resp.Status)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := src.Mint(ctx, credential.Request{Identity: credential.Identity{Name: "a"}, Upstream: "remote"})
	var need *credential.AuthorizationRequiredError
	if !errors.As(err, &need) {
		t.Fatal(err)
	}
}
