// Package metrics is the gateway's metrics registry: counters of calls,
// policy decisions, spawns and refused sessions, a call latency histogram,
// upstream health and gauges registered by the parts that own them, all
// rendered in the Prometheus text exposition format for the admin
// listener's /metrics. The gateway core counts into it through
// gateway.Metrics; the labels' values are the core's.
package metrics

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Registry holds the gateway's counters and renders them in the Prometheus
// text exposition format (version 0.0.4) for the admin listener's /metrics.
//
// It is written by hand rather than with prometheus/client_golang: the
// gateway needs a handful of counters, one histogram and a few gauges, and
// client_golang would bring a dozen modules (protobuf, prometheus/common,
// procfs) and a few MiB of resident memory into a process whose budget is
// 40 MiB. The format is small and stable; a test parses our output back.
//
// All methods are safe for concurrent use; the hot-path methods take one
// short mutex.
type Registry struct {
	start time.Time

	mu        sync.Mutex
	calls     map[[3]string]uint64 // upstream, decision, outcome
	decisions map[[2]string]uint64 // decision, mode
	latency   map[string]*histogram
	up        map[string]bool
	spawns    map[[2]string]uint64 // upstream, result
	refused   map[string]uint64    // new sessions refused, by the bound reached
	gauges    []gaugeFunc
}

type gaugeFunc struct {
	name, help, typ string // typ: "gauge" or "counter"
	f               func() float64
}

// latencyBuckets are the upper bounds, in seconds, of the call latency
// histogram: sub-millisecond gateway overhead up to minute-long tools.
var latencyBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

type histogram struct {
	counts []uint64 // per bucket, not cumulative; the last one is +Inf
	sum    float64
	n      uint64
}

func (h *histogram) observe(v float64) {
	i, _ := slices.BinarySearch(latencyBuckets, v)
	h.counts[i]++
	h.sum += v
	h.n++
}

// New returns an empty registry.
func New() *Registry {
	return &Registry{
		start:     time.Now(),
		calls:     map[[3]string]uint64{},
		decisions: map[[2]string]uint64{},
		latency:   map[string]*histogram{},
		up:        map[string]bool{},
		spawns:    map[[2]string]uint64{},
		refused:   map[string]uint64{},
	}
}

// CallDone counts one finished tools/call. latency is the time the gateway
// spent on it (zero for a call that was refused before forwarding, which is
// then not observed in the histogram).
func (m *Registry) CallDone(upstream, decision, outcome string, latency time.Duration) {
	m.mu.Lock()
	m.calls[[3]string{upstream, decision, outcome}]++
	if latency > 0 {
		h := m.latency[upstream]
		if h == nil {
			h = &histogram{counts: make([]uint64, len(latencyBuckets)+1)}
			m.latency[upstream] = h
		}
		h.observe(latency.Seconds())
	}
	m.mu.Unlock()
}

// Decision counts one policy decision (allow/deny) in a policy mode.
func (m *Registry) Decision(decision, mode string) {
	m.mu.Lock()
	m.decisions[[2]string{decision, mode}]++
	m.mu.Unlock()
}

// UpstreamHealth sets whether an upstream is currently usable.
func (m *Registry) UpstreamHealth(upstream string, up bool) {
	m.mu.Lock()
	m.up[upstream] = up
	m.mu.Unlock()
}

// Spawn counts one spawn attempt of a stdio upstream; result is "ok" or why
// it was refused ("digest_mismatch", "exited", ...).
func (m *Registry) Spawn(upstream, result string) {
	m.mu.Lock()
	m.spawns[[2]string{upstream, result}]++
	m.mu.Unlock()
}

// SessionRefused counts one new session refused because a bound was
// reached: limit is "per_agent" (server.max_sessions_per_agent, HTTP 429)
// or "total" (server.max_sessions, 503).
func (m *Registry) SessionRefused(limit string) {
	m.mu.Lock()
	m.refused[limit]++
	m.mu.Unlock()
}

// GaugeFunc registers a gauge read when /metrics is scraped, for example
// cmcp_audit_queue_depth from the audit log writer. name must be a valid
// metric name and not registered before.
func (m *Registry) GaugeFunc(name, help string, f func() float64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, g := range m.gauges {
		if g.name == name {
			panic("gateway: metric " + name + " registered twice")
		}
	}
	m.gauges = append(m.gauges, gaugeFunc{name: name, help: help, typ: "gauge", f: f})
}

// CounterFunc registers a counter read when /metrics is scraped, for
// example cmcp_audit_append_errors_total from the audit log writer. f must
// never decrease. name must be a valid metric name and not registered
// before.
func (m *Registry) CounterFunc(name, help string, f func() float64) {
	m.GaugeFunc(name, help, f)
	m.mu.Lock()
	m.gauges[len(m.gauges)-1].typ = "counter"
	m.mu.Unlock()
}

