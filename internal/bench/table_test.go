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
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// BenchmarkTable prints issue 18's table: for cmcp with each kind of
// upstream, the floors (a do-nothing stdio line relay, a do-nothing
// httputil.ReverseProxy, and the floor of a correct stdio gateway: the
// relay plus one Cedar decision and the call and result records per call,
// internal/bench/floorrelay) and the upstream reached directly, all with the
// same go-sdk client and the same go-sdk echo server (internal/bench/
// echoserver), in one run of interleaved rounds:
//
//   - c1 p50: one session, one call at a time;
//   - c8 calls/s: one session, 8 callers;
//   - 8 sessions calls/s: 8 sessions, one caller each;
//   - new session p50: connect (the MCP handshake) and the first call's
//     answer, sessions opened one after another, BENCH_SESSION_GAP_MS
//     (default 50) apart, as agents that open a session per task would
//     (closing and the gap are not timed; warm spares refill meanwhile);
//     a line per mode after the table splits it into the connect's p50
//     and the first call's;
//   - 64 KiB p50: one session, one call at a time, 64 KiB of text echoed;
//   - VmHWM: the gateway process's peak RSS once the 8 sessions of the
//     first round are open, and at the end of the run;
//   - gateway CPU per new session (the gateway's threads over the new
//     sessions, opening and closing them, warm spares made meanwhile
//     included) and per call (over the c1, c8 and 8-session calls); for
//     serve --stdio and the stdio relays, the CPU per call is its
//     process's (the upstream's not included); for
//     the direct modes, the client's CPU per new session (this process:
//     for stdio direct, starting the server and the handshake) and the
//     HTTP server's, the floors of a gateway's work per new session.
//
// Ratios are to "http direct" (the client calling the HTTP server itself),
// each the median of the per-round ratios. "added" is a mode's c1 p50 minus
// its direct mode's in the same round, and "× floor" divides it by the
// floor's added p50 in that round (the relay's for stdio fronts, the
// proxy's for the HTTP front); for serve --stdio a line after the table
// also divides it by the floor relay's. cmcp runs with the audit log (interval
// durability) and the allow-list Cedar bundle deciding every call; stdio
// upstreams are pinned and sealed. One command:
//
//	bash scripts/bench.sh table
//
// BENCH_ROUNDS (default 3), BENCH_CALLS (timed calls per call
// measurement, default 1000), BENCH_SESSIONS (new sessions per round and
// mode, default 30), BENCH_KINDS (keep only these comma-separated columns:
// c1, c8, s8, new, 64k), BENCH_MODES (keep the modes whose names contain one of
// its comma-separated words, and the direct ones), BENCH_GW_ENV (variables
// added to the gateways' environment, e.g. "GOGC=100"), BENCH_CMCP (a cmcp
// binary to run instead of this checkout's), BENCH_CMCP_BEFORE (an earlier
// cmcp binary whose HTTP, per-session (with and without warm spares) and
// shared stdio rows and serve --stdio row join the same run, for a
// before/after pair).
func BenchmarkTable(b *testing.B) {
	rounds := envInt(b, "BENCH_ROUNDS", 3)
	calls := envInt(b, "BENCH_CALLS", 1000)
	newSessions := envInt(b, "BENCH_SESSIONS", 30)
	gap := time.Duration(envInt(b, "BENCH_SESSION_GAP_MS", 50)) * time.Millisecond
	ctx := context.Background()
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	gwEnv := env
	if extra := os.Getenv("BENCH_GW_ENV"); extra != "" {
		gwEnv = append(slices.Clone(env), strings.Fields(extra)...)
	}
	cmcp := os.Getenv("BENCH_CMCP") // another build to compare, e.g. an earlier commit's
	if cmcp == "" {
		cmcp = buildCmcp(b)
	}
	echo := buildGo(b, "echoserver", "github.com/confidential-mcp/cmcp/internal/bench/echoserver")
	relay := buildGo(b, "noprelay", "github.com/confidential-mcp/cmcp/internal/bench/noprelay")
	floorRelay := buildGo(b, "floorrelay", "github.com/confidential-mcp/cmcp/internal/bench/floorrelay")

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

	const token = "bench-agent-token"
	pin := fileDigest(b, echo)
	stdioUp := fmt.Sprintf("    stdio:\n      command: %s\n      sealed: true\n    pin:\n      command: %s\n", echo, pin)
	httpUp := fmt.Sprintf("    http:\n      url: %s\n", upURL)

	type mode struct {
		name    string
		direct  string // the direct mode its added p50 is counted from ("" for a direct mode)
		floor   string // the floor whose added p50 it is compared with
		connect Connector
		gw      *Process                 // the gateway process (CPU, VmHWM), if one serves every session
		server  *Process                 // a direct mode's server process, if one serves every session (CPU)
		pids    func() []int             // the processes serving the open sessions (serve --stdio, the relays)
		track   func(*mcp.ClientSession) // forgets a closed session's process (serve --stdio, the relays)
	}
	gateway := func(bin, name, upYAML string) (*Process, string) {
		dir := b.TempDir()
		cfg := tableConfig(b, dir, upYAML, token)
		p, endpoint, err := startGateway(bin, cfg, gwEnv)
		if err != nil {
			b.Fatalf("%s: %v", name, err)
		}
		b.Cleanup(func() { p.Stop(10 * time.Second) })
		return p, endpoint
	}
	var modes []mode
	add := func(m mode) { modes = append(modes, m) }
	// perProcess completes m: each session is a process of its own,
	// started with cmdFor(n) for the nth session, whose CPU and VmHWM are
	// counted as the gateway's.
	perProcess := func(m mode, cmdFor func(n int) (*exec.Cmd, error)) mode {
		var mu sync.Mutex
		procs := map[*mcp.ClientSession]int{}
		var n int
		m.connect = func(ctx context.Context) (*mcp.ClientSession, error) {
			mu.Lock()
			n++
			i := n
			mu.Unlock()
			cmd, err := cmdFor(i)
			if err != nil {
				return nil, err
			}
			s, err := NewClient().Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
			if err == nil {
				mu.Lock()
				procs[s] = cmd.Process.Pid
				mu.Unlock()
			}
			return s, err
		}
		m.pids = func() []int {
			mu.Lock()
			defer mu.Unlock()
			var out []int
			for _, p := range procs {
				out = append(out, p)
			}
			return out
		}
		m.track = func(s *mcp.ClientSession) {
			mu.Lock()
			delete(procs, s)
			mu.Unlock()
		}
		return m
	}
	add(mode{name: "http direct", connect: HTTPConnector(upURL, ""), server: up})
	add(mode{name: "stdio direct", connect: StdioConnector(echo)})
	add(mode{name: "http no-op proxy", direct: "http direct", connect: HTTPConnector(proxyURL, "")})
	add(perProcess(mode{name: "stdio no-op relay", direct: "stdio direct"}, func(int) (*exec.Cmd, error) {
		cmd := exec.Command(relay, echo)
		cmd.Env = env
		return cmd, nil
	}))
	// The floor of a correct stdio gateway: the relay's hop plus the work
	// cmcp's properties take per call (floorrelay's comment lists it), with
	// the same Cedar bundle and groups and the same audit durability.
	floorDir := b.TempDir()
	add(perProcess(mode{name: floorRelayMode, direct: "stdio direct", floor: "stdio no-op relay"}, func(n int) (*exec.Cmd, error) {
		audit := filepath.Join(floorDir, fmt.Sprint(n)) // one log per process, as serve --stdio has
		cmd := exec.Command(floorRelay, "-policy", allowListDir(b), "-groups", "ops=bench", "-audit", audit, "-durability", "interval", echo)
		cmd.Env = env
		return cmd, nil
	}))
	keep := func(name string) bool {
		only := os.Getenv("BENCH_MODES")
		if only == "" {
			return true
		}
		for _, w := range strings.Split(only, ",") {
			if w != "" && strings.Contains(name, w) {
				return true
			}
		}
		return false
	}
	gws := []struct{ bin, name, upYAML string }{
		{cmcp, "cmcp, HTTP upstream", httpUp},
		{cmcp, "cmcp, stdio upstream (per-session)", stdioUp},
		{cmcp, "cmcp, stdio upstream (shared)", stdioUp + "    lifecycle: shared\n"},
		{cmcp, "cmcp, stdio upstream (per-session, warm spares)", stdioUp + "    warm_spares: 2\n"},
		{cmcp, "cmcp, HTTP upstream (warm spares)", httpUp + "    warm_spares: 2\n"},
	}
	if before := os.Getenv("BENCH_CMCP_BEFORE"); before != "" {
		// An earlier build in the same run, for a before/after pair.
		gws = append(gws, struct{ bin, name, upYAML string }{before, "before: cmcp, HTTP upstream", httpUp},
			struct{ bin, name, upYAML string }{before, "before: cmcp, stdio upstream (per-session)", stdioUp},
			struct{ bin, name, upYAML string }{before, "before: cmcp, stdio upstream (shared)", stdioUp + "    lifecycle: shared\n"},
			struct{ bin, name, upYAML string }{before, "before: cmcp, stdio upstream (per-session, warm spares)", stdioUp + "    warm_spares: 2\n"})
	}
	for _, g := range gws {
		if !keep(g.name) {
			continue
		}
		p, endpoint := gateway(g.bin, g.name, g.upYAML)
		add(mode{name: g.name, direct: "http direct", floor: "http no-op proxy", connect: HTTPConnector(endpoint, token), gw: p})
	}
	serveStdio := func(bin, name string) {
		if !keep(name) {
			return
		}
		dir := b.TempDir()
		add(perProcess(mode{name: name, direct: "stdio direct", floor: "stdio no-op relay"}, func(n int) (*exec.Cmd, error) {
			// One gateway process per session, each with its own
			// audit log, as a local client would run it.
			d := filepath.Join(dir, fmt.Sprint(n))
			if err := os.MkdirAll(d, 0o700); err != nil {
				return nil, err
			}
			cmd := exec.Command(bin, "serve", "--stdio", "-c", tableConfig(b, d, stdioUp, token), "--log-level", "warn")
			cmd.Env = gwEnv
			return cmd, nil
		}))
	}
	serveStdio(cmcp, "cmcp serve --stdio, stdio upstream")
	if before := os.Getenv("BENCH_CMCP_BEFORE"); before != "" {
		serveStdio(before, "before: cmcp serve --stdio, stdio upstream")
	}
	modes = slices.DeleteFunc(modes, func(m mode) bool { return m.direct != "" && !keep(m.name) })
	hasMode := func(name string) bool {
		return slices.ContainsFunc(modes, func(m mode) bool { return m.name == name })
	}

	// Fresh params for every call: go-sdk's client writes the session's
	// protocol version into a call's _meta.
	echoCall := func(text string) func(int64) *mcp.CallToolParams {
		return func(int64) *mcp.CallToolParams {
			return &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": text}}
		}
	}
	small := echoCall("hello")
	big := echoCall(strings.Repeat("x", 64<<10))
	open := func(m mode, n int) ([]*mcp.ClientSession, func(), error) {
		var ss []*mcp.ClientSession
		closeAll := func() {
			for _, s := range ss {
				s.Close()
				if m.track != nil {
					m.track(s)
				}
			}
		}
		for range n {
			s, err := m.connect(ctx)
			if err != nil {
				closeAll()
				return nil, nil, err
			}
			ss = append(ss, s)
		}
		return ss, closeAll, nil
	}
	hwm := func(m mode) int64 {
		var pids []int
		if m.gw != nil {
			pids = []int{m.gw.Pid()}
		} else if m.pids != nil {
			pids = m.pids()
		}
		var peak int64
		for _, pid := range pids {
			if v, err := PeakRSS(pid); err == nil {
				peak = max(peak, v)
			}
		}
		return peak
	}

	type key struct{ mode, what string }
	res := map[key][]Result{}
	hwm8 := map[string]int64{}
	cpuPerSession := map[string][]time.Duration{}
	// A direct mode's CPU per new session: this process's (the client:
	// for stdio, starting the server and the MCP handshake with it) and
	// its server's, the floors of what a gateway does per new session.
	clientPerSession, serverPerSession := map[string][]time.Duration{}, map[string][]time.Duration{}
	cpuCalls, nCalls := map[string]time.Duration{}, map[string]int{}
	kinds := []string{"c1", "c8", "s8", "new", "64k"}
	if only := os.Getenv("BENCH_KINDS"); only != "" {
		kinds = slices.DeleteFunc(kinds, func(k string) bool { return !slices.Contains(strings.Split(only, ","), k) })
	}
	for b.Loop() {
		for r := range rounds {
			for _, kind := range kinds {
				for _, m := range modes {
					runtime.GC()
					var out Result
					var err error
					switch kind {
					case "c1", "c8", "s8", "64k":
						sessions, callers, n, params := 1, 1, calls, small
						switch kind {
						case "c8":
							callers, n = 8, max(2*calls/8, 1)
						case "s8":
							sessions, callers, n = 8, 8, max(2*calls/8, 1)
						case "64k":
							n, params = max(calls/4, 1), big
						}
						var ss []*mcp.ClientSession
						var closeAll func()
						ss, closeAll, err = open(m, sessions)
						if err == nil {
							// The gateway's CPU over the calls: its process, or
							// serve --stdio's processes (one per session).
							var pids []int
							if m.gw != nil {
								pids = []int{m.gw.Pid()}
							} else if m.pids != nil {
								pids = m.pids()
							}
							cpuOf := func() (sum time.Duration) {
								for _, pid := range pids {
									c, _ := SchedCPU(pid)
									sum += c
								}
								return sum
							}
							cpu0 := cpuOf()
							out, err = Calls(ctx, ss, callers, n, 10, params)
							if len(pids) > 0 && err == nil && kind != "64k" {
								cpuCalls[m.name] += cpuOf() - cpu0
								nCalls[m.name] += out.Calls + 10*callers
							}
							if kind == "s8" && r == 0 {
								hwm8[m.name] = hwm(m)
							}
							closeAll()
						}
					case "new":
						var cpu0, client0, server0 time.Duration
						if m.gw != nil {
							cpu0, _ = SchedCPU(m.gw.Pid())
						}
						if m.direct == "" {
							client0, _ = SchedCPU(os.Getpid())
						}
						if m.server != nil {
							server0, _ = SchedCPU(m.server.Pid())
						}
						out, err = NewSessions(ctx, m.connect, newSessions, gap, func() *mcp.CallToolParams { return small(0) })
						if m.gw != nil && err == nil {
							cpu1, _ := SchedCPU(m.gw.Pid())
							cpuPerSession[m.name] = append(cpuPerSession[m.name], (cpu1-cpu0)/time.Duration(newSessions))
						}
						if m.direct == "" && err == nil {
							client1, _ := SchedCPU(os.Getpid())
							clientPerSession[m.name] = append(clientPerSession[m.name], (client1-client0)/time.Duration(newSessions))
						}
						if m.server != nil && err == nil {
							server1, _ := SchedCPU(m.server.Pid())
							serverPerSession[m.name] = append(serverPerSession[m.name], (server1-server0)/time.Duration(newSessions))
						}
					}
					if err != nil {
						b.Fatalf("%s, %s, round %d: %v", m.name, kind, r, err)
					}
					res[key{m.name, kind}] = append(res[key{m.name, kind}], out)
				}
			}
		}
	}

	// ratio is the median over the rounds of f(mode's result) / f(ref's).
	ratio := func(mode, ref, kind string, f func(Result) float64) float64 {
		a, c := res[key{mode, kind}], res[key{ref, kind}]
		n := min(len(a), len(c))
		rs := make([]float64, n)
		for i := range n {
			rs[i] = f(a[i]) / f(c[i])
		}
		return median(rs)
	}
	p50 := func(r Result) float64 { return float64(r.P50) }
	cps := func(r Result) float64 { return r.CallsPerSec }
	medDur := func(mode, kind string) time.Duration {
		var ds []float64
		for _, r := range res[key{mode, kind}] {
			ds = append(ds, float64(r.P50))
		}
		return time.Duration(median(ds))
	}
	// added is the median over the rounds of mode's c1 p50 minus its
	// direct mode's, and of that divided by the floor's.
	added := func(m mode, floor string) (time.Duration, float64) {
		var floorDirect string
		for _, f := range modes {
			if f.name == floor {
				floorDirect = f.direct
			}
		}
		a, d := res[key{m.name, "c1"}], res[key{m.direct, "c1"}]
		fl, fd := res[key{floor, "c1"}], res[key{floorDirect, "c1"}]
		var adds, xs []float64
		for i := range min(len(a), len(d)) {
			add := float64(a[i].P50 - d[i].P50)
			adds = append(adds, add)
			if i < len(fl) && i < len(fd) {
				if fa := float64(fl[i].P50 - fd[i].P50); fa > 0 {
					xs = append(xs, add/fa)
				}
			}
		}
		return time.Duration(median(adds)), median(xs)
	}

	fmt.Printf("\nissue 18 table: echo tool, %d calls per call measurement (64 KiB: %d), %d new sessions %v apart, median of %d interleaved rounds, GOMAXPROCS %d; ratios to http direct (median of per-round ratios)\n",
		calls, max(calls/4, 1), newSessions, gap, rounds, runtime.GOMAXPROCS(0))
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "target\tc1 p50\tc8 calls/s\t8 sessions calls/s\tnew session p50\t64 KiB p50\tVmHWM (8 sessions / end)\tadded c1 p50\tadded × floor\tCPU per new session\tCPU per call\t")
	for _, m := range modes {
		row := []string{m.name}
		for _, c := range []struct {
			kind string
			f    func(Result) float64
		}{{"c1", p50}, {"c8", cps}, {"s8", cps}, {"new", p50}, {"64k", p50}} {
			v := ""
			if c.kind == "c8" || c.kind == "s8" {
				rs := res[key{m.name, c.kind}]
				var vs []float64
				for _, r := range rs {
					vs = append(vs, r.CallsPerSec)
				}
				v = fmt.Sprintf("%.0f/s", median(vs))
			} else {
				v = medDur(m.name, c.kind).Round(time.Microsecond).String()
			}
			if m.name != "http direct" {
				v += fmt.Sprintf(" (%.2f ×)", ratio(m.name, "http direct", c.kind, c.f))
			}
			row = append(row, v)
		}
		mem := ""
		if h := hwm8[m.name]; h > 0 {
			mem = fmt.Sprintf("%.1f / %.1f MiB", float64(h)/(1<<20), float64(hwm(m))/(1<<20))
			if m.gw == nil {
				mem = fmt.Sprintf("%.1f MiB", float64(h)/(1<<20))
			}
		}
		row = append(row, mem)
		if m.direct != "" {
			a, x := added(m, m.floor)
			xs := ""
			if m.floor != "" {
				xs = fmt.Sprintf("%.2f", x)
			}
			row = append(row, a.Round(time.Microsecond).String(), xs)
		} else {
			row = append(row, "", "")
		}
		medCPU := func(cs []time.Duration) string {
			var fs []float64
			for _, c := range cs {
				fs = append(fs, float64(c))
			}
			return time.Duration(median(fs)).Round(10 * time.Microsecond).String()
		}
		cpu := ""
		if cs := cpuPerSession[m.name]; len(cs) > 0 {
			cpu = medCPU(cs)
		}
		if cs := clientPerSession[m.name]; len(cs) > 0 {
			cpu = "client " + medCPU(cs)
			if ss := serverPerSession[m.name]; len(ss) > 0 {
				cpu += ", server " + medCPU(ss)
			}
		}
		row = append(row, cpu)
		if n := nCalls[m.name]; n > 0 {
			row = append(row, (cpuCalls[m.name] / time.Duration(n)).Round(time.Microsecond).String())
		} else {
			row = append(row, "")
		}
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	tw.Flush()
	for _, m := range modes {
		if m.floor == "" {
			continue
		}
		fm := ""
		for _, f := range modes {
			if f.name == m.floor {
				fm = fmt.Sprintf("; c8 calls/s %.2f × the %s's, 8 sessions %.2f ×", ratio(m.name, f.name, "c8", cps), f.name, ratio(m.name, f.name, "s8", cps))
			}
		}
		fmt.Printf("%s: new session %.2f × http direct's%s\n", m.name, ratio(m.name, "http direct", "new", p50), fm)
		if m.floor == "stdio no-op relay" && m.name != floorRelayMode && hasMode(floorRelayMode) {
			a, xRelay := added(m, m.floor)
			fa, _ := added(mode{name: floorRelayMode, direct: "stdio direct"}, "")
			_, xFloor := added(m, floorRelayMode)
			fmt.Printf("%s: added c1 p50 %v, %.2f × the no-op relay's, %.2f × the floor relay's (%v, Cedar and the audit log); c8 calls/s %.2f × the floor relay's\n",
				m.name, a.Round(time.Microsecond), xRelay, xFloor, fa.Round(time.Microsecond), ratio(m.name, floorRelayMode, "c8", cps))
		}
	}
	if slices.Contains(kinds, "new") {
		// Where a new session's time goes: its connect (initialize, the
		// initialized notification; go-sdk's client also opens the
		// standalone GET stream of an HTTP session) and its first call.
		for _, m := range modes {
			var cs, fs []float64
			for _, r := range res[key{m.name, "new"}] {
				cs, fs = append(cs, float64(r.ConnectP50)), append(fs, float64(r.FirstCallP50))
			}
			fmt.Printf("%s: new session = connect p50 %v + first call p50 %v\n", m.name,
				time.Duration(median(cs)).Round(time.Microsecond), time.Duration(median(fs)).Round(time.Microsecond))
		}
	}
	fmt.Println("targets: new session ≤ 1.5 × http direct's (stdio per-session and HTTP upstreams), gateway CPU per new session < 2 ms; added c1 p50 ≤ 1.5 × the relay's (serve --stdio), ≤ 1.3 × the proxy's (HTTP front); c8 calls/s ≥ 0.9 × the relay's; VmHWM at 8 sessions < 24 MiB")
}

