package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/zitadel/oidc/v3/pkg/oidc"

	"github.com/confidential-mcp/cmcp/internal/credential/credtest"
	"github.com/confidential-mcp/cmcp/internal/front/httpfront"
	"github.com/confidential-mcp/cmcp/internal/gwtest"
	"github.com/confidential-mcp/cmcp/internal/oauthtest"
)

// whoamiVia is credtest.WhoAmIVia.
func whoamiVia(t *testing.T, cs *mcp.ClientSession) (credtest.WhoAmI, error) {
	t.Helper()
	return credtest.WhoAmIVia(t, cs)
}

// TestServeMintsAnUpstreamCredentialPerAgent: serve with an HTTP upstream
// whose credential is minted per identity (an exec helper): each agent's
// calls reach the upstream as that agent, never with the agent's own
// token, and a credential_minted record says who got one, with its
// fingerprint and never the credential.
func TestServeMintsAnUpstreamCredentialPerAgent(t *testing.T) {
	u := credtest.Start(t)
	dir := t.TempDir()
	cfg := fmt.Sprintf(`version: 1
server:
  listen: 127.0.0.1:0
  tee: software
  tokens:
    - {identity: alice, sha256: %q}
    - {identity: bob, sha256: %q}
audit:
  dir: audit
upstreams:
  - name: remote
    http:
      url: %s
      credential:
        source: exec
        exec:
          command: %s
          env: {CREDTEST_MINT_URL: %q}
`, httpfront.TokenDigest("alice-agent-token").String(), httpfront.TokenDigest("bob-agent-token").String(), u.URL, u.Helper(t, 0), u.MintURL)
	endpoint, auditDir := serveYAML(t, dir, cfg, os.Environ())
	for _, a := range []struct{ name, token string }{{"alice", "alice-agent-token"}, {"bob", "bob-agent-token"}, {"alice", "alice-agent-token"}} {
		cs, err := connectWith(endpoint, a.token)
		if err != nil {
			t.Fatal(err)
		}
		w, err := whoamiVia(t, cs)
		cs.Close()
		if err != nil || w.Identity != a.name {
			t.Fatalf("%s's call reached the upstream as %q (%v)", a.name, w.Identity, err)
		}
	}
	if u.Mints("alice") != 1 || u.Mints("bob") != 1 {
		t.Errorf("mints alice %d bob %d, want one each", u.Mints("alice"), u.Mints("bob"))
	}
	seen := u.Seen()
	for _, h := range seen {
		if strings.Contains(h, "agent-token") {
			t.Fatalf("an agent's own token reached the upstream: %q", h)
		}
	}
	var minted []rec
	eventually(t, 10*time.Second, func() string {
		minted = kinds(readRecords(t, auditDir), "credential_minted")
		if len(minted) != 2 {
			return fmt.Sprintf("%d credential_minted records", len(minted))
		}
		return ""
	})
	for i, who := range []string{"alice", "bob"} {
		b := minted[i].Body
		if b["identity"] != who || b["upstream"] != "remote" || b["source"] != "exec" || b["reason"] != "first" ||
			!strings.HasPrefix(fmt.Sprint(b["fingerprint"]), "hmac-sha256:") || b["expires"] == nil {
			t.Errorf("record %d: %v", i, b)
		}
	}
	// No record holds a credential the upstream saw.
	raw := fmt.Sprint(readRecords(t, auditDir))
	for _, h := range seen {
		if tok := strings.TrimPrefix(h, "Bearer "); tok != "" && strings.Contains(raw, tok) {
			t.Fatalf("the audit log holds a credential")
		}
	}
}