// WriteText writes every metric in the Prometheus text format.
func (m *Registry) WriteText(out io.Writer) error {
	w := bufio.NewWriter(out)
	m.mu.Lock()
	calls := metricKeys(m.calls, func(a, b [3]string) int {
		return strings.Compare(a[0]+"\x00"+a[1]+"\x00"+a[2], b[0]+"\x00"+b[1]+"\x00"+b[2])
	})
	decisions := metricKeys(m.decisions, func(a, b [2]string) int { return strings.Compare(a[0]+"\x00"+a[1], b[0]+"\x00"+b[1]) })
	spawns := metricKeys(m.spawns, func(a, b [2]string) int { return strings.Compare(a[0]+"\x00"+a[1], b[0]+"\x00"+b[1]) })
	ups := metricKeys(m.up, strings.Compare)
	refused := metricKeys(m.refused, strings.Compare)
	lats := metricKeys(m.latency, strings.Compare)

	header(w, "cmcp_calls_total", "counter", "tools/call requests handled, by upstream, policy decision (none: refused before the policy was asked) and outcome.")
	for _, k := range calls {
		fmt.Fprintf(w, "cmcp_calls_total{upstream=%s,decision=%s,outcome=%s} %d\n", q(k[0]), q(k[1]), q(k[2]), m.calls[k])
	}
	header(w, "cmcp_policy_decisions_total", "counter", "Policy decisions, by decision and policy mode.")
	for _, k := range decisions {
		fmt.Fprintf(w, "cmcp_policy_decisions_total{decision=%s,mode=%s} %d\n", q(k[0]), q(k[1]), m.decisions[k])
	}
	header(w, "cmcp_call_duration_seconds", "histogram", "Latency of forwarded tools/call requests as the gateway saw them, by upstream.")
	for _, u := range lats {
		h := m.latency[u]
		var cum uint64
		for i, le := range latencyBuckets {
			cum += h.counts[i]
			fmt.Fprintf(w, "cmcp_call_duration_seconds_bucket{upstream=%s,le=%q} %d\n", q(u), formatFloat(le), cum)
		}
		cum += h.counts[len(latencyBuckets)]
		fmt.Fprintf(w, "cmcp_call_duration_seconds_bucket{upstream=%s,le=\"+Inf\"} %d\n", q(u), cum)
		fmt.Fprintf(w, "cmcp_call_duration_seconds_sum{upstream=%s} %s\n", q(u), formatFloat(h.sum))
		fmt.Fprintf(w, "cmcp_call_duration_seconds_count{upstream=%s} %d\n", q(u), h.n)
	}
	header(w, "cmcp_upstream_up", "gauge", "1 if the upstream is usable (last connect or call succeeded), 0 if not.")
	for _, u := range ups {
		v := 0
		if m.up[u] {
			v = 1
		}
		fmt.Fprintf(w, "cmcp_upstream_up{upstream=%s} %d\n", q(u), v)
	}
	header(w, "cmcp_upstream_spawns_total", "counter", "Spawn attempts of stdio upstreams, by result.")
	for _, k := range spawns {
		fmt.Fprintf(w, "cmcp_upstream_spawns_total{upstream=%s,result=%s} %d\n", q(k[0]), q(k[1]), m.spawns[k])
	}
	header(w, "cmcp_sessions_refused_total", "counter", "New agent sessions refused because a bound was reached: per_agent (server.max_sessions_per_agent) or total (server.max_sessions).")
	for _, k := range refused {
		fmt.Fprintf(w, "cmcp_sessions_refused_total{limit=%s} %d\n", q(k), m.refused[k])
	}
	gauges := slices.Clone(m.gauges)
	m.mu.Unlock()

	// Gauge functions run outside the lock: they may take locks of their own.
	for _, g := range gauges {
		header(w, g.name, g.typ, g.help)
		fmt.Fprintf(w, "%s %s\n", g.name, formatFloat(g.f()))
	}
	header(w, "cmcp_uptime_seconds", "gauge", "Seconds since the gateway started.")
	fmt.Fprintf(w, "cmcp_uptime_seconds %s\n", formatFloat(time.Since(m.start).Seconds()))
	header(w, "go_goroutines", "gauge", "Number of goroutines that currently exist.")
	fmt.Fprintf(w, "go_goroutines %d\n", runtime.NumGoroutine())
	if rss, ok := residentBytes(); ok {
		header(w, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.")
		fmt.Fprintf(w, "process_resident_memory_bytes %d\n", rss)
	}
	return w.Flush()
}

func header(w io.Writer, name, typ, help string) {
	fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
}

// q quotes a label value as the exposition format wants: backslash, double
// quote and line feed escaped.
func q(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '\\':
			b.WriteString(`\\`)
		case '"':
			b.WriteString(`\"`)
		case '\n':
			b.WriteString(`\n`)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

func formatFloat(v float64) string {
	switch {
	case math.IsInf(v, +1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

func metricKeys[K comparable, V any](m map[K]V, cmp func(a, b K) int) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, cmp)
	return keys
}

// residentBytes reads the process's resident set size from /proc.
func residentBytes() (int64, bool) {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0, false
	}
	pages, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return 0, false
	}
	return pages * int64(os.Getpagesize()), true
}
