package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/confidential-mcp/cmcp/internal/exitcode"
)

// TestCheckListeners: after --listen, the MCP endpoint without tokens or
// mutual TLS must resolve to a loopback address, and the admin listener
// may not take the MCP endpoint's address (compared as resolved: localhost
// is 127.0.0.1, a wildcard address takes the port everywhere). Errors name
// the setting's line, or --listen. Load alone cannot see these: --listen
// comes later, and a configuration for `serve --stdio` may name any address.
func TestCheckListeners(t *testing.T) {
	const tok = "sha256:abababababababababababababababababababababababababababababababab"
	const admin = "admin:\n  listen: 127.0.0.1:9090\n  token_sha256: " + tok + "\n"
	for _, tc := range []struct {
		name, yaml, flag string
		stdio            bool
		want, hint       string // want "": no error
		warn             string
	}{
		{"loopback", "server:\n  listen: 127.0.0.1:9000\n" + admin, "", false, "", "", ""},
		{"localhost", "server:\n  listen: localhost:9000\n", "", false, "", "", ""},
		{"--listen is the admin address", "server:\n  listen: 127.0.0.1:9000\n" + admin, "127.0.0.1:9090", false,
			"cmcp.yaml:5:11: admin.listen: 127.0.0.1:9090 is also the MCP endpoint's address (--listen 127.0.0.1:9090)", "its own port", ""},
		{"--listen localhost is the admin address", admin, "localhost:9090", false,
			"cmcp.yaml:3:11: admin.listen: 127.0.0.1:9090 is also the MCP endpoint's address (--listen localhost:9090)", "its own port", ""},
		{"--listen wildcard takes the admin port", "server:\n  tokens: [{identity: a, sha256: " + tok + "}]\nadmin:\n  listen: localhost:9090\n  token_sha256: sha256:" + strings.Repeat("cd", 32) + "\n",
			"0.0.0.0:9090", false, "cmcp.yaml:5:11: admin.listen: localhost:9090 (127.0.0.1:9090) is also the MCP endpoint's address (--listen 0.0.0.0:9090)", "", ""},
		{"--listen elsewhere", admin, "127.0.0.1:9091", false, "", "", ""},
		{"stdio has no MCP listener", "server:\n  listen: 0.0.0.0:9091\n" + admin, "", true, "", "", ""},
		{"server.listen off loopback without tokens", "server:\n  listen: 0.0.0.0:18080\n", "", false,
			"cmcp.yaml:3:11: server.listen: refusing to listen on 0.0.0.0:18080 without authentication", "server.tokens", ""},
		{"empty host without tokens", "server:\n  listen: ':18080'\n", "", false,
			"cmcp.yaml:3:11: server.listen: refusing to listen on :18080 without authentication", "", ""},
		{"--listen off loopback without tokens", "", "10.0.0.1:9", false,
			"cmcp.yaml: --listen: refusing to listen on 10.0.0.1:9 without authentication", "", ""},
		{"--listen malformed", "", "9090", false, "cmcp.yaml: --listen: address 9090: missing port in address", "", ""},
		{"tokens without TLS off loopback", "server:\n  listen: 0.0.0.0:18080\n  tokens: [{identity: a, sha256: " + tok + "}]\n", "", false,
			"", "", "server.listen 0.0.0.0:18080 is not a loopback address and server.tls is not set: agents' bearer tokens cross the network in cleartext"},
		{"admin off loopback", "admin:\n  listen: 0.0.0.0:9090\n  token_sha256: " + tok + "\n", "", false,
			"", "", "admin.listen 0.0.0.0:9090 is not a loopback address and the admin listener has no TLS: the admin token crosses the network in cleartext"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "cmcp.yaml")
			if err := os.WriteFile(path, []byte("version: 1\n"+tc.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			c, err := Load(path)
			if err != nil {
				t.Fatal(err)
			}
			lc, err := c.CheckListeners(tc.flag, tc.stdio)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if got := strings.Join(lc.Warnings, "\n"); (tc.warn == "") != (got == "") || !strings.Contains(got, tc.warn) {
					t.Errorf("warnings %q, want %q", got, tc.warn)
				}
				if (lc.MCP == nil) != tc.stdio {
					t.Errorf("MCP address %v with stdio %v", lc.MCP, tc.stdio)
				}
				return
			}
			if err == nil || !strings.HasPrefix(err.Error(), filepath.Dir(path)+"/") || !strings.Contains(err.Error(), tc.want) || exitcode.CodeOf(err) != exitcode.ExitConfig {
				t.Fatalf("err = %v (exit %d), want %q", err, exitcode.CodeOf(err), tc.want)
			}
			if tc.hint != "" && !strings.Contains(strings.Join(exitcode.HintsOf(err), "\n"), tc.hint) {
				t.Errorf("hints %q, want %q", exitcode.HintsOf(err), tc.hint)
			}
		})
	}
}
