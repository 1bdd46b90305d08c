package gateway

import (
	"context"
	"os"
	"os/exec"
	"testing"

	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// BenchmarkCall is one tools/call at concurrency 1 through the gateway
// (in-process Streamable HTTP front end, a real stdio child, the audit log
// in interval and group mode) and, as the baseline in the same run, from the
// same client straight to the same child over stdio. Compare ns/op: the
// ratio is the gateway's overhead (internal/bench has the full benchmark).
func BenchmarkCall(b *testing.B) {
	args := map[string]any{"text": "bench"}
	run := func(b *testing.B, cs *mcp.ClientSession, name string) {
		ctx := context.Background()
		for range 20 {
			if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args}); err != nil {
				b.Fatal(err)
			}
		}
		b.ResetTimer()
		for b.Loop() {
			if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args}); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("direct-stdio", func(b *testing.B) {
		exe, _ := selfDigest(b)
		cmd := exec.Command(exe)
		cmd.Env = append(os.Environ(), childEnv+"=server")
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil).Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer cs.Close()
		run(b, cs, "echo")
	})
	for _, d := range []string{record.DurabilityInterval, record.DurabilityGroup} {
		b.Run("cmcp-stdio-"+d, func(b *testing.B) {
			h := newHarness(b, hconf{durability: d})
			inR, inW, _ := os.Pipe()
			outR, outW, _ := os.Pipe()
			go h.g.ServeStdio(context.Background(), inR, outW, "bench")
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil).Connect(context.Background(), &mcp.IOTransport{Reader: outR, Writer: inW}, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer cs.Close()
			run(b, cs, "t__echo")
		})
		b.Run("cmcp-http-"+d, func(b *testing.B) {
			h := newHarness(b, hconf{durability: d})
			cs, err := h.tryConnect("", nil)
			if err != nil {
				b.Fatal(err)
			}
			defer cs.Close()
			run(b, cs, "t__echo")
		})
	}
}
