package upstream

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/credential"
	"github.com/confidential-mcp/cmcp/internal/credential/credtest"
)

// TestHTTPUpstreamCallsAsEachIdentity: an HTTP upstream with a credential
// source connects each identity with its own minted credential, for the
// session's own requests (initialize, lists) and for raw tool calls, and
// never connects without an identity.
func TestHTTPUpstreamCallsAsEachIdentity(t *testing.T) {
	u := credtest.Start(t)
	b := credential.NewBroker("remote", &credential.Exec{Command: u.Helper(t, 0), Env: map[string]string{"CREDTEST_MINT_URL": u.MintURL}},
		credential.Options{Retry: credential.Retry{Attempts: 3, Initial: time.Millisecond, Max: 10 * time.Millisecond}})
	up, err := NewHTTP(HTTPOptions{Name: "remote", URL: u.URL, Credentials: b})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	call := func(name string) string {
		t.Helper()
		conn, err := up.Connect(ctx, mcp.NewClient(&mcp.Implementation{Name: "gw", Version: "1"}, nil), ConnectOptions{Identity: &credential.Identity{Name: name}})
		if err != nil {
			t.Fatalf("%s: connect: %v", name, err)
		}
		defer conn.Close()
		res, err := conn.RawCall(ctx, "tools/call", json.RawMessage(`{"name":"whoami","arguments":{}}`))
		if err != nil {
			t.Fatalf("%s: call: %v", name, err)
		}
		var r struct {
			StructuredContent credtest.WhoAmI `json:"structuredContent"`
		}
		if err := json.Unmarshal(res, &r); err != nil {
			t.Fatal(err)
		}
		return r.StructuredContent.Identity
	}
	for _, name := range []string{"alice", "bob", "alice"} {
		if got := call(name); got != name {
			t.Errorf("%s's call reached the upstream as %q", name, got)
		}
	}
	if u.Mints("alice") != 1 || u.Mints("bob") != 1 {
		t.Errorf("mints alice %d bob %d, want 1 each", u.Mints("alice"), u.Mints("bob"))
	}
	_, err = up.Connect(ctx, mcp.NewClient(&mcp.Implementation{Name: "gw", Version: "1"}, nil), ConnectOptions{})
	if err == nil || !strings.Contains(err.Error(), `upstream "remote": its exec credential is minted per identity, and this connection serves none`) {
		t.Fatalf("connect without an identity: %v", err)
	}
	if _, err := NewHTTP(HTTPOptions{Name: "remote", URL: u.URL, Credentials: b, BearerTokenEnv: "T", LookupEnv: func(string) (string, bool) { return "x", true }}); err == nil ||
		!strings.Contains(err.Error(), "a credential source and a static Authorization") {
		t.Fatalf("credential source with a static token: %v", err)
	}
}
