package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// BenchmarkGateway drives tools/call (the conformance everything-server's
// test_simple_text) through a real `cmcp serve` process and directly against
// the same upstream with the same go-sdk client, for a stdio and an HTTP
// upstream at concurrency 1 and 8 (8 sessions), with the audit log in
// interval and in group durability and a Cedar policy deciding every call. It
// prints one table: p50/p99, calls/s, the gateway's peak RSS (VmHWM of the
// cmcp process) and the cmcp/direct ratios. One command:
//
//	bash scripts/bench.sh
//
// (which is: eval "$(bash scripts/peers.sh)"; go test -run '^$' -bench Gateway -benchtime 1x ./internal/bench)
//
// BENCH_CALLS sets the timed calls per measurement (split over the
// sessions; default 2000), BENCH_ROUNDS the interleaved rounds whose medians
// are reported (default 3). BENCH_GW_ENV adds variables to the gateways'
// environment (e.g. "GOGC=400" to try a GC setting). BENCH_MODES keeps only
// the modes whose names contain one of its comma-separated words (and the
// direct modes), e.g. BENCH_MODES="--stdio,no-op". Every call has the same
// arguments, so the gateway decides it from its decision cache after the
// first; BENCH_VARY=1 gives every call its own arguments (in every mode), so
// that every decision is made by Cedar.
func BenchmarkGateway(b *testing.B) {
	everything := os.Getenv("CMCP_EVERYTHING_SERVER")
	if everything == "" {
		b.Fatal(ErrNoPeers)
	}
	calls := envInt(b, "BENCH_CALLS", 2000)
	vary := os.Getenv("BENCH_VARY") == "1"
	rounds := envInt(b, "BENCH_ROUNDS", 3)
	ctx := context.Background()
	cmcp := buildCmcp(b)
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}

	// The HTTP upstream: one everything-server process for every mode.
	httpAddr, err := FreeAddr()
	if err != nil {
		b.Fatal(err)
	}
	httpUp, err := Start(everything, []string{"-http", httpAddr, "-stateless=false"}, env)
	if err != nil {
		b.Fatal(err)
	}
	defer httpUp.Stop(5 * time.Second)
	upURL := "http://" + httpAddr + "/mcp"
	if err := httpUp.WaitHTTP(upURL, 10*time.Second); err != nil {
		b.Fatal(err)
	}
	// The HTTP floor: a reverse proxy that only passes requests on.
	proxyAddr, err := FreeAddr()
	if err != nil {
		b.Fatal(err)
	}
	proxy, err := Start(buildGo(b, "noproxy", "github.com/confidential-mcp/cmcp/internal/bench/noproxy"), []string{proxyAddr, upURL}, env)
	if err != nil {
		b.Fatal(err)
	}
	defer proxy.Stop(5 * time.Second)
	proxyURL := "http://" + proxyAddr + "/mcp"
	if err := proxy.WaitHTTP(proxyURL, 10*time.Second); err != nil {
		b.Fatal(err)
	}

	// One gateway process per (upstream kind, durability).
	type gw struct {
		proc     *Process
		endpoint string
	}
	const agentToken = "bench-agent-token"
	gwEnv := env
	if extra := os.Getenv("BENCH_GW_ENV"); extra != "" {
		gwEnv = append(slices.Clone(env), strings.Fields(extra)...)
	}
	gws := map[string]*gw{}
	for _, kind := range []string{"stdio", "http"} {
		for _, dur := range []string{"interval", "group"} {
			dir := b.TempDir()
			cfg := gatewayConfig(b, dir, kind, dur, everything, upURL, agentToken)
			p, endpoint, err := startGateway(cmcp, cfg, gwEnv)
			if err != nil {
				b.Fatal(err)
			}
			defer p.Stop(10 * time.Second)
			gws[kind+" "+dur] = &gw{proc: p, endpoint: endpoint}
		}
	}

	// Every mode uses the same go-sdk client. "direct" talks to the
	// upstream itself; "cmcp" goes through the gateway's Streamable HTTP
	// endpoint; "cmcp --stdio" is a local client spawning cmcp, which spawns
	// the upstream (both hops stdio, like "stdio direct").
	type mode struct {
		name, kind, via string // via: direct, or the durability of the gateway
		ref             string // the direct mode it is compared with
		connect         Connector
	}
	modes := []mode{
		{"stdio direct", "stdio", "direct", "", StdioConnector(everything)},
		{"http direct", "http", "direct", "", HTTPConnector(upURL, "")},
		// The floor: one extra process that only copies lines, where cmcp
		// would be.
		{"stdio no-op relay", "stdio", "direct", "stdio direct", StdioConnector(buildGo(b, "noprelay", "github.com/confidential-mcp/cmcp/internal/bench/noprelay"), everything)},
		{"http no-op proxy", "http", "direct", "http direct", HTTPConnector(proxyURL, "")},
	}
	for _, kind := range []string{"stdio", "http"} {
		for _, dur := range []string{"interval", "group"} {
			g := gws[kind+" "+dur]
			modes = append(modes, mode{kind + " cmcp " + dur, kind, dur, kind + " direct", HTTPConnector(g.endpoint, agentToken)})
		}
	}
	// "cmcp --stdio": a local client spawns cmcp, one gateway process per
	// session, each with its own audit log. With a stdio upstream both hops
	// are stdio, like "stdio direct"; with an HTTP upstream the agent's hop
	// is stdio and cmcp's is HTTP, against an agent dialling the upstream
	// itself ("http direct").
	stdioDir := b.TempDir()
	var stdioN int
	for _, kind := range []string{"stdio", "http"} {
		modes = append(modes, mode{kind + " cmcp --stdio interval", kind, "", kind + " direct", func(ctx context.Context) (*mcp.ClientSession, error) {
			stdioN++
			dir := filepath.Join(stdioDir, fmt.Sprint(stdioN))
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return nil, err
			}
			cfg := gatewayConfig(b, dir, kind, "interval", everything, upURL, agentToken)
			cmd := exec.Command(cmcp, "serve", "--stdio", "-c", cfg, "--log-level", "warn")
			cmd.Env = gwEnv
			return NewClient().Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
		}})
	}

	if only := os.Getenv("BENCH_MODES"); only != "" {
		// Keep the modes whose name contains one of the comma-separated
		// words, and the direct modes they are compared with.
		keep := modes[:0]
		for _, m := range modes {
			ok := m.via == "direct" && m.ref == ""
			for _, w := range strings.Split(only, ",") {
				ok = ok || (w != "" && strings.Contains(m.name, w))
			}
			if ok {
				keep = append(keep, m)
			}
		}
		modes = keep
	}
	results := map[string][]Result{}
	gwCPU := map[string]time.Duration{} // gateway CPU time spent in a mode's timed calls (and its warm-up)
	gwCalls := map[string]int{}
	for b.Loop() {
		for r := range rounds {
			for _, c := range []int{1, 8} {
				for _, m := range modes {
					runtime.GC()
					g := gws[m.kind+" "+m.via]
					var cpu0 time.Duration
					if g != nil {
						cpu0, _ = CPUTime(g.proc.Pid())
					}
					res, err := Measure(ctx, m.connect, Load{Concurrency: c, Calls: max(calls/c, 1), Warmup: 20, Tool: "test_simple_text", Vary: vary})
					if err != nil {
						b.Fatalf("%s c=%d round %d: %v", m.name, c, r, err)
					}
					key := fmt.Sprintf("%s|%d", m.name, c)
					results[key] = append(results[key], res)
					if g != nil {
						cpu1, _ := CPUTime(g.proc.Pid())
						gwCPU[m.name] += cpu1 - cpu0
						gwCalls[m.name] += res.Calls + 20*c
					}
				}
			}
		}
	}

	med := func(key string) Result {
		rs := results[key]
		p50 := make([]time.Duration, len(rs))
		p99 := make([]time.Duration, len(rs))
		cps := make([]float64, len(rs))
		for i, r := range rs {
			p50[i], p99[i], cps[i] = r.P50, r.P99, r.CallsPerSec
		}
		slices.Sort(p50)
		slices.Sort(p99)
		slices.Sort(cps)
		return Result{Concurrency: rs[0].Concurrency, Calls: rs[0].Calls, P50: p50[len(p50)/2], P99: p99[len(p99)/2], CallsPerSec: cps[len(cps)/2]}
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	argsNote := "the same arguments for every call (decision cache hits)"
	if vary {
		argsNote = "its own arguments for every call (every decision by Cedar)"
	}
	fmt.Fprintf(os.Stdout, "\ncmcp vs direct, test_simple_text with %s, %d calls per measurement, median of %d interleaved rounds (ratios: median of the per-round ratios), GOMAXPROCS %d\n",
		argsNote, calls, rounds, runtime.GOMAXPROCS(0))
	fmt.Fprintln(tw, "mode\tc\tp50\tp99\tcalls/s\tp50 × direct\tcalls/s × direct\tp50 × http direct\tcalls/s × http direct\tgateway peak RSS\t")
	for _, m := range modes {
		for _, c := range []int{1, 8} {
			r := med(fmt.Sprintf("%s|%d", m.name, c))
			cols := []string{"", "", "", ""}
			if m.ref != "" {
				p50d, cpsd := ratios(results[fmt.Sprintf("%s|%d", m.name, c)], results[fmt.Sprintf("%s|%d", m.ref, c)])
				p50h, cpsh := ratios(results[fmt.Sprintf("%s|%d", m.name, c)], results[fmt.Sprintf("http direct|%d", c)])
				cols = []string{fmt.Sprintf("%.2f", p50d), fmt.Sprintf("%.2f", cpsd), fmt.Sprintf("%.2f", p50h), fmt.Sprintf("%.2f", cpsh)}
				tag := strings.ReplaceAll(m.name, " ", "-")
				b.ReportMetric(p50d, fmt.Sprintf("p50-ratio-%s-c%d", tag, c))
				b.ReportMetric(cpsd, fmt.Sprintf("cps-ratio-%s-c%d", tag, c))
			}
			rss := ""
			if g := gws[m.kind+" "+m.via]; g != nil {
				if hwm, err := PeakRSS(g.proc.Pid()); err == nil {
					rss = fmt.Sprintf("%.1f MiB", float64(hwm)/(1<<20))
				}
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%.0f\t%s\t%s\t%s\t%s\t%s\t\n", m.name, c, r.P50.Round(time.Microsecond), r.P99.Round(time.Microsecond),
				r.CallsPerSec, cols[0], cols[1], cols[2], cols[3], rss)
		}
	}
	tw.Flush()
	for _, m := range modes {
		if n := gwCalls[m.name]; n > 0 {
			fmt.Printf("%s: gateway CPU %v per call (user+system, all sessions and rounds)\n", m.name, (gwCPU[m.name] / time.Duration(n)).Round(time.Microsecond))
		}
	}
	for key, g := range gws {
		if hwm, err := PeakRSS(g.proc.Pid()); err == nil {
			b.ReportMetric(float64(hwm)/(1<<20), "MiB-peak-rss-"+strings.ReplaceAll(key, " ", "-"))
		}
	}
	fmt.Println("targets (interval durability): p50 × direct ≤ 1.3 at c=1, calls/s × direct ≥ 0.8 at c=8, gateway peak RSS < 40 MiB at 8 sessions")
}