// floorRelayMode is the floor of a correct stdio gateway's row
// (internal/bench/floorrelay).
const floorRelayMode = "stdio floor relay (Cedar, audit)"

// allowListDir is the Cedar bundle every gateway of the table decides
// with.
func allowListDir(b *testing.B) string {
	b.Helper()
	dir, err := filepath.Abs("../../examples/policy/allow-list")
	if err != nil {
		b.Fatal(err)
	}
	return dir
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

func fileDigest(b *testing.B, path string) digest.Digest {
	b.Helper()
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		b.Fatal(err)
	}
	f, d, err := digest.OpenFile(real)
	if err != nil {
		b.Fatal(err)
	}
	f.Close()
	return d
}

// tableConfig writes a cmcp.yaml with one upstream "echo" (upYAML: its
// stdio or http section and more), an agent token, the allow-list Cedar
// bundle (pinned) and the audit log in interval durability.
func tableConfig(b *testing.B, dir, upYAML, token string) string {
	b.Helper()
	policyDir := allowListDir(b)
	policyPin, err := digest.Tree(context.Background(), policyDir, digest.TreeOptions{})
	if err != nil {
		b.Fatalf("policy bundle %s: %v", policyDir, err)
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
  dir: %s
  durability: interval
policy:
  dir: %s
  expect: %s
  mode: enforcing
  groups:
    ops: [bench]
upstreams:
  - name: echo
%s    namespace: false
`, digest.Bytes([]byte(token)), "audit", policyDir, policyPin, upYAML)
	path := filepath.Join(dir, "cmcp.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		b.Fatal(err)
	}
	return path
}
