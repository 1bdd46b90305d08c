package server

import (
	"os"
	"testing"

	"github.com/confidential-mcp/cmcp/internal/gwtest"
)

// The test upstream is the program internal/gwtest/child, built without
// -race (gwtest.BuildChild; the test binary itself, in gwtest.RunChild,
// if it cannot be built). The test binary doubles, for the crash tests,
// as a gateway process (runGatewayProcess), which keeps the race detector.
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
