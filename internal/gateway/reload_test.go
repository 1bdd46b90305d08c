package gateway

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

	"github.com/confidential-mcp/cmcp/internal/config"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
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
			fmt.Fprintf(&b, "    - {identity: %s, sha256: %s}\n", tk.id, TokenDigest(tk.secret))
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
`, callTimeout, b.String(), durability, adminListen, TokenDigest(adminTok), exe, childEnv, extraEnv, pin)
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
		if a.Action == AdminTokensReloaded {
			if a.Actor != "SIGHUP" || !strings.Contains(a.Reason, "1 tokens for 1 identities in force (were 2 for 2)") ||
				!strings.Contains(a.Reason, "alice") || !strings.Contains(a.Reason, "admin.token_sha256") ||
				strings.Contains(a.Reason, TokenDigest(bobTok2).String()) {
				t.Errorf("tokens_reloaded record: %+v", a)
			}
		}
	}
	if !slices.Equal(admins, []string{AdminTokensReloaded, AdminReloadRejected}) {
		t.Errorf("admin records: %v", admins)
	}
	aliceEnded := false
	for _, e := range logEntries(t, auditDir) {
		if s, ok := e.Rec.(*auditlog.Session); ok && s.Agent == "alice" && s.Event == "end" && strings.Contains(s.Reason, "no longer has a bearer token") {
			aliceEnded = true
		}
	}
	if !aliceEnded {
		t.Error("no session end record for the revoked identity's session")
	}
}

// TestReloadTokensOnTheHTTPFront: in process, a session whose token is
// moved to another identity is ended (its next request fails), and a
// reload on a gateway that started without authentication (development
// mode) applies no tokens and says a restart is needed.
func TestReloadTokensOnTheHTTPFront(t *testing.T) {
	const tokA, tokB = "token-a-0123456789abcdef", "token-b-0123456789abcdef"
	initial := []Token{{Digest: TokenDigest(tokA), Identity: "alice"}}
	ts := NewTokenSet(initial)
	h := newHarness(t, hconf{tokens: initial, tokenSet: ts})
	cs := h.connect(tokA, nil)
	if _, err := call(t, cs, "t__echo", map[string]any{"text": "x"}); err != nil {
		t.Fatal(err)
	}
	started, _ := config.LoadBytes("cmcp.yaml", []byte("version: 1\n"))
	rt := &reloadTargets{started: started, tokens: ts}
	next := &config.Config{Server: &config.Server{Tokens: []config.Token{{Identity: "mallory", SHA256: TokenDigest(tokA)}, {Identity: "alice", SHA256: TokenDigest(tokB)}}}}
	var restart []string
	if err := h.g.reloadTokens(context.Background(), next, rt, &restart); err != nil || len(restart) != 0 {
		t.Fatalf("reload: %v %v", err, restart)
	}
	if _, err := call(t, cs, "t__echo", map[string]any{"text": "x"}); err == nil {
		t.Fatal("a session whose token now maps to another identity still answers")
	}
	for stop := time.Now().Add(3 * time.Second); len(h.g.sessionList()) != 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(stop) {
			t.Fatal("the session whose token moved to another identity was not ended")
		}
	}
	if _, err := call(t, h.connect(tokB, nil), "t__echo", map[string]any{"text": "x"}); err != nil {
		t.Fatalf("the identity's new token: %v", err)
	}

	// Started without authentication: tokens are not applied.
	open := NewTokenSet(nil)
	rt = &reloadTargets{started: started, tokens: open, open: true}
	if err := h.g.reloadTokens(context.Background(), next, rt, &restart); err != nil {
		t.Fatal(err)
	}
	if len(open.Load()) != 0 || len(restart) != 1 || !strings.Contains(restart[0], "server.tokens") {
		t.Fatalf("development mode: tokens %v, restart %v", open.Load(), restart)
	}
}

// TestRotatedTokenEndsItsSessions: alice rotates her token (B added, then
// A withdrawn on SIGHUP while she keeps B). The session opened with A is
// ended, so the GET stream it opened before the reload stops delivering
// the session's messages (list_changed here); the session opened with B
// goes on receiving them.
func TestRotatedTokenEndsItsSessions(t *testing.T) {
	const tokA, tokB = "token-a-0123456789abcdef", "token-b-0123456789abcdef"
	initial := []Token{{Digest: TokenDigest(tokA), Identity: "alice"}, {Digest: TokenDigest(tokB), Identity: "alice"}}
	ts := NewTokenSet(initial)
	h := newHarness(t, hconf{tokens: initial, tokenSet: ts})
	gotA, gotB := make(chan struct{}, 10), make(chan struct{}, 10)
	csA := h.connect(tokA, &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { gotA <- struct{}{} }})
	csB := h.connect(tokB, &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { gotB <- struct{}{} }})
	for _, cs := range []*mcp.ClientSession{csA, csB} {
		if _, err := call(t, cs, "t__echo", map[string]any{"text": "x"}); err != nil {
			t.Fatal(err)
		}
	}
	// Both GET streams deliver before the rotation.
	deadline := time.After(5 * time.Second)
	for a, b := false, false; !a || !b; {
		for _, s := range h.g.sessionList() {
			s.notifyToolsChanged()
		}
		select {
		case <-gotA:
			a = true
		case <-gotB:
			b = true
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			t.Fatalf("no list_changed before the rotation (A %v, B %v)", a, b)
		}
	}

	started, _ := config.LoadBytes("cmcp.yaml", []byte("version: 1\n"))
	rt := &reloadTargets{started: started, tokens: ts}
	next := &config.Config{Server: &config.Server{Tokens: []config.Token{{Identity: "alice", SHA256: TokenDigest(tokB)}}}}
	var restart []string
	if err := h.g.reloadTokens(context.Background(), next, rt, &restart); err != nil || len(restart) != 0 {
		t.Fatalf("reload: %v %v", err, restart)
	}
	for stop := time.Now().Add(3 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		ss := h.g.sessionList()
		if len(ss) == 1 && ss[0].token.Equal(TokenDigest(tokB)) {
			break
		}
		if time.Now().After(stop) {
			t.Fatalf("after the rotation %d sessions are alive; want only the one opened with the new token", len(ss))
		}
	}
	for len(gotA) > 0 {
		<-gotA
	}
	for len(gotB) > 0 {
		<-gotB
	}
	for _, s := range h.g.sessionList() {
		s.notifyToolsChanged()
	}
	select {
	case <-gotB:
	case <-time.After(3 * time.Second):
		t.Fatal("the session opened with the token still in force no longer receives its messages")
	}
	select {
	case <-gotA:
		t.Fatal("the withdrawn token's GET stream still receives messages after the rotation")
	case <-time.After(500 * time.Millisecond):
	}
	if _, err := call(t, csB, "t__echo", map[string]any{"text": "x"}); err != nil {
		t.Fatalf("the session opened with the token still in force: %v", err)
	}
}
