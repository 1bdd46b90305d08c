package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestAdminSection(t *testing.T) {
	tok := "sha256:" + strings.Repeat("ab", 32)
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"ok", "admin:\n  listen: 127.0.0.1:9090\n  token_sha256: " + tok + "\n", ""},
		{"no token", "admin:\n  listen: 127.0.0.1:9090\n", "admin.token_sha256 is required"},
		{"no listen", "admin:\n  token_sha256: " + tok + "\n", "admin.listen is required"},
		{"bad listen", "admin:\n  listen: 9090\n  token_sha256: " + tok + "\n", "want host:port"},
		{"bad digest", "admin:\n  listen: 127.0.0.1:9090\n  token_sha256: hunter2\n", "token_sha256"},
		{"unknown key", "admin:\n  listen: 127.0.0.1:9090\n  token: hunter2\n  token_sha256: " + tok + "\n", "token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "cmcp.yaml")
			y := "version: 1\nupstreams:\n  - name: u\n    http:\n      url: http://127.0.0.1:1/mcp\n" + tc.yaml
			if err := os.WriteFile(path, []byte(y), 0o600); err != nil {
				t.Fatal(err)
			}
			c, err := Load(path)
			if tc.want == "" {
				if err != nil || c.Admin == nil || c.Admin.Listen != "127.0.0.1:9090" || c.Admin.TokenSHA256.String() != tok {
					t.Fatalf("Load: %+v, %v", c, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "cmcp.yaml:") {
				t.Fatalf("err = %v, want file:line and %q", err, tc.want)
			}
		})
	}
}

// TestAdminApartFromAgents: the admin token may not be an agent's bearer
// token (that agent could reach the admin listener), and the admin listener
// may not share the agents' address.
func TestAdminApartFromAgents(t *testing.T) {
	tok := "sha256:" + strings.Repeat("ab", 32)
	other := "sha256:" + strings.Repeat("cd", 32)
	for _, tc := range []struct {
		name, yaml, want string
		line             int
	}{
		{"own token", "server:\n  tokens: [{identity: alice, sha256: " + other + "}]\nadmin:\n  listen: 127.0.0.1:9090\n  token_sha256: " + tok + "\n", "", 0},
		{"agent token", "server:\n  tokens: [{identity: bob, sha256: " + other + "}, {identity: alice, sha256: " + tok + "}]\nadmin:\n  listen: 127.0.0.1:9090\n  token_sha256: " + tok + "\n",
			`admin.token_sha256: is the digest of server.tokens[1] (agent "alice"): that agent could reach the admin listener`, 10},
		{"same address", "server:\n  listen: 127.0.0.1:9090\nadmin:\n  listen: 127.0.0.1:9090\n  token_sha256: " + tok + "\n",
			"admin.listen: 127.0.0.1:9090 is also server.listen", 9},
		{"default address", "admin:\n  listen: 127.0.0.1:8080\n  token_sha256: " + tok + "\n", "127.0.0.1:8080 is also server.listen (127.0.0.1:8080, the default)", 7},
		// Addresses, not strings: localhost is 127.0.0.1, and a wildcard
		// address takes the port on every address.
		{"localhost", "server:\n  listen: 127.0.0.1:9090\nadmin:\n  listen: LocalHost:9090\n  token_sha256: " + tok + "\n",
			"admin.listen: LocalHost:9090 is also server.listen (127.0.0.1:9090)", 9},
		{"wildcard", "server:\n  listen: 0.0.0.0:9090\n  tokens: [{identity: a, sha256: " + other + "}]\nadmin:\n  listen: 127.0.0.1:9090\n  token_sha256: " + tok + "\n",
			"admin.listen: 127.0.0.1:9090 is also server.listen (0.0.0.0:9090)", 10},
		{"empty host", "server:\n  listen: 127.0.0.1:9090\nadmin:\n  listen: ':9090'\n  token_sha256: " + tok + "\n", "admin.listen: :9090 is also server.listen", 9},
		{"IPv6 wildcard", "admin:\n  listen: '[::]:8080'\n  token_sha256: " + tok + "\n", "admin.listen: [::]:8080 is also server.listen", 7},
		{"another loopback address", "server:\n  listen: 127.0.0.1:9090\nadmin:\n  listen: 127.0.0.2:9090\n  token_sha256: " + tok + "\n", "", 0},
		{"IPv6 loopback", "admin:\n  listen: '[::1]:8080'\n  token_sha256: " + tok + "\n", "", 0},
		{"port 0", "server:\n  listen: 127.0.0.1:0\nadmin:\n  listen: 127.0.0.1:0\n  token_sha256: " + tok + "\n", "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "cmcp.yaml")
			y := "version: 1\nupstreams:\n  - name: u\n    http:\n      url: http://127.0.0.1:1/mcp\n" + tc.yaml
			if err := os.WriteFile(path, []byte(y), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := Load(path)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), fmt.Sprintf("cmcp.yaml:%d:", tc.line)) {
				t.Fatalf("err = %v, want cmcp.yaml:%d: and %q", err, tc.line, tc.want)
			}
		})
	}
}
