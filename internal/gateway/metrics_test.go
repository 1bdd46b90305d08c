package gateway

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestKillSwitchRefusalsAreNotPolicyDenials: through a real gateway, a call
// the kill switch stops is counted as decision="none", outcome="kill_switch"
// (no policy decided it), a call refused before the policy was asked
// (unknown tool) as decision="none", outcome="refused", and only a call the
// policy denied as decision="deny"; the kill switch adds no policy decision.
func TestKillSwitchRefusalsAreNotPolicyDenials(t *testing.T) {
	m := NewMetrics()
	h := newHarness(t, hconf{decider: denyTool{"t__fail"}, metrics: m})
	cs := h.connect("", nil)
	if _, err := call(t, cs, "t__fail", nil); wireCode(err) != CodeDenied {
		t.Fatalf("denied call: %v", err)
	}
	if _, err := call(t, cs, "t__nosuchtool", nil); wireCode(err) != CodeUnknownTool {
		t.Fatalf("unknown tool: %v", err)
	}
	if err := h.g.SetKillSwitch(context.Background(), true, "test", "metrics"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := call(t, cs, "t__echo", map[string]any{"text": "x"}); wireCode(err) != CodeKillSwitch {
			t.Fatalf("call while engaged: %v", err)
		}
	}
	var buf bytes.Buffer
	if err := m.WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	s := parseExposition(t, buf.String())
	want := map[string]float64{
		`cmcp_calls_total{upstream="t",decision="none",outcome="kill_switch"}`: 2,
		`cmcp_calls_total{upstream="t",decision="deny",outcome="refused"}`:     1,
		`cmcp_calls_total{upstream="",decision="none",outcome="refused"}`:      1,
		`cmcp_policy_decisions_total{decision="deny",mode="enforcing"}`:        1,
	}
	for k, v := range want {
		if s[k] != v {
			t.Errorf("%s = %v, want %v", k, s[k], v)
		}
	}
	for k, v := range s {
		if strings.HasPrefix(k, "cmcp_calls_total{") || strings.HasPrefix(k, "cmcp_policy_decisions_total{") {
			if _, ok := want[k]; !ok {
				t.Errorf("unexpected sample %s = %v", k, v)
			}
		}
	}
	if t.Failed() {
		t.Logf("exposition:\n%s", buf.String())
	}
}
