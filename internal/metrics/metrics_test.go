package metrics

import (
	"bytes"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/confidential-mcp/cmcp/internal/gwtest"
)

// The outcome labels the gateway core counts calls under
// (gateway.OutcomeOK, OutcomeRefused, OutcomeUpstreamError).
const (
	OutcomeOK            = "ok"
	OutcomeRefused       = "refused"
	OutcomeUpstreamError = "upstream_error"
)

func parseExposition(t *testing.T, text string) map[string]float64 {
	t.Helper()
	return gwtest.ParseExposition(t, text)
}

func TestMetricsExposition(t *testing.T) {
	m := New()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 100 {
				m.CallDone("fs", "allow", OutcomeOK, time.Duration(i*100+j)*time.Microsecond+time.Microsecond)
			}
		}()
	}
	wg.Wait()
	m.CallDone("fs", "deny", OutcomeRefused, 0)
	m.CallDone(`we"ird\up`+"\n", "allow", OutcomeUpstreamError, 3*time.Second)
	m.Decision("allow", "enforcing")
	m.Decision("deny", "enforcing")
	m.UpstreamHealth("fs", true)
	m.UpstreamHealth("web", false)
	m.Spawn("fs", "ok")
	depth := 7
	m.GaugeFunc("cmcp_audit_queue_depth", "Audit records waiting to be written.", func() float64 { return float64(depth) })

	var buf bytes.Buffer
	if err := m.WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	s := parseExposition(t, buf.String())
	for k, want := range map[string]float64{
		`cmcp_calls_total{upstream="fs",decision="allow",outcome="ok"}`:                        800,
		`cmcp_calls_total{upstream="fs",decision="deny",outcome="refused"}`:                    1,
		`cmcp_calls_total{upstream="we\"ird\\up\n",decision="allow",outcome="upstream_error"}`: 1,
		`cmcp_call_duration_seconds_count{upstream="fs"}`:                                      800,
		`cmcp_call_duration_seconds_bucket{upstream="fs",le="+Inf"}`:                           800,
		`cmcp_call_duration_seconds_bucket{upstream="fs",le="0.0005"}`:                         500,
		`cmcp_call_duration_seconds_bucket{upstream="we\"ird\\up\n",le="2.5"}`:                 0,
		`cmcp_call_duration_seconds_bucket{upstream="we\"ird\\up\n",le="5"}`:                   1,
		`cmcp_policy_decisions_total{decision="deny",mode="enforcing"}`:                        1,
		`cmcp_upstream_up{upstream="fs"}`:                                                      1,
		`cmcp_upstream_up{upstream="web"}`:                                                     0,
		`cmcp_upstream_spawns_total{upstream="fs",result="ok"}`:                                1,
		`cmcp_audit_queue_depth`:                                                               7,
	} {
		got, ok := s[k]
		if !ok {
			t.Errorf("missing sample %s in\n%s", k, buf.String())
			continue
		}
		if got != want {
			t.Errorf("%s = %v, want %v", k, got, want)
		}
	}
	if s["process_resident_memory_bytes"] <= 0 {
		t.Errorf("process_resident_memory_bytes missing or zero")
	}
	// Buckets are cumulative and never decrease.
	prev := -1.0
	for _, le := range latencyBuckets {
		v := s[`cmcp_call_duration_seconds_bucket{upstream="fs",le="`+formatFloat(le)+`"}`]
		if v < prev {
			t.Fatalf("bucket le=%v = %v < previous %v", le, v, prev)
		}
		prev = v
	}
}

// FuzzLabelValue checks that any upstream name, however odd, is escaped
// into a valid label value that reads back as the same string.
func FuzzLabelValue(f *testing.F) {
	for _, s := range []string{"fs", `we"ird\up` + "\n", "", "ünïcode", `\\n`, "a\"b\\c\nd"} {
		f.Add(s)
	}
	label := regexp.MustCompile(`^"((?:[^"\\\n]|\\.)*)"$`)
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return
		}
		out := q(s)
		m := label.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("q(%q) = %s is not a valid label value", s, out)
		}
		back := strings.NewReplacer(`\\`, `\`, `\"`, `"`, `\n`, "\n").Replace(m[1])
		if back != s {
			t.Fatalf("q(%q) = %s reads back as %q", s, out, back)
		}
	})
}
