package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// BenchmarkNewSessionCPU measures a new session's gateway CPU against
// its floors, in interleaved rounds (BENCH_ROUNDS, default 3) of
// BENCH_SESSIONS (default 100) sessions opened one after another,
// BENCH_SESSION_GAP_MS (default 50) apart, each a connect, one call and a
// close, as BenchmarkTable's "new" column. Per round it takes:
//
//   - the bare go-sdk echo server's CPU per new HTTP session (the floor
//     of a gateway's agent side: go-sdk and net/http serving the same six
//     requests);
//   - a bare go-sdk client's CPU per new session starting a stdio echo
//     server and handshaking with it (this process's: the floor of a
//     per-session upstream's side; the child's own CPU is not counted,
//     as it is not for the gateway);
//   - `cmcp serve` with a per-session, pinned and sealed stdio upstream
//     with warm_spares: 2 (the sum of its threads' schedstat), and the
//     same for BENCH_CMCP_BEFORE's binary if set (the two gateways take
//     turns at going first).
//
// It prints the medians and what cmcp spends beyond the two floors, and
// the part of the client's floor that is the spawn alone (starting the
// server and waiting for its exit, no MCP). With
// BENCH_PERF=<file> the first round of this checkout's gateway runs
// under `perf record -g -p <gateway>` writing to that file.
//
//	go test -run '^$' -bench NewSessionCPU -benchtime 1x ./internal/bench
func BenchmarkNewSessionCPU(b *testing.B) {
	rounds := envInt(b, "BENCH_ROUNDS", 3)
	n := envInt(b, "BENCH_SESSIONS", 100)
	gap := time.Duration(envInt(b, "BENCH_SESSION_GAP_MS", 50)) * time.Millisecond
	ctx := context.Background()
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	cmcp := os.Getenv("BENCH_CMCP")
	if cmcp == "" {
		cmcp = buildCmcp(b)
	}
	echo := buildGo(b, "echoserver", "github.com/confidential-mcp/cmcp/internal/bench/echoserver")
	httpAddr, err := FreeAddr()
	if err != nil {
		b.Fatal(err)
	}
	up, err := Start(echo, []string{"-http", httpAddr}, env)
	if err != nil {
		b.Fatal(err)
	}
	defer up.Stop(5 * time.Second)
	upURL := "http://" + httpAddr + "/mcp"
	if err := up.WaitHTTP(upURL, 10*time.Second); err != nil {
		b.Fatal(err)
	}
	const token = "bench-agent-token"
	upYAML := fmt.Sprintf("    stdio:\n      command: %s\n      sealed: true\n    pin:\n      command: %s\n    warm_spares: 2\n", echo, fileDigest(b, echo))
	type target struct {
		name    string
		pid     int
		connect Connector
	}
	targets := []target{
		{"bare go-sdk HTTP server (agent side floor)", up.Pid(), HTTPConnector(upURL, "")},
		{"bare go-sdk client starting a stdio server (upstream side floor)", os.Getpid(), StdioConnector(echo)},
	}
	gws := []struct{ name, bin string }{{"cmcp serve, per-session stdio, warm_spares: 2", cmcp}}
	if before := os.Getenv("BENCH_CMCP_BEFORE"); before != "" {
		gws = append(gws, struct{ name, bin string }{"before: cmcp serve, per-session stdio, warm_spares: 2", before})
	}
	for _, g := range gws {
		gw, endpoint, err := startGateway(g.bin, tableConfig(b, b.TempDir(), upYAML, token), env)
		if err != nil {
			b.Fatal(err)
		}
		defer gw.Stop(10 * time.Second)
		targets = append(targets, target{g.name, gw.Pid(), HTTPConnector(endpoint, token)})
	}
	first := func() *mcp.CallToolParams {
		return &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "hello"}}
	}
	cpu, p50 := map[string][]float64{}, map[string][]float64{}
	for b.Loop() {
		for r := range rounds {
			order := slices.Clone(targets)
			if r%2 == 1 {
				slices.Reverse(order[2:]) // neither gateway always goes first
			}
			for i, t := range order {
				if _, err := NewSessions(ctx, t.connect, 5, gap, first); err != nil { // warm up
					b.Fatalf("%s: %v", t.name, err)
				}
				var perf *exec.Cmd
				if out := os.Getenv("BENCH_PERF"); out != "" && r == 0 && i == 2 {
					perf = exec.Command("perf", "record", "-g", "-o", out, "-p", fmt.Sprint(t.pid))
					perf.Stdout, perf.Stderr = os.Stderr, os.Stderr
					if err := perf.Start(); err != nil {
						b.Fatal(err)
					}
					time.Sleep(500 * time.Millisecond)
				}
				runtime.GC()
				c0, err := SchedCPU(t.pid)
				if err != nil {
					b.Fatal(err)
				}
				res, err := NewSessions(ctx, t.connect, n, gap, first)
				if err != nil {
					b.Fatalf("%s: %v", t.name, err)
				}
				c1, _ := SchedCPU(t.pid)
				if perf != nil {
					perf.Process.Signal(syscall.SIGINT)
					perf.Wait()
				}
				cpu[t.name] = append(cpu[t.name], float64((c1-c0)/time.Duration(n)))
				p50[t.name] = append(p50[t.name], float64(res.P50))
			}
		}
	}
	// The spawn alone: start the echo server with its three pipes, close
	// its stdin (it exits at EOF) and wait for it, this process's CPU.
	var spawn []float64
	for range rounds {
		c0, _ := SchedCPU(os.Getpid())
		for range n {
			cmd := exec.Command(echo)
			cmd.Env = env
			in, err := cmd.StdinPipe()
			if err != nil {
				b.Fatal(err)
			}
			if _, err := cmd.StdoutPipe(); err != nil {
				b.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			in.Close()
			cmd.Wait()
		}
		c1, _ := SchedCPU(os.Getpid())
		spawn = append(spawn, float64((c1-c0)/time.Duration(n)))
	}
	med := func(xs []float64) time.Duration { return time.Duration(median(xs)).Round(10 * time.Microsecond) }
	fmt.Printf("\nCPU per new session (%d sessions %v apart, connect + one call + close; median of %d interleaved rounds):\n", n, gap, rounds)
	for _, t := range targets {
		fmt.Printf("  %s: %v (new session p50 %v)\n", t.name, med(cpu[t.name]), med(p50[t.name]))
	}
	fmt.Printf("  of the client's: starting a stdio server and waiting for its exit, no MCP: %v\n", med(spawn))
	floor := med(cpu[targets[0].name]) + med(cpu[targets[1].name])
	fmt.Printf("  the two floors together: %v\n", floor)
	for _, t := range targets[2:] {
		// Per round, the gateway's CPU minus the floors of the same round.
		var own []float64
		for r := range cpu[t.name] {
			own = append(own, cpu[t.name][r]-cpu[targets[0].name][r]-cpu[targets[1].name][r])
		}
		fmt.Printf("  %s beyond the floors: %v\n", t.name, med(own))
	}
	for r := range rounds {
		fmt.Printf("  round %d:", r+1)
		for _, t := range targets {
			fmt.Printf(" %v", time.Duration(cpu[t.name][r]).Round(10*time.Microsecond))
		}
		fmt.Println()
	}
	if len(targets) == 4 {
		var xs []float64
		for r := range rounds {
			xs = append(xs, cpu[targets[2].name][r]/cpu[targets[3].name][r])
		}
		fmt.Printf("  this checkout / before: %.3f × (median of the rounds' ratios)\n", median(xs))
	}
}
