package gateway

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/policy"
	"github.com/confidential-mcp/cmcp/internal/upstream"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// benchGateway starts an in-process gateway (real measured stdio child,
// real audit log, real HTTP) and returns a connected session.
func benchGateway(b *testing.B, eng *policy.Engine) (*mcp.ClientSession, *Gateway) {
	exe, pin := selfDigest(b)
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	w, err := auditlog.Open(b.TempDir(), auditlog.Options{Key: key, Durability: record.DurabilityGroup})
	if err != nil {
		b.Fatal(err)
	}
	up := &upstream.Stdio{Spec: upstream.StdioSpec{Name: "t", Command: exe, Pin: pin, Env: map[string]string{childEnv: "server"}}, Environ: os.Environ(), Share: "shared"}
	g, err := New(Options{Version: "bench", Log: w, Policy: eng,
		Upstreams: []UpstreamOptions{{Upstream: up, Namespaced: true, Shared: true, Class: upstream.ClassSpawnMeasured}}})
	if err != nil {
		b.Fatal(err)
	}
	if err := g.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", g.HTTPHandler(HTTPOptions{}))
	srv := httptest.NewServer(mux)
	c := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil)
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: srv.URL + "/mcp", MaxRetries: -1}, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		cs.Close()
		srv.Close()
		g.Shutdown(context.Background())
		w.Close()
	})
	return cs, g
}

// timedDecider measures the time spent deciding.
type timedDecider struct {
	inner Decider
	total time.Duration
	n     int
	lat   []time.Duration
}

func (t *timedDecider) Decide(ctx context.Context, r DecisionRequest) (Decision, error) {
	t0 := time.Now()
	d, err := t.inner.Decide(ctx, r)
	d0 := time.Since(t0)
	t.total += d0
	t.n++
	t.lat = append(t.lat, d0)
	return d, err
}

// bundle50 is a bundle of 50 policies; the benchmark's call is permitted by
// one of them and checked against all.
func bundle50(b *testing.B) *policy.Engine {
	sch, err := os.ReadFile("../../examples/policy/schema.cedarschema")
	if err != nil {
		b.Fatal(err)
	}
	sch = []byte(strings.Replace(string(sch), "  path?: String,", "  path?: String,\n  text?: String,", 1))
	var p strings.Builder
	for i := range 10 {
		fmt.Fprintf(&p, "@id(\"agent-%d\") permit (principal == Agent::\"agent-%d\", action, resource in Upstream::\"up%d\");\n", i, i, i)
		fmt.Fprintf(&p, "@id(\"group-%d\") permit (principal in Group::\"g%d\", action == Action::\"call_tool\", resource == Tool::\"t__echo\");\n", i, i)
		fmt.Fprintf(&p, "@id(\"text-%d\") forbid (principal, action == Action::\"call_tool\", resource in Upstream::\"t\") when { context.arguments has text && context.arguments.text like \"*secret-%d*\" };\n", i, i)
		fmt.Fprintf(&p, "@id(\"class-%d\") forbid (principal in Group::\"g%d\", action, resource) when { resource.evidence_class == \"spawn-unmeasured\" || (resource.annotations.destructiveHint && context.session.calls > %d) };\n", i, i, 100000+i)
		fmt.Fprintf(&p, "@id(\"session-%d\") forbid (principal, action, resource == Tool::\"t__post%d\") when { context.session.tools_used.contains(\"t__read%d\") };\n", i, i, i)
	}
	dir := b.TempDir()
	os.WriteFile(filepath.Join(dir, "schema.cedarschema"), sch, 0o644)
	os.WriteFile(filepath.Join(dir, "p.cedar"), []byte(p.String()), 0o644)
	bu, err := policy.Load(context.Background(), dir, policy.LoadOptions{})
	if err != nil {
		b.Fatal(err)
	}
	return policy.NewEngine(bu, policy.Enforcing, map[string][]string{"g3": {AnonymousIdentity}})
}

// BenchmarkPolicyShare measures tools/call through the in-process gateway
// without a policy and with the 50-policy bundle, interleaved in the same
// run, and reports both p50s and the policy's share of the gateway's
// per-call time.
func BenchmarkPolicyShare(b *testing.B) {
	none, _ := benchGateway(b, nil)
	pol, g := benchGateway(b, bundle50(b))
	td := &timedDecider{inner: g.decider}
	g.decider = td
	args := map[string]any{"text": "quarterly report for the board"}
	run := func(cs *mcp.ClientSession, n int) []time.Duration {
		lat := make([]time.Duration, 0, n)
		for range n {
			t0 := time.Now()
			res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "t__echo", Arguments: args})
			if err != nil || res.IsError {
				b.Fatalf("call: %v", err)
			}
			lat = append(lat, time.Since(t0))
		}
		return lat
	}
	run(none, 50)
	run(pol, 50)
	var a, c []time.Duration
	b.ResetTimer()
	for b.Loop() {
		a = append(a, run(none, 100)...)
		c = append(c, run(pol, 100)...)
	}
	p50 := func(l []time.Duration) time.Duration { slices.Sort(l); return l[len(l)/2] }
	pa, pc := p50(a), p50(c)
	b.ReportMetric(float64(pa.Microseconds()), "none-p50-us")
	b.ReportMetric(float64(pc.Microseconds()), "policy50-p50-us")
	b.ReportMetric(100*float64(pc-pa)/float64(pc), "p50-diff-%")
	// The share measured inside the gateway: time in the decider (entity
	// construction, argument conversion, evaluation) over the mean call.
	var sum time.Duration
	for _, l := range c {
		sum += l
	}
	b.ReportMetric(float64(td.total.Nanoseconds())/float64(td.n)/1000, "decide-mean-us")
	b.ReportMetric(float64(p50(td.lat).Nanoseconds())/1000, "decide-p50-us")
	b.ReportMetric(100*float64(td.total)/float64(sum), "decide-share-%")
	b.ReportMetric(100*float64(p50(td.lat))/float64(pc), "decide-p50-share-%")
}
