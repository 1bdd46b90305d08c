// Command echoserver is the benchmark's upstream for BenchmarkTable: a
// go-sdk MCP server with one tool, echo, that answers its text argument as
// text content. It serves stdio, or Streamable HTTP (stateful) with -http.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

type echoArgs struct {
	Text string `json:"text" jsonschema:"the text to answer"`
}

func main() {
	addr := flag.String("http", "", "serve Streamable HTTP on this address (default: stdio)")
	flag.Parse()
	server := mcp.NewServer(&mcp.Implementation{Name: "cmcp-bench-echo", Version: "1"}, nil)
	mcp.AddTool(server, &mcp.Tool{Name: "echo", Description: "answers its text"},
		func(_ context.Context, _ *mcp.CallToolRequest, a echoArgs) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: a.Text}}}, nil, nil
		})
	if *addr == "" {
		if err := server.Run(context.Background(), &mcp.StdioTransport{}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	// Every path: the do-nothing proxy forwards to <url>/mcp.
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil)
	if err := http.ListenAndServe(*addr, h); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
