// Command cmcp is the confidential MCP gateway and its toolkit.
package main

import (
	"os"

	"github.com/confidential-mcp/cmcp/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
