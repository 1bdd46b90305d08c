// Command child is the test upstream of the gateway's and the server
// assembly's tests (gwtest.RunChild, in the mode CMCP_TEST_CHILD names),
// as a program of its own: gwtest.BuildChild builds it without the race
// detector for the tests to spawn. It is a third of the size of a test
// package built without -race, and the gateway digests the binary it runs
// before every spawn.
package main

import (
	"fmt"
	"os"

	"github.com/confidential-mcp/cmcp/internal/gwtest"
)

func main() {
	mode := os.Getenv(gwtest.ChildEnv)
	if mode == "" {
		fmt.Fprintf(os.Stderr, "child: the test upstream of cmcp's tests: set %s to its mode\n", gwtest.ChildEnv)
		os.Exit(2)
	}
	gwtest.RunChild(mode)
}
