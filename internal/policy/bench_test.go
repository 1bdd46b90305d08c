package policy

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// bench50 writes a bundle of 50 policies of the kinds the examples use.
func bench50(b *testing.B) *Bundle {
	sch, err := os.ReadFile("testdata/attributes/schema.cedarschema")
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	var p strings.Builder
	for i := range 10 {
		fmt.Fprintf(&p, "@id(\"agent-%d\") permit (principal == Agent::\"agent-%d\", action, resource in Upstream::\"up%d\");\n", i, i, i)
		fmt.Fprintf(&p, "@id(\"group-%d\") permit (principal in Group::\"g%d\", action == Action::\"call_tool\", resource == Tool::\"up%d__t\");\n", i, i, i)
		fmt.Fprintf(&p, "@id(\"path-%d\") forbid (principal, action == Action::\"call_tool\", resource in Upstream::\"up%d\") when { context.arguments has path && !(context.arguments.path like \"/srv/%d/*\") };\n", i, i, i)
		fmt.Fprintf(&p, "@id(\"class-%d\") forbid (principal in Group::\"g%d\", action in [Action::\"call_tool\", Action::\"list_tools\"], resource) when { resource.evidence_class == \"spawn-unmeasured\" || (resource.annotations.destructiveHint && context.session.calls > %d) };\n", i, i, 100+i)
		fmt.Fprintf(&p, "@id(\"session-%d\") forbid (principal, action, resource == Tool::\"up%d__post\") when { context.session.tools_used.contains(\"up%d__read\") };\n", i, i, i)
	}
	if err := os.WriteFile(filepath.Join(dir, "schema.cedarschema"), sch, 0o644); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "p.cedar"), []byte(p.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	bu, err := Load(context.Background(), dir, LoadOptions{})
	if err != nil {
		b.Fatal(err)
	}
	if n := len(bu.PolicyIDs()); n != 50 {
		b.Fatalf("%d policies", n)
	}
	return bu
}

// allowed50 is a call bench50's bundle allows: agent-3 on up3 with
// arguments its path rule reads, in a session that used two tools.
func allowed50() Request {
	r := base()
	r.Agent, r.Groups, r.Upstream, r.Tool = "agent-3", []string{"g3", "staff"}, "up3", "up3__t"
	r.Arguments = []byte(`{"path":"/srv/3/reports/2026-11.csv","encoding":"utf-8","limit":100}`)
	r.Session.ToolsUsed = []string{"up3__t", "up1__read"}
	return r
}

// BenchmarkDecide50 is one call_tool decision against 50 policies, including
// building the entities and converting the arguments.
func BenchmarkDecide50(b *testing.B) {
	bu := bench50(b)
	r := allowed50()
	if d := bu.Decide(&r); !d.Allow {
		b.Fatalf("%+v", d)
	}
	b.ReportAllocs()
	lat := make([]time.Duration, 0, b.N)
	for b.Loop() {
		t0 := time.Now()
		bu.Decide(&r)
		lat = append(lat, time.Since(t0))
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
}

// BenchmarkDecide50Deny is a call denied by an argument rule.
func BenchmarkDecide50Deny(b *testing.B) {
	bu := bench50(b)
	r := base()
	r.Agent, r.Upstream, r.Tool = "agent-3", "up3", "up3__t"
	r.Arguments = []byte(`{"path":"/etc/passwd"}`)
	if d := bu.Decide(&r); d.Allow {
		b.Fatalf("%+v", d)
	}
	b.ReportAllocs()
	for b.Loop() {
		bu.Decide(&r)
	}
}

// BenchmarkDecide50Memo is BenchmarkDecide50's call decided again from a
// live memo (the key holds the session facts too, as it would for a bundle
// that reads them): the cost of a cache hit.
func BenchmarkDecide50Memo(b *testing.B) {
	bu := bench50(b)
	m := bu.NewMemo()
	m.max, m.maxKey = liveMemoEntries, liveMemoKey
	r := allowed50()
	if d := m.Decide(&r); !d.Allow {
		b.Fatalf("%+v", d)
	}
	b.ReportAllocs()
	for b.Loop() {
		m.Decide(&r)
	}
	if m.Hits() == 0 {
		b.Fatal("no hits")
	}
}

// BenchmarkDecideAllowList is the decision internal/bench's table makes
// for every call (examples/policy/allow-list, the agent in group ops):
// the policy's share of the floor under serve --stdio's added latency.
func BenchmarkDecideAllowList(b *testing.B) {
	bu, err := Load(context.Background(), "../../examples/policy/allow-list", LoadOptions{})
	if err != nil {
		b.Fatal(err)
	}
	r := base()
	r.Agent, r.Groups, r.Upstream, r.Tool, r.ToolName = "bench", []string{"ops"}, "echo", "echo", "echo"
	r.Arguments = []byte(`{"text":"hello"}`)
	if d := bu.Decide(&r); !d.Allow {
		b.Fatalf("not allowed: %+v", d)
	}
	for b.Loop() {
		bu.Decide(&r)
	}
}
