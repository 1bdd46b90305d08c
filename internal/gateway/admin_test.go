package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/confidential-mcp/cmcp/internal/metrics"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// adminFixture is a real gateway (stdio upstream, audit log) with its admin
// listener on its own 127.0.0.1 port.
type adminFixture struct {
	h       *harness
	a       *Admin
	m       *metrics.Registry
	base    string
	readyFn func() error
}

func newAdminFixture(t *testing.T) *adminFixture {
	t.Helper()
	h := newHarness(t, hconf{tokens: []Token{{Digest: TokenDigest(testAgentToken), Identity: "agent-a"}}})
	f := &adminFixture{h: h, m: NewMetrics()}
	a, err := NewAdmin(AdminOptions{
		Addr:        "127.0.0.1:0",
		TokenDigest: digest.Bytes([]byte(testAdminToken)),
		Kill:        h.g,
		Metrics:     f.m,
		Log:         h.w,
		Ready:       func() error { return f.readyFn() },
	})
	if err != nil {
		t.Fatal(err)
	}
	f.readyFn = func() error { return nil }
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		a.Shutdown(ctx)
	})
	f.a, f.base = a, "http://"+a.Addr()
	return f
}

// do sends one admin request and returns the status and body.
func (f *adminFixture) do(t *testing.T, method, path, token, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, f.base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestAdminRequiresItsOwnToken(t *testing.T) {
	f := newAdminFixture(t)
	for _, tc := range []struct {
		name, method, path, token string
		want                      int
	}{
		{"healthz open", "GET", "/healthz", "", 200},
		{"readyz open", "GET", "/readyz", "", 200},
		{"metrics no token", "GET", "/metrics", "", 401},
		{"metrics wrong token", "GET", "/metrics", "nope", 401},
		{"metrics agent token", "GET", "/metrics", testAgentToken, 401},
		{"metrics admin token", "GET", "/metrics", testAdminToken, 200},
		{"engage agent token", "POST", "/admin/kill-switch/engage", testAgentToken, 401},
		{"checkpoint no token", "POST", "/admin/checkpoint", "", 401},
		{"status admin token", "GET", "/admin/kill-switch", testAdminToken, 200},
		{"unknown path", "GET", "/mcp", testAdminToken, 404},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := f.do(t, tc.method, tc.path, tc.token, "")
			if code != tc.want {
				t.Fatalf("%s %s: %d %s, want %d", tc.method, tc.path, code, body, tc.want)
			}
		})
	}
	if f.h.g.KillSwitch() {
		t.Fatal("an agent token engaged the kill switch")
	}
	if _, err := NewAdmin(AdminOptions{Addr: "127.0.0.1:0", Kill: f.h.g, Metrics: NewMetrics(), Log: f.h.w}); err == nil ||
		!strings.Contains(err.Error(), "token_sha256") {
		t.Fatalf("admin without a token: err = %v", err)
	}
}