// ratios are the medians over the rounds of a mode's p50 and calls/s
// divided by its baseline's in the same round: a round's modes run back to
// back, so pairing them cancels the drift of a shared machine between
// rounds that a ratio of medians keeps.
func ratios(mode, ref []Result) (p50, cps float64) {
	n := min(len(mode), len(ref))
	ps, cs := make([]float64, n), make([]float64, n)
	for i := range n {
		ps[i] = float64(mode[i].P50) / float64(ref[i].P50)
		cs[i] = mode[i].CallsPerSec / ref[i].CallsPerSec
	}
	slices.Sort(ps)
	slices.Sort(cs)
	return ps[n/2], cs[n/2]
}

// gatewayConfig writes a cmcp.yaml for the benchmark: one upstream (the
// everything-server, spawned and measured, or dialled over HTTP), an agent
// token, the allow-list Cedar bundle from examples/policy (pinned) and the
// audit log in dur durability.
func gatewayConfig(b *testing.B, dir, kind, dur, everything, upURL, token string) string {
	b.Helper()
	policyDir, err := filepath.Abs("../../examples/policy/allow-list")
	if err != nil {
		b.Fatal(err)
	}
	policyPin, err := digest.Tree(context.Background(), policyDir, digest.TreeOptions{})
	if err != nil {
		b.Fatalf("policy bundle %s: %v", policyDir, err)
	}
	var up string
	if kind == "stdio" {
		real, err := filepath.EvalSymlinks(everything)
		if err != nil {
			b.Fatal(err)
		}
		f, pin, err := digest.OpenFile(real)
		if err != nil {
			b.Fatal(err)
		}
		f.Close()
		up = fmt.Sprintf("    stdio:\n      command: %s\n    pin:\n      command: %s\n", everything, pin)
	} else {
		up = fmt.Sprintf("    http:\n      url: %s\n", upURL)
	}
	text := fmt.Sprintf(`version: 1
server:
  listen: 127.0.0.1:0
  tee: software
  stdio_identity: bench
  tokens:
    - identity: bench
      sha256: %s
audit:
  dir: audit
  durability: %s
policy:
  dir: %s
  expect: %s
  mode: enforcing
  groups:
    ops: [bench]
upstreams:
  - name: everything
%s    namespace: false
`, digest.Bytes([]byte(token)), dur, policyDir, policyPin, up)
	path := filepath.Join(dir, "cmcp.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		b.Fatal(err)
	}
	return path
}

// startGateway runs `cmcp serve -c cfg` on a free loopback port (logging
// only warnings, as a production gateway would) and returns it with its MCP
// endpoint.
func startGateway(cmcp, cfg string, env []string) (*Process, string, error) {
	addr, err := FreeAddr()
	if err != nil {
		return nil, "", err
	}
	p, err := Start(cmcp, []string{"serve", "-c", cfg, "--listen", addr, "--log-level", "warn"}, env)
	if err != nil {
		return nil, "", err
	}
	endpoint := "http://" + addr + "/mcp"
	if err := p.WaitHTTP(endpoint, 30*time.Second); err != nil {
		p.Stop(time.Second)
		return nil, "", err
	}
	return p, endpoint, nil
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
	return buildGo(b, "cmcp", "github.com/confidential-mcp/cmcp/cmd/cmcp")
}

func buildGo(b *testing.B, name, pkg string) string {
	b.Helper()
	out := filepath.Join(b.TempDir(), name)
	cmd := exec.Command("go", "build", "-o", out, pkg)
	if msg, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("go build %s: %v\n%s", name, err, strings.TrimSpace(string(msg)))
	}
	return out
}
