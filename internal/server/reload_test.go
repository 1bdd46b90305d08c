package server

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/front/httpfront"
	"github.com/confidential-mcp/cmcp/internal/gateway"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// TestSIGHUPReloadsTokens runs a gateway process and changes its
// configuration under it, with a real SIGHUP each time:
//   - a token removed from server.tokens stops working at once, for new
//     sessions and for the sessions it opened (ended; their next request
//     is refused); a rotated token's old value is refused on the session it
//     opened, and the new one works; the admin token is replaced too; the
//     change is an admin record tokens_reloaded (actor SIGHUP) with counts;
//   - settings that need a restart (server.call_timeout, upstreams, audit,
//     admin.listen) are named in a warning and not applied;
//   - a configuration that does not load changes nothing, and is logged
//     and recorded (reload_rejected).
func TestSIGHUPReloadsTokens(t *testing.T) {
	exe, pin := selfDigest(t)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "cmcp.yaml")
	adminAddr := freePort(t)
	admin := "http://" + adminAddr
	const (
		aliceTok  = "alice-token-0123456789abcdef"
		bobTok    = "bob-token-0123456789abcdef"
		bobTok2   = "bob-token-rotated-0123456789"
		adminTok2 = "admin-token-rotated-012345678"
	)
	type tok struct{ id, secret string }
	write := func(toks []tok, adminTok, callTimeout, extraEnv, durability, adminListen string) {
		t.Helper()
		var b strings.Builder
		for _, tk := range toks {
			fmt.Fprintf(&b, "    - {identity: %s, sha256: %s}\n", tk.id, httpfront.TokenDigest(tk.secret))
		}
		y := fmt.Sprintf(`version: 1
server:
  listen: 127.0.0.1:0
  tee: software
  call_timeout: %s
  tokens:
%saudit: {dir: audit, durability: %s}
admin:
  listen: %s
  token_sha256: %s
upstreams:
  - name: t
    stdio: {command: %s, env: {%s: server%s}}
    pin: {command: %s}
`, callTimeout, b.String(), durability, adminListen, httpfront.TokenDigest(adminTok), exe, childEnv, extraEnv, pin)
		if err := os.WriteFile(cfgPath, []byte(y), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write([]tok{{"alice", aliceTok}, {"bob", bobTok}}, testAdminToken, "30s", "", "group", adminAddr)
	cmd, endpoint, stderr := startGatewayProcess(t, cfgPath)
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("gateway log:\n%s", clip(stderr.String(), 6000))
		}
	})
	echo := func(cs *mcp.ClientSession) error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "t__echo", Arguments: map[string]any{"text": "x"}})
		return err
	}
	open := func(token string) *mcp.ClientSession {
		t.Helper()
		cs, err := connectWith(endpoint, token)
		if err != nil {
			t.Fatalf("connect with %s: %v", token, err)
		}
		t.Cleanup(func() { cs.Close() })
		return cs
	}
	hup := func(logLine string) {
		t.Helper()
		before := strings.Count(stderr.String(), logLine)
		if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		eventually(t, 20*time.Second, func() string {
			if strings.Count(stderr.String(), logLine) > before {
				return ""
			}
			return "no " + logLine + " in the gateway log"
		})
	}
	alice, bob := open(aliceTok), open(bobTok)
	for _, cs := range []*mcp.ClientSession{alice, bob} {
		if err := echo(cs); err != nil {
			t.Fatalf("call before the reload: %v", err)
		}
	}
	if code, _ := httpDo(t, "GET", admin+"/metrics", testAdminToken); code != 200 {
		t.Fatalf("admin token before the reload: %d", code)
	}

	// Alice's token is revoked, Bob's rotated, the admin token replaced.
	write([]tok{{"bob", bobTok2}}, adminTok2, "30s", "", "group", adminAddr)
	hup("SIGHUP: tokens reloaded")
	if _, err := connectWith(endpoint, aliceTok); err == nil {
		t.Fatal("a revoked token opened a session")
	}
	if err := echo(alice); err == nil {
		t.Fatal("the revoked identity's session still calls")
	}
	if err := echo(bob); err == nil {
		t.Fatal("a session still calls with the rotated token's old value")
	}
	if err := echo(open(bobTok2)); err != nil {
		t.Fatalf("the rotated token: %v", err)
	}
	if code, _ := httpDo(t, "GET", admin+"/metrics", testAdminToken); code != http.StatusUnauthorized {
		t.Errorf("the old admin token after the reload: %d, want 401", code)
	}
	if code, _ := httpDo(t, "GET", admin+"/metrics", adminTok2); code != 200 {
		t.Errorf("the new admin token: %d, want 200", code)
	}

	// Settings that need a restart: named, not applied.
	write([]tok{{"bob", bobTok2}}, adminTok2, "45s", ", CMCP_TEST_X: y", "strict", freePort(t))
	hup("take effect only after a restart")
	log := stderr.String()
	warn := log[strings.LastIndex(log, "take effect only after a restart"):]
	warn, _, _ = strings.Cut(warn, "\n")
	for _, s := range []string{"server.call_timeout", "upstreams", "audit", "admin.listen"} {
		if !strings.Contains(warn, s) {
			t.Errorf("the restart warning does not name %s: %s", s, warn)
		}
	}
	if strings.Contains(warn, "server.tokens") {
		t.Errorf("the restart warning names the tokens, which were reloaded: %s", warn)
	}
	if code, _ := httpDo(t, "GET", admin+"/metrics", adminTok2); code != 200 {
		t.Errorf("the admin listener moved without a restart: %d", code)
	}

	// A configuration that does not load changes nothing.
	if err := os.WriteFile(cfgPath, []byte("version: 1\nserver: {tokens: [\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	hup("SIGHUP: the configuration is invalid; nothing was changed")
	if err := echo(open(bobTok2)); err != nil {
		t.Fatalf("the token in force after an invalid configuration: %v", err)
	}
	if code, _ := httpDo(t, "GET", admin+"/metrics", adminTok2); code != 200 {
		t.Errorf("the admin token after an invalid configuration: %d", code)
	}

	stopGateway(t, cmd, syscall.SIGTERM)
	auditDir := filepath.Join(dir, "audit")
	var admins []string
	for _, a := range adminRecords(t, auditDir) {
		admins = append(admins, a.Action)
		if a.Action == gateway.AdminTokensReloaded {
			if a.Actor != "SIGHUP" || !strings.Contains(a.Reason, "1 tokens for 1 identities in force (were 2 for 2)") ||
				!strings.Contains(a.Reason, "alice") || !strings.Contains(a.Reason, "admin.token_sha256") ||
				strings.Contains(a.Reason, httpfront.TokenDigest(bobTok2).String()) {
				t.Errorf("tokens_reloaded record: %+v", a)
			}
		}
	}
	if !slices.Equal(admins, []string{gateway.AdminTokensReloaded, gateway.AdminReloadRejected}) {
		t.Errorf("admin records: %v", admins)
	}
	aliceEnded := false
	for _, e := range logEntries(t, auditDir) {
		if s, ok := e.Rec.(*record.Session); ok && s.Agent == "alice" && s.Event == "end" && strings.Contains(s.Reason, "no longer has a bearer token") {
			aliceEnded = true
		}
	}
	if !aliceEnded {
		t.Error("no session end record for the revoked identity's session")
	}
}