func TestAdminKillSwitchFailsCallsClosed(t *testing.T) {
	f := newAdminFixture(t)
	cs := f.h.connect(testAgentToken, nil)
	if _, err := call(t, cs, "t__echo", map[string]any{"text": "before"}); err != nil {
		t.Fatalf("call before the kill switch: %v", err)
	}

	code, body := f.do(t, "POST", "/admin/kill-switch/engage", testAdminToken, `{"reason":"incident 42"}`)
	if code != 200 || !strings.Contains(body, `"changed": true`) {
		t.Fatalf("engage: %d %s", code, body)
	}
	_, err := call(t, cs, "t__echo", map[string]any{"text": "during"})
	var je *jsonrpc.Error
	if !errors.As(err, &je) || je.Code != CodeKillSwitch {
		t.Fatalf("call while engaged: err = %v, want JSON-RPC code %d", err, CodeKillSwitch)
	}
	if code, body := f.do(t, "GET", "/readyz", "", ""); code != 503 || body != "not ready\n" {
		t.Fatalf("readyz while engaged, no token: %d %q", code, body)
	}
	if code, body := f.do(t, "GET", "/readyz", testAdminToken, ""); code != 503 || !strings.Contains(body, "kill switch") {
		t.Fatalf("readyz while engaged, admin token: %d %s", code, body)
	}
	code, body = f.do(t, "GET", "/admin/kill-switch", testAdminToken, "")
	var st KillStatus
	if err := json.Unmarshal([]byte(body), &st); err != nil || code != 200 || !st.Engaged || st.Reason != "incident 42" || st.Since.IsZero() {
		t.Fatalf("status: %d %s (%v)", code, body, err)
	}
	code, body = f.do(t, "GET", "/metrics", testAdminToken, "")
	if code != 200 || !strings.Contains(body, "\ncmcp_kill_switch_engaged 1\n") {
		t.Fatalf("metrics while engaged: %d\n%s", code, body)
	}
	// Engaging twice changes nothing and writes no second record.
	if code, body := f.do(t, "POST", "/admin/kill-switch/engage", testAdminToken, ""); code != 200 || !strings.Contains(body, `"changed": false`) {
		t.Fatalf("second engage: %d %s", code, body)
	}

	code, body = f.do(t, "POST", "/admin/kill-switch/clear", testAdminToken, `{"reason":"resolved"}`)
	if code != 200 || !strings.Contains(body, `"changed": true`) {
		t.Fatalf("clear: %d %s", code, body)
	}
	if _, err := call(t, cs, "t__echo", map[string]any{"text": "after"}); err != nil {
		t.Fatalf("call after clearing: %v", err)
	}

	recs := adminRecords(t, f.h.dir)
	var got []string
	for _, r := range recs {
		got = append(got, r.Action+":"+r.Reason)
		if !strings.HasPrefix(r.Actor, "admin-token@127.0.0.1") {
			t.Errorf("actor = %q", r.Actor)
		}
	}
	if strings.Join(got, ",") != "kill_switch_on:incident 42,kill_switch_off:resolved" {
		t.Fatalf("admin records = %v", got)
	}
}

func TestAdminClearRefusedWhenAuditFails(t *testing.T) {
	f := newAdminFixture(t)
	if code, body := f.do(t, "POST", "/admin/kill-switch/engage", testAdminToken, ""); code != 200 {
		t.Fatalf("engage: %d %s", code, body)
	}
	// The audit log becomes unusable: clearing must not happen unrecorded.
	if err := f.h.w.Close(); err != nil {
		t.Fatal(err)
	}
	code, body := f.do(t, "POST", "/admin/kill-switch/clear", testAdminToken, "")
	if code != 503 || !strings.Contains(body, "stays engaged") {
		t.Fatalf("clear with a closed audit log: %d %s", code, body)
	}
	if !f.h.g.KillSwitch() {
		t.Fatal("the kill switch was cleared without an audit record")
	}
	if code, body := f.do(t, "POST", "/admin/checkpoint", testAdminToken, ""); code != 500 {
		t.Fatalf("checkpoint with a closed audit log: %d %s", code, body)
	}
}

func TestAdminForcedCheckpoint(t *testing.T) {
	f := newAdminFixture(t)
	before := string(f.h.w.LatestCheckpoint())
	code, body := f.do(t, "POST", "/admin/checkpoint", testAdminToken, `{"reason":"before maintenance"}`)
	if code != 200 {
		t.Fatalf("checkpoint: %d %s", code, body)
	}
	after := string(f.h.w.LatestCheckpoint())
	if after == "" || after == before {
		t.Fatalf("no new checkpoint: before %q after %q", before, after)
	}
	recs := adminRecords(t, f.h.dir)
	if len(recs) != 1 || recs[0].Action != AdminCheckpoint || recs[0].Reason != "before maintenance" {
		t.Fatalf("admin records = %+v", recs)
	}
	if code, body := f.do(t, "POST", "/admin/checkpoint", testAdminToken, `{"reason": 1}`); code != 400 {
		t.Fatalf("bad body: %d %s", code, body)
	}
	if code, body := f.do(t, "POST", "/admin/checkpoint", testAdminToken, `{"why":"x"}`); code != 400 || !strings.Contains(body, "reason") {
		t.Fatalf("unknown field: %d %s", code, body)
	}
	if code, body := f.do(t, "POST", "/admin/checkpoint", testAdminToken, `{"reason":"a"} {"reason":"b"}`); code != 400 || !strings.Contains(body, "after the JSON object") {
		t.Fatalf("trailing data: %d %s", code, body)
	}
}

