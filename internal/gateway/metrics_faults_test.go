package gateway

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/confidential-mcp/cmcp/internal/metrics"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// failAuditDisk makes every audit segment the gateway has open under dir
// refer to /dev/full: from now on each write fails with ENOSPC, as on a
// full disk, and the writer turns broken at its next append.
func failAuditDisk(t *testing.T, dir string) {
	t.Helper()
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Skipf("no /dev/full: %v", err)
	}
	defer full.Close()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil || !strings.HasPrefix(target, dir+string(filepath.Separator)) || !strings.HasSuffix(target, ".jsonl") {
			continue
		}
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if err := syscall.Dup2(int(full.Fd()), fd); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n == 0 {
		t.Fatalf("no open audit segment under %s", dir)
	}
}

func scrapeText(t *testing.T, m *metrics.Registry) string {
	t.Helper()
	var buf bytes.Buffer
	if err := m.WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

// callSamples is every cmcp_calls_total sample of an exposition.
func callSamples(s map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range s {
		if strings.HasPrefix(k, "cmcp_calls_total{") {
			out[k] = v
		}
	}
	return out
}

func wantSamples(t *testing.T, got, want map[string]float64, exposition string) {
	t.Helper()
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	for k, v := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected sample %s = %v", k, v)
		}
	}
	if t.Failed() {
		t.Logf("exposition:\n%s", exposition)
	}
}

// TestCallMetricsNameGatewayFaults: cmcp_calls_total counts a call under
// the fault the agent was answered. A call refused because its upstream
// cannot be started (a binary that does not match its pin, -32062) is
// outcome="upstream_unavailable", not a refusal; once the audit log cannot
// be written, every call answered -32063 counts once as
// outcome="gateway_fault", whether the kill switch, the policy, an unknown
// name or nothing stopped it first; cmcp_audit_log_healthy is 0 and
// cmcp_audit_append_errors_total counts the appends that failed, as
// /readyz says the log is broken.
func TestCallMetricsNameGatewayFaults(t *testing.T) {
	t.Run("upstream unavailable", func(t *testing.T) {
		bad := digest.Bytes([]byte("not the binary"))
		m := NewMetrics()
		h := newHarness(t, hconf{pin: &bad, decider: denyTool{"t__fail"}, metrics: m})
		cs := h.connect("", nil)
		for range 3 {
			if _, err := call(t, cs, "t__echo", map[string]any{"text": "x"}); wireCode(err) != CodeUpstreamUnavailable {
				t.Fatalf("call with a mismatched binary: %v", err)
			}
		}
		text := scrapeText(t, m)
		wantSamples(t, callSamples(parseExposition(t, text)), map[string]float64{
			`cmcp_calls_total{upstream="t",decision="allow",outcome="upstream_unavailable"}`: 3,
		}, text)
	})

	t.Run("audit log fails", func(t *testing.T) {
		m := NewMetrics()
		h := newHarness(t, hconf{decider: denyTool{"t__fail"}, metrics: m})
		a, err := StartAdmin(AdminConfig{Listen: "127.0.0.1:0", TokenSHA256: digest.Bytes([]byte(testAdminToken))}, nil, h.g, h.w, m, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Shutdown(context.Background()) })
		f := &adminFixture{h: h, a: a, base: "http://" + a.Addr()}
		cs := h.connect("", nil)
		if _, err := call(t, cs, "t__echo", map[string]any{"text": "before"}); err != nil {
			t.Fatal(err)
		}
		h.g.results.Wait()
		_, body := f.do(t, "GET", "/metrics", testAdminToken, "")
		if s := parseExposition(t, body); s["cmcp_audit_log_healthy"] != 1 || s["cmcp_audit_append_errors_total"] != 0 {
			t.Fatalf("healthy log: cmcp_audit_log_healthy %v, cmcp_audit_append_errors_total %v\n%s",
				s["cmcp_audit_log_healthy"], s["cmcp_audit_append_errors_total"], body)
		}

		failAuditDisk(t, h.dir)
		for _, name := range []string{"t__echo", "t__fail", "t__nosuchtool"} {
			if _, err := call(t, cs, name, map[string]any{"text": "x"}); wireCode(err) != CodeAuditUnavailable {
				t.Fatalf("%s with a broken log: %v, want %d", name, err, CodeAuditUnavailable)
			}
		}
		// Engaging fails closed: engaged although its record fails.
		h.g.SetKillSwitch(context.Background(), true, "test", "broken log")
		if _, err := call(t, cs, "t__echo", map[string]any{"text": "x"}); wireCode(err) != CodeAuditUnavailable {
			t.Fatalf("call while engaged with a broken log: %v, want %d", err, CodeAuditUnavailable)
		}

		code, body := f.do(t, "GET", "/metrics", testAdminToken, "")
		if code != 200 {
			t.Fatalf("metrics: %d %s", code, body)
		}
		s := parseExposition(t, body)
		wantSamples(t, callSamples(s), map[string]float64{
			`cmcp_calls_total{upstream="t",decision="allow",outcome="ok"}`:            1,
			`cmcp_calls_total{upstream="t",decision="allow",outcome="gateway_fault"}`: 1,
			`cmcp_calls_total{upstream="t",decision="deny",outcome="gateway_fault"}`:  1,
			`cmcp_calls_total{upstream="",decision="none",outcome="gateway_fault"}`:   1,
			`cmcp_calls_total{upstream="t",decision="none",outcome="gateway_fault"}`:  1,
		}, body)
		if s["cmcp_audit_log_healthy"] != 0 {
			t.Errorf("cmcp_audit_log_healthy = %v with a broken log, want 0", s["cmcp_audit_log_healthy"])
		}
		// The four calls' records and the kill switch's at least.
		if n := s["cmcp_audit_append_errors_total"]; n < 5 {
			t.Errorf("cmcp_audit_append_errors_total = %v, want at least 5", n)
		}
		if code, body := f.do(t, "GET", "/readyz", testAdminToken, ""); code != 503 || !strings.Contains(body, "audit log") {
			t.Errorf("readyz with a broken log: %d %s", code, body)
		}
	})
}
