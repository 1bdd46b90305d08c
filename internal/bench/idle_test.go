package bench

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// BenchmarkFreshChildFirstCall measures the floor under a warm spare's
// first call: a go-sdk echo server started over stdio and handshaken with
// (as a spare is), left idle for a gap (as a spare waits for its session),
// then called twice with the same gap before each call. No gateway is in
// the path. With gap 0 the child answers right after its handshake, as in
// the table's "stdio direct" row; with a gap it has gone idle, as a spare
// has by the time a session takes it. Rounds interleave the gaps.
//
//	go test -run '^$' -bench FreshChildFirstCall -benchtime 1x ./internal/bench
func BenchmarkFreshChildFirstCall(b *testing.B) {
	echo := buildGo(b, "echoserver", "github.com/confidential-mcp/cmcp/internal/bench/echoserver")
	ctx := context.Background()
	connect := StdioConnector(echo)
	gaps := []time.Duration{0, 50 * time.Millisecond, 300 * time.Millisecond}
	firsts := make([][]time.Duration, len(gaps))
	seconds := make([][]time.Duration, len(gaps))
	call := func(s *mcp.ClientSession, gap time.Duration) time.Duration {
		time.Sleep(gap)
		t := time.Now()
		if _, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "x"}}); err != nil {
			b.Fatal(err)
		}
		return time.Since(t)
	}
	for range 3 {
		for i, gap := range gaps {
			for range 10 {
				s, err := connect(ctx)
				if err != nil {
					b.Fatal(err)
				}
				firsts[i] = append(firsts[i], call(s, gap))
				seconds[i] = append(seconds[i], call(s, gap))
				s.Close()
			}
		}
	}
	for i, gap := range gaps {
		slices.Sort(firsts[i])
		slices.Sort(seconds[i])
		fmt.Printf("fresh stdio child, idle %v before each call: first call p50 %v, second call p50 %v (%d children)\n",
			gap, firsts[i][len(firsts[i])/2], seconds[i][len(seconds[i])/2], len(firsts[i]))
	}
}