func TestAdminReadiness(t *testing.T) {
	f := newAdminFixture(t)
	f.readyFn = func() error { return errors.New("audit log not open") }
	if code, body := f.do(t, "GET", "/readyz", testAdminToken, ""); code != 503 || !strings.Contains(body, "audit log not open") {
		t.Fatalf("readyz: %d %s", code, body)
	}
	if code, body := f.do(t, "GET", "/readyz", testAgentToken, ""); code != 503 || strings.Contains(body, "audit") {
		t.Fatalf("readyz with an agent token reveals the reason: %d %s", code, body)
	}
}

func TestStartAdminFromConfig(t *testing.T) {
	h := newHarness(t, hconf{tokens: []Token{{Digest: TokenDigest(testAgentToken), Identity: "agent-a"}}})
	a, err := StartAdmin(AdminConfig{Listen: "127.0.0.1:0", TokenSHA256: digest.Bytes([]byte(testAdminToken))}, nil, h.g, h.w, NewMetrics(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Shutdown(context.Background()) })
	f := &adminFixture{h: h, a: a, base: "http://" + a.Addr()}
	h.connect(testAgentToken, nil)
	code, body := f.do(t, "GET", "/metrics", testAdminToken, "")
	if code != 200 {
		t.Fatalf("metrics: %d %s", code, body)
	}
	s := parseExposition(t, body)
	for k, want := range map[string]float64{
		`cmcp_upstream_up{upstream="t"}`: 1,
		`cmcp_sessions`:                  1,
		`cmcp_audit_queue_depth`:         0,
		`cmcp_kill_switch_engaged`:       0,
	} {
		if got, ok := s[k]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", k, got, ok, want)
		}
	}
	if code, body := f.do(t, "GET", "/readyz", "", ""); code != 200 {
		t.Fatalf("readyz: %d %s", code, body)
	}
}

// TestAdminBearerSchemeIsCaseInsensitive: the auth scheme is matched
// case-insensitively (RFC 7235) on the admin listener, as on the MCP front;
// only the token decides.
func TestAdminBearerSchemeIsCaseInsensitive(t *testing.T) {
	f := newAdminFixture(t)
	get := func(base, path, auth string) int {
		t.Helper()
		req, err := http.NewRequest("GET", base+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", auth)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for auth, want := range map[string]int{
		"Bearer " + testAdminToken:  200,
		"bearer " + testAdminToken:  200,
		"BEARER " + testAdminToken:  200,
		"bEaReR " + testAdminToken:  200,
		"bearer  " + testAdminToken: 200, // extra white space before the token, as the MCP front accepts
		"bearer " + testAgentToken:  401,
		"Basic " + testAdminToken:   401,
		"bearer":                    401,
		"bearer ":                   401,
		testAdminToken:              401,
	} {
		if got := get(f.base, "/metrics", auth); got != want {
			t.Errorf("admin /metrics with %q: %d, want %d", auth, got, want)
		}
	}
	// The MCP front accepts the same lower-case scheme for an agent token.
	const initReq = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`
	req, _ := http.NewRequest("POST", f.h.url, strings.NewReader(initReq))
	req.Header.Set("Authorization", "bearer "+testAgentToken)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("MCP front with a lower-case scheme: %d", resp.StatusCode)
	}
}
