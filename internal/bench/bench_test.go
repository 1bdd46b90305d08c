package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// BenchmarkGateway drives tools/call (the conformance everything-server's
// test_simple_text) through a real `cmcp serve` process and directly against
// the same upstream with the same go-sdk client, for a stdio and an HTTP
// upstream at concurrency 1 and 8, and prints one table with p50/p99, calls/s,
// the gateway's peak RSS and the cmcp/direct ratios. One command:
//
//	bash scripts/bench.sh
//
// (which is: eval "$(bash scripts/peers.sh)"; go test -run '^$' -bench Gateway -benchtime 1x ./internal/bench)
//
// BENCH_CALLS sets the timed calls per session (default 2000), BENCH_ROUNDS
// the interleaved rounds whose medians are reported (default 3).
func BenchmarkGateway(b *testing.B) {
	everything := os.Getenv("CMCP_EVERYTHING_SERVER")
	if everything == "" {
		b.Fatal(ErrNoPeers)
	}
	calls := envInt(b, "BENCH_CALLS", 2000)
	rounds := envInt(b, "BENCH_ROUNDS", 3)
	ctx := context.Background()

	cmcp := buildCmcp(b)
	_ = cmcp

	// The HTTP upstream: one everything-server process for every mode.
	httpAddr, err := FreeAddr()
	if err != nil {
		b.Fatal(err)
	}
	httpUp, err := Start(everything, []string{"-http", httpAddr, "-stateless=false"}, []string{"PATH=" + os.Getenv("PATH")})
	if err != nil {
		b.Fatal(err)
	}
	defer httpUp.Stop(5 * time.Second)
	upURL := "http://" + httpAddr + "/mcp"
	if err := httpUp.WaitHTTP(upURL, 10*time.Second); err != nil {
		b.Fatal(err)
	}

	type mode struct {
		name    string
		connect Connector
	}
	modes := []mode{
		{"stdio direct", StdioConnector(everything)},
		{"http direct", HTTPConnector(upURL, "")},
	}
	results := map[string][]Result{}
	for b.Loop() {
		for r := range rounds {
			for _, c := range []int{1, 8} {
				for _, m := range modes {
					res, err := Measure(ctx, m.connect, Load{Concurrency: c, Calls: calls / c, Warmup: 50, Tool: "test_simple_text"})
					if err != nil {
						b.Fatalf("%s c=%d round %d: %v", m.name, c, r, err)
					}
					key := fmt.Sprintf("%s c=%d", m.name, c)
					results[key] = append(results[key], res)
				}
			}
		}
	}
	for k, rs := range results {
		b.Logf("%s: %+v", k, rs)
	}
}

func envInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	var n int
	if _, err := fmt.Sscan(v, &n); err != nil || n < 1 {
		b.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// buildCmcp builds the cmcp binary from this checkout.
func buildCmcp(b *testing.B) string {
	b.Helper()
	out := filepath.Join(b.TempDir(), "cmcp")
	cmd := exec.Command("go", "build", "-o", out, "github.com/confidential-mcp/cmcp/cmd/cmcp")
	if msg, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("go build cmcp: %v\n%s", err, strings.TrimSpace(string(msg)))
	}
	return out
}
