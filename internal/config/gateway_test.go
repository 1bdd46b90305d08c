package config

import (
	"strings"
	"testing"
	"time"

	"github.com/confidential-mcp/cmcp/pkg/digest"
)

const gwBase = "version: 1\nupstreams:\n  - name: files\n    stdio: {command: /bin/true}\n    allow_unmeasured: true\n"

func TestGatewaySections(t *testing.T) {
	pin := digest.Bytes([]byte("t")).String()
	c, err := LoadBytes("c.yaml", []byte(gwBase+`server:
  listen: 127.0.0.1:9000
  tokens: [{identity: alice, sha256: `+pin+`}]
  session_timeout: 2m
  tee: software
audit: {dir: audit, durability: interval}
catalog:
  drift: warn
  upstreams:
    files: {drift: refuse, tools: {echo: `+pin+`}}
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Server.ListenOrDefault() != "127.0.0.1:9000" || c.Server.SessionTimeout != 2*time.Minute || c.Server.Tokens[0].Identity != "alice" {
		t.Fatalf("server: %+v", c.Server)
	}
	if c.DriftWarn("files") || !c.DriftWarn("other") {
		t.Fatal("drift: the per-upstream setting must win over the default")
	}
	if p := c.ToolPins("files"); p["echo"].String() != pin || c.ToolPins("other") != nil {
		t.Fatalf("pins %v", p)
	}
	if (*Server)(nil).ListenOrDefault() != DefaultListen {
		t.Fatal("default listen")
	}
}

func TestGatewaySectionErrors(t *testing.T) {
	pin := digest.Bytes([]byte("t")).String()
	for _, tc := range []struct{ name, yaml, want string }{
		{"listen", "server: {listen: nope}", `server.listen "nope"`},
		{"token without digest", "server: {tokens: [{identity: a}]}", "sha256 is required"},
		{"token twice", "server: {tokens: [{identity: a, sha256: " + pin + "}, {identity: b, sha256: " + pin + "}]}", "listed twice"},
		{"bad digest", "server: {tokens: [{identity: a, sha256: abc}]}", "malformed digest"},
		{"tls half", "server: {tls: {cert: a.crt}}", "cert and key are both required"},
		{"tee", "server: {tee: sgx}", `server.tee "sgx"`},
		{"audit dir", "audit: {durability: group}", "audit.dir is required"},
		{"durability", "audit: {dir: a, durability: sometimes}", `audit.durability "sometimes"`},
		{"vault", "audit: {dir: a, vault: true}", "needs audit.recipients"},
		{"drift", "catalog: {drift: maybe}", `catalog.drift "maybe"`},
		{"unknown key", "server: {listne: x}", `unknown key "listne"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadBytes("c.yaml", []byte(gwBase+tc.yaml+"\n"))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
			if !strings.Contains(err.Error(), "c.yaml:") {
				t.Fatalf("error does not name the file and line: %v", err)
			}
		})
	}
}
