package config

import (
	"fmt"
	"net"

	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// Admin is the `admin:` section: the operators' listener, separate from the
// agents' MCP endpoint and with its own credential. Without this section
// there is no admin listener.
//
//	admin:
//	  listen: 127.0.0.1:9090      # host:port; never the MCP endpoint's
//	  token_sha256: sha256:...    # printf %s "$ADMIN_TOKEN" | sha256sum
//
// /healthz and /readyz answer without the token; /metrics,
// /admin/kill-switch (GET, POST .../engage, POST .../clear) and
// /admin/checkpoint (POST) need "Authorization: Bearer $ADMIN_TOKEN".
type Admin struct {
	Listen      string        `yaml:"listen" json:"listen"`
	TokenSHA256 digest.Digest `yaml:"token_sha256" json:"token_sha256"`
}

// Validate checks the admin section.
func (a *Admin) Validate() error {
	if a.Listen == "" {
		return fmt.Errorf("admin.listen is required: the host:port of the admin listener, e.g. 127.0.0.1:9090")
	}
	if _, _, err := net.SplitHostPort(a.Listen); err != nil {
		return valueAt("listen").errorf("admin.listen %q: want host:port, e.g. 127.0.0.1:9090", a.Listen)
	}
	if a.TokenSHA256.IsZero() {
		return fmt.Errorf("admin.token_sha256 is required: the admin listener never runs without its own token " +
			"(generate one: ADMIN_TOKEN=$(head -c 32 /dev/urandom | base64); printf %%s \"$ADMIN_TOKEN\" | sha256sum)")
	}
	return nil
}
