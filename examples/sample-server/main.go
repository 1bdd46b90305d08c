// Command sample-server is a small stdio MCP server shipped with cmcp for the
// README, the example configuration and the tests: build it, pin it with
// `cmcp spawn-digest`, and let the gateway spawn it.
//
//	go build -o bin/sample-server ./examples/sample-server
//	cmcp spawn-digest -- bin/sample-server --root /srv/data
//
// Tools: echo (returns its text), add (adds two integers), read_file and
// list_dir (read-only access below --root, default the working directory).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log"
	"os"
	"path/filepath"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func main() {
	root := flag.String("root", ".", "directory that read_file and list_dir may read")
	flag.Parse()
	abs, err := filepath.Abs(*root)
	if err != nil {
		log.Fatalf("sample-server: --root: %v", err)
	}
	s := newServer(abs)
	if err := s.Run(context.Background(), &mcp.StdioTransport{}); err != nil && !errors.Is(err, context.Canceled) {
		log.Fatalf("sample-server: %v", err)
	}
}

type echoIn struct {
	Text string `json:"text" jsonschema:"the text to return"`
}

type addIn struct {
	A int64 `json:"a" jsonschema:"first addend"`
	B int64 `json:"b" jsonschema:"second addend"`
}

type addOut struct {
	Sum int64 `json:"sum"`
}

type pathIn struct {
	Path string `json:"path" jsonschema:"a path relative to the server's root"`
}

func text(format string, args ...any) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf(format, args...)}}}
}

func newServer(root string) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "cmcp-sample-server", Version: "1.0.0"}, nil)
	readOnly := &mcp.ToolAnnotations{ReadOnlyHint: true}
	mcp.AddTool(s, &mcp.Tool{Name: "echo", Description: "Return the text unchanged.", Annotations: readOnly},
		func(_ context.Context, _ *mcp.CallToolRequest, in echoIn) (*mcp.CallToolResult, any, error) {
			return text("%s", in.Text), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "add", Description: "Add two integers.", Annotations: readOnly},
		func(_ context.Context, _ *mcp.CallToolRequest, in addIn) (*mcp.CallToolResult, addOut, error) {
			return nil, addOut{Sum: in.A + in.B}, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "read_file", Description: "Read a text file below the server's root.", Annotations: readOnly},
		func(_ context.Context, _ *mcp.CallToolRequest, in pathIn) (*mcp.CallToolResult, any, error) {
			p, err := inside(root, in.Path)
			if err != nil {
				return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: err.Error()}}}, nil, nil
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: err.Error()}}}, nil, nil
			}
			return text("%s", b), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "list_dir", Description: "List a directory below the server's root.", Annotations: readOnly},
		func(_ context.Context, _ *mcp.CallToolRequest, in pathIn) (*mcp.CallToolResult, any, error) {
			p, err := inside(root, in.Path)
			if err != nil {
				return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: err.Error()}}}, nil, nil
			}
			des, err := os.ReadDir(p)
			if err != nil {
				return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: err.Error()}}}, nil, nil
			}
			var b strings.Builder
			for _, de := range des {
				name := de.Name()
				if de.IsDir() {
					name += "/"
				}
				b.WriteString(name + "\n")
			}
			return text("%s", b.String()), nil, nil
		})
	return s
}

// inside resolves p below root and refuses paths that leave it.
func inside(root, p string) (string, error) {
	if p == "" {
		p = "."
	}
	if filepath.IsAbs(p) {
		return "", fmt.Errorf("%s: give a path relative to the root", p)
	}
	full := filepath.Join(root, p)
	real, err := filepath.EvalSymlinks(full)
	if err != nil {
		return "", err
	}
	if rel, err := filepath.Rel(root, real); err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", &fs.PathError{Op: "open", Path: p, Err: fs.ErrPermission}
	}
	return real, nil
}
