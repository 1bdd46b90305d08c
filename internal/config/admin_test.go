package config

import (
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
