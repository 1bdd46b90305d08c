package bench

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 100; i++ {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	if p := percentile(d, 0.50); p != 50*time.Millisecond {
		t.Errorf("p50 = %v", p)
	}
	if p := percentile(d, 0.99); p != 99*time.Millisecond {
		t.Errorf("p99 = %v", p)
	}
	if p := percentile(d[:1], 0.99); p != time.Millisecond {
		t.Errorf("p99 of one = %v", p)
	}
}

func TestPeakRSSOfThisProcess(t *testing.T) {
	rss, err := CurrentRSS(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	hwm, err := PeakRSS(os.Getpid()) // read second: the peak can only have grown
	if err != nil {
		t.Fatal(err)
	}
	if rss <= 0 || hwm < rss {
		t.Fatalf("VmRSS %d, VmHWM %d: want 0 < RSS <= HWM", rss, hwm)
	}
	if _, err := PeakRSS(1 << 30); err == nil {
		t.Fatal("PeakRSS of a process that does not exist succeeded")
	}
}

func TestCPUTimeOfThisProcess(t *testing.T) {
	before, err := CPUTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(50 * time.Millisecond)
	for time.Now().Before(deadline) {
	}
	after, err := CPUTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if after < before || after == 0 {
		t.Fatalf("CPU time went from %v to %v after 50ms of spinning", before, after)
	}
}

// TestRatiosArePaired: a ratio is taken within each round, then the median
// over rounds: a machine that slows down between rounds moves both sides.
func TestRatiosArePaired(t *testing.T) {
	mode := []Result{{P50: 300 * time.Microsecond, CallsPerSec: 900}, {P50: 600 * time.Microsecond, CallsPerSec: 450}, {P50: 330 * time.Microsecond, CallsPerSec: 800}}
	ref := []Result{{P50: 200 * time.Microsecond, CallsPerSec: 1000}, {P50: 400 * time.Microsecond, CallsPerSec: 500}, {P50: 300 * time.Microsecond, CallsPerSec: 1000}}
	p50, cps := ratios(mode, ref)
	if p50 != 1.5 || cps != 0.9 {
		t.Fatalf("ratios = %v, %v; want 1.5 and 0.9 (per-round 1.5/1.5/1.1 and 0.9/0.9/0.8)", p50, cps)
	}
}

// TestNewSessionsSplitsConnectAndFirstCall: the new-session split is of
// the same sessions as the total (a go-sdk server whose tool takes 20 ms):
// each part's p50 is at most the total's, and the first call's holds the
// tool's time.
func TestNewSessionsSplitsConnectAndFirstCall(t *testing.T) {
	const toolTime = 20 * time.Millisecond
	server := mcp.NewServer(&mcp.Implementation{Name: "split", Version: "1"}, nil)
	mcp.AddTool(server, &mcp.Tool{Name: "slow"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		time.Sleep(toolTime)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}, nil, nil
	})
	ctx := context.Background()
	connect := func(ctx context.Context) (*mcp.ClientSession, error) {
		ct, st := mcp.NewInMemoryTransports()
		if _, err := server.Connect(ctx, st, nil); err != nil {
			return nil, err
		}
		return NewClient().Connect(ctx, ct, nil)
	}
	r, err := NewSessions(ctx, connect, 5, 0, func() *mcp.CallToolParams { return &mcp.CallToolParams{Name: "slow"} })
	if err != nil {
		t.Fatal(err)
	}
	if r.ConnectP50 <= 0 || r.FirstCallP50 < toolTime || r.P50 < r.FirstCallP50 || r.P50 < r.ConnectP50 {
		t.Fatalf("new session p50 %v = connect p50 %v + first call p50 %v: want both parts > 0, the first call >= %v, each <= the total", r.P50, r.ConnectP50, r.FirstCallP50, toolTime)
	}
}
