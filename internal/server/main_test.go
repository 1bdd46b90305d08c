package server

import (
	"os"
	"testing"

	"github.com/confidential-mcp/cmcp/internal/gwtest"
)

// The test binary doubles as the upstream MCP server (gwtest.RunChild;
// built once more without -race for that, gwtest.BuildChild) and, for the
// crash tests, as a gateway process (runGatewayProcess), which keeps the
// race detector.
func TestMain(m *testing.M) {
	if mode := os.Getenv(gwtest.ChildEnv); mode != "" {
		gwtest.RunChild(mode)
		return
	}
	if cfg := os.Getenv(gatewayEnv); cfg != "" {
		runGatewayProcess(cfg)
		return
	}
	cleanup := gwtest.BuildChild()
	code := m.Run()
	cleanup()
	os.Exit(code)
}
