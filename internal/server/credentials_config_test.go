package server

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/confidential-mcp/cmcp/internal/config"
	"github.com/confidential-mcp/cmcp/internal/credential"
)

// TestFromConfig: each configured source becomes its broker; a secret
// that is not where the configuration says is a clear error without it.
func TestCredentialBrokerFromConfig(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "secret.txt"), []byte("file-secret\n"), 0o600)
	c, err := config.LoadBytes(filepath.Join(dir, "c.yaml"), []byte(`version: 1
upstreams:
  - name: ex
    http:
      url: https://ex.example/mcp
      credential: {source: exec, exec: {command: sh, args: [-c, "echo"]}}
  - name: cc
    lifecycle: shared
    http:
      url: https://cc.example/mcp
      credential: {source: client_credentials, oauth: {client_id: gw, issuer: https://as.example, client_secret_file: `+filepath.Join(dir, "secret.txt")+`}}
  - name: te
    http:
      url: https://te.example/mcp
      credential: {source: token_exchange, audience: https://te.example, oauth: {client_id: gw, token_endpoint: https://as.example/token, client_secret_env: TE_SECRET}}
  - name: ac
    http:
      url: https://ac.example/mcp
      credential: {source: authorization_code, oauth: {client_id: gw, login_url: https://gw.example/oauth/ac}}
`))
	if err != nil {
		t.Fatal(err)
	}
	env := credentialEnv{LookupEnv: func(k string) (string, bool) {
		return map[string]string{"TE_SECRET": "env-secret"}[k], k == "TE_SECRET"
	}}
	want := map[string]string{"ex": "exec", "cc": "client_credentials", "te": "token_exchange", "ac": "authorization_code"}
	for _, u := range c.Upstreams {
		b, err := credentialBroker(u.Name, u.HTTP.URL, u.HTTP.Credential, env)
		if err != nil {
			t.Fatalf("%s: %v", u.Name, err)
		}
		if b.Source() != want[u.Name] {
			t.Errorf("%s: source %s", u.Name, b.Source())
		}
		if e, ok := b.SourceImpl().(*credential.Exec); ok && !filepath.IsAbs(e.Command) {
			t.Errorf("exec command %q not resolved on PATH", e.Command)
		}
	}
	_, err = credentialBroker("te", "https://te.example/mcp", c.Upstreams[2].HTTP.Credential, credentialEnv{LookupEnv: func(string) (string, bool) { return "", false }})
	if err == nil || !strings.Contains(err.Error(), `upstream "te": credential.oauth.client_secret_env: environment variable TE_SECRET is not set`) {
		t.Fatalf("missing secret: %v", err)
	}
}