// TestServeAuthorizationCodeElicitsSignInThenCallsAsThatPerson: the issue's
// scenario end to end through cmcp serve. An agent whose person has not
// authorized the gateway at the upstream's authorization server gets the
// MCP URL elicitation (-32042) for its call; the person opens the link and
// signs in (the test drives the real zitadel OP as a browser); the
// retried call reaches the upstream as that person.
func TestServeAuthorizationCodeElicitsSignInThenCallsAsThatPerson(t *testing.T) {
	u := credtest.Start(t)
	addr := freePort(t)
	loginURL := "http://" + addr + "/oauth/upstream/remote"
	alice := oauthtest.User{Subject: "u-alice", Email: "alice@example.com", EmailVerified: true, Password: "alice-pw"}
	as := oauthtest.Start(t, oauthtest.Options{Users: []oauthtest.User{alice},
		Clients: []oauthtest.Client{{ID: "cmcp", Secret: "cmcp-secret", RedirectURIs: []string{loginURL + "/callback"}}}})
	u.Advertise(as.Issuer)
	u.Trust(as.SubjectOf(u.URL))
	cfg := fmt.Sprintf(`version: 1
server:
  listen: %s
  tee: software
  tokens: [{identity: alice@example.com, sha256: %q}]
audit:
  dir: audit
upstreams:
  - name: remote
    http:
      url: %s
      credential:
        source: authorization_code
        oauth:
          client_id: cmcp
          client_secret_env: REMOTE_CLIENT_SECRET
          scopes: [%s]
          login_url: %s
`, addr, httpfront.TokenDigest("alice-agent-token").String(), u.URL, oidc.ScopeOfflineAccess, loginURL)
	endpoint, auditDir := serveYAML(t, t.TempDir(), cfg, append(os.Environ(), "REMOTE_CLIENT_SECRET=cmcp-secret"))

	hc := &http.Client{Transport: gwtest.Bearer{Tok: "alice-agent-token", Base: http.DefaultTransport}}
	completed := make(chan string, 1)
	client := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, &mcp.ClientOptions{
		Capabilities: &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{URL: &mcp.URLElicitationCapabilities{}}},
		ElicitationCompleteHandler: func(_ context.Context, req *mcp.ElicitationCompleteNotificationRequest) {
			completed <- req.Params.ElicitationID
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: hc, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()

	_, err = whoamiVia(t, cs)
	var we *jsonrpc.Error
	if !errors.As(err, &we) || we.Code != mcp.CodeURLElicitationRequired {
		t.Fatalf("first call without a grant: %v, want -32042", err)
	}
	var data struct {
		Elicitations []mcp.ElicitParams `json:"elicitations"`
	}
	if err := json.Unmarshal(we.Data, &data); err != nil || len(data.Elicitations) != 1 || !strings.HasPrefix(data.Elicitations[0].URL, loginURL+"/start?id=") {
		t.Fatalf("elicitation data %s: %v", we.Data, err)
	}

	// The person opens the link in a browser and signs in.
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noFollow.Get(data.Elicitations[0].URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	back, err := (&oauthtest.Browser{}).SignIn(ctx, resp.Header.Get("Location"), alice.Email, alice.Password)
	if err != nil {
		t.Fatal(err)
	}
	resp, err = http.Get(back.String())
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(page), "Signed in to remote as alice@example.com") {
		t.Fatalf("callback: %s %s", resp.Status, page)
	}

	// The agent is told that the elicitation completed.
	select {
	case id := <-completed:
		if id != data.Elicitations[0].ElicitationID {
			t.Errorf("completion for %q, want %q", id, data.Elicitations[0].ElicitationID)
		}
	case <-time.After(30 * time.Second):
		t.Error("no notifications/elicitation/complete")
	}

	// The retried call succeeds as that person.
	w, err := whoamiVia(t, cs)
	if err != nil || w.Identity != alice.Subject {
		t.Fatalf("retried call reached the upstream as %q (%v)", w.Identity, err)
	}
	var minted []rec
	eventually(t, 10*time.Second, func() string {
		minted = kinds(readRecords(t, auditDir), "credential_minted")
		if len(minted) != 1 {
			return fmt.Sprintf("%d credential_minted records", len(minted))
		}
		return ""
	})
	if b := minted[0].Body; b["identity"] != "alice@example.com" || b["source"] != "authorization_code" {
		t.Errorf("record: %v", b)
	}
	refused := kinds(readRecords(t, auditDir), "call")
	if len(refused) < 2 || refused[0].Body["outcome"] != "refused" || !strings.Contains(fmt.Sprint(refused[0].Body["reason"]), "sign in") {
		t.Errorf("the first call's record: %v", refused[0].Body)
	}
}
