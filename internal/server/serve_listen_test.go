package server

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/confidential-mcp/cmcp/internal/front/httpfront"
	"github.com/confidential-mcp/cmcp/internal/gateway"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// TestServeChecksListenersBeforeOpeningTheLog: an admin listener on the MCP
// endpoint's address once --listen is applied (equal, or localhost for
// 127.0.0.1), or an unauthenticated MCP endpoint off loopback, stops serve
// with exit 4 and the configuration line, before an audit epoch is opened or
// an upstream started. (--listen equal to admin.listen used to open an
// epoch, spawn the upstreams and start the admin listener, then fail with
// "bind: address already in use".)
func TestServeChecksListenersBeforeOpeningTheLog(t *testing.T) {
	exe, pin := selfDigest(t)
	adminAddr := freePort(t)
	_, port, _ := net.SplitHostPort(adminAddr)
	for _, tc := range []struct{ name, server, flag, want string }{
		{"--listen is admin.listen", "  listen: 127.0.0.1:0\n", adminAddr,
			fmt.Sprintf("cmcp.yaml:8:11: admin.listen: %s is also the MCP endpoint's address (--listen %s)", adminAddr, adminAddr)},
		{"--listen localhost is admin.listen", "", "localhost:" + port,
			fmt.Sprintf("cmcp.yaml:7:11: admin.listen: %s is also the MCP endpoint's address (--listen localhost:%s)", adminAddr, port)},
		{"server.listen off loopback without tokens", "  listen: 0.0.0.0:0\n", "",
			"cmcp.yaml:3:11: server.listen: refusing to listen on 0.0.0.0:0 without authentication"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			yaml := fmt.Sprintf("version: 1\nserver:\n%s  tee: software\naudit:\n  dir: audit\nadmin:\n  listen: %s\n  token_sha256: %s\nupstreams:\n  - name: t\n    stdio:\n      command: %s\n      env: {%s: server}\n    pin:\n      command: %s\n",
				tc.server, adminAddr, httpfront.TokenDigest(testAdminToken), exe, childEnv, pin)
			cfg, _ := loadConfigFile(t, dir, yaml)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := Serve(ctx, cfg, ServeOptions{Listen: tc.flag, Environ: os.Environ(), Logger: slog.New(slog.DiscardHandler)})
			if err == nil || !strings.Contains(err.Error(), tc.want) || exitcode.CodeOf(err) != exitcode.ExitConfig {
				t.Fatalf("serve: %v (exit %d), want exit 4 and %q", err, exitcode.CodeOf(err), tc.want)
			}
			if _, err := os.Stat(filepath.Join(dir, "audit")); !os.IsNotExist(err) {
				t.Errorf("the audit directory was created before the addresses were checked (%v)", err)
			}
		})
	}
}

// TestServeWarnsOfCleartextCredentials: bearer tokens without server.tls on
// a non-loopback address, and an admin listener (which has no TLS) on one,
// are logged as warnings at start.
func TestServeWarnsOfCleartextCredentials(t *testing.T) {
	exe, pin := selfDigest(t)
	dir := t.TempDir()
	yaml := fmt.Sprintf("version: 1\nserver:\n  listen: 0.0.0.0:0\n  tee: software\n  tokens: [{identity: a, sha256: %s}]\naudit:\n  dir: audit\nadmin:\n  listen: 0.0.0.0:0\n  token_sha256: %s\nupstreams:\n  - name: t\n    stdio:\n      command: %s\n      env: {%s: server}\n    pin:\n      command: %s\n",
		httpfront.TokenDigest(testAgentToken), httpfront.TokenDigest(testAdminToken), exe, childEnv, pin)
	cfg, _ := loadConfigFile(t, dir, yaml)
	logs := &lockedWriter{}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := Serve(ctx, cfg, ServeOptions{Environ: os.Environ(), Logger: slog.New(slog.NewTextHandler(logs, nil)),
		Started: func(string, *gateway.Gateway, *auditlog.Writer) { cancel() }})
	if err != nil {
		t.Fatal(err)
	}
	got := logs.String()
	for _, want := range []string{
		"server.listen 0.0.0.0:0 is not a loopback address and server.tls is not set: agents' bearer tokens cross the network in cleartext",
		"admin.listen 0.0.0.0:0 is not a loopback address and the admin listener has no TLS: the admin token crosses the network in cleartext",
	} {
		if !strings.Contains(got, "level=WARN msg=\""+want) {
			t.Errorf("no warning %q in the log:\n%s", want, clip(got, 4000))
		}
	}
}

// TestServeRecordsTheLoadedConfigDigest: the genesis records the digest of
// the configuration bytes that were loaded and checked, even when the file
// has changed since (serve used to read the file again, whole).
func TestServeRecordsTheLoadedConfigDigest(t *testing.T) {
	exe, pin := selfDigest(t)
	dir := t.TempDir()
	yaml := fmt.Sprintf("version: 1\nserver:\n  listen: 127.0.0.1:0\n  tee: software\naudit:\n  dir: audit\nupstreams:\n  - name: t\n    stdio:\n      command: %s\n      env: {%s: server}\n    pin:\n      command: %s\n", exe, childEnv, pin)
	cfg, path := loadConfigFile(t, dir, yaml)
	if err := os.WriteFile(path, []byte(yaml+"# changed after loading\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := Serve(ctx, cfg, ServeOptions{Environ: os.Environ(), Logger: slog.New(slog.DiscardHandler),
		Started: func(string, *gateway.Gateway, *auditlog.Writer) { cancel() }})
	if err != nil {
		t.Fatal(err)
	}
	g := kinds(readRecords(t, filepath.Join(dir, "audit")), "genesis")
	if len(g) != 1 || g[0].Body["config_digest"] != digest.Bytes([]byte(yaml)).String() {
		t.Fatalf("genesis config_digest %v, want %s (the loaded bytes)", g, digest.Bytes([]byte(yaml)))
	}
}

// TestServePortTakenWritesNoEpoch: an MCP or admin address another process
// holds stops serve with exit 6 and a hint (--listen, admin.listen) before
// the audit log is opened or an upstream started: a start that cannot serve
// leaves no epoch behind. (The listener used to be bound last, after the
// genesis record was written and the children spawned.)
func TestServePortTakenWritesNoEpoch(t *testing.T) {
	exe, pin := selfDigest(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	addr := taken.Addr().String()
	for _, tc := range []struct{ name, admin, flag, want, hint string }{
		{"--listen", "", addr, "listen on " + addr + ": ", "stop it, or serve on a free address with --listen"},
		{"admin.listen", "admin:\n  listen: " + addr + "\n  token_sha256: " + httpfront.TokenDigest(testAdminToken).String() + "\n", "127.0.0.1:0", "admin listener: ", "set admin.listen in "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			yaml := fmt.Sprintf("version: 1\nserver:\n  tee: software\naudit:\n  dir: audit\n%supstreams:\n  - name: t\n    stdio:\n      command: %s\n      env: {%s: server}\n    pin:\n      command: %s\n",
				tc.admin, exe, childEnv, pin)
			cfg, _ := loadConfigFile(t, dir, yaml)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := Serve(ctx, cfg, ServeOptions{Listen: tc.flag, Environ: os.Environ(), Logger: slog.New(slog.DiscardHandler)})
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "address already in use") || exitcode.CodeOf(err) != exitcode.ExitRuntime {
				t.Fatalf("serve: %v (exit %d), want exit 6 and %q", err, exitcode.CodeOf(err), tc.want)
			}
			if h := strings.Join(exitcode.HintsOf(err), "\n"); !strings.Contains(h, "another process is listening on "+addr) || !strings.Contains(h, tc.hint) {
				t.Errorf("hints %q, want one saying %q", h, tc.hint)
			}
			if _, err := os.Stat(filepath.Join(dir, "audit")); !os.IsNotExist(err) {
				t.Errorf("the audit directory was created by a start that could not listen (%v)", err)
			}
		})
	}
}

// TestServeAuditDirInUse: a second gateway on an audit directory that a
// running one writes stops with exit 3, saying what to do (stop the other,
// or --audit-dir).
func TestServeAuditDirInUse(t *testing.T) {
	exe, pin := selfDigest(t)
	dir := t.TempDir()
	yaml := fmt.Sprintf("version: 1\nserver:\n  listen: 127.0.0.1:0\n  tee: software\naudit:\n  dir: audit\nupstreams:\n  - name: t\n    stdio:\n      command: %s\n      env: {%s: server}\n    pin:\n      command: %s\n", exe, childEnv, pin)
	cfg, path := loadConfigFile(t, dir, yaml)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var second error
	err := Serve(ctx, cfg, ServeOptions{Environ: os.Environ(), Logger: slog.New(slog.DiscardHandler),
		Started: func(string, *gateway.Gateway, *auditlog.Writer) {
			cfg2, _ := loadConfigFile(t, t.TempDir(), yaml)
			cfg2.Path, cfg2.Audit.Dir = path, filepath.Join(dir, "audit")
			second = Serve(context.Background(), cfg2, ServeOptions{Environ: os.Environ(), Logger: slog.New(slog.DiscardHandler)})
			cancel()
		}})
	if err != nil {
		t.Fatal(err)
	}
	if second == nil || !strings.Contains(second.Error(), "is in use by another writer") || exitcode.CodeOf(second) != exitcode.ExitIO {
		t.Fatalf("second serve on the same audit directory: %v (exit %d), want exit 3, in use", second, exitcode.CodeOf(second))
	}
	if h := strings.Join(exitcode.HintsOf(second), "\n"); !strings.Contains(h, "another cmcp serve is writing to this directory: stop it first") || !strings.Contains(h, "--audit-dir DIR, or audit.dir in "+path) {
		t.Errorf("hints %q, want what to do", h)
	}
}

// TestServeSaysHowToVerifyTheSealedLog: the last line a gateway logs when
// it stops is that its log is sealed and the command that verifies it.
func TestServeSaysHowToVerifyTheSealedLog(t *testing.T) {
	exe, pin := selfDigest(t)
	dir := t.TempDir()
	yaml := fmt.Sprintf("version: 1\nserver:\n  listen: 127.0.0.1:0\n  tee: software\naudit:\n  dir: audit\nupstreams:\n  - name: t\n    stdio:\n      command: %s\n      env: {%s: server}\n    pin:\n      command: %s\n", exe, childEnv, pin)
	cfg, _ := loadConfigFile(t, dir, yaml)
	logs := &lockedWriter{}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := Serve(ctx, cfg, ServeOptions{Environ: os.Environ(), Logger: slog.New(slog.NewTextHandler(logs, nil)),
		Started: func(string, *gateway.Gateway, *auditlog.Writer) { cancel() }})
	if err != nil {
		t.Fatal(err)
	}
	got := strings.TrimSpace(logs.String())
	last := got[strings.LastIndexByte(got, '\n')+1:]
	if want := `msg="audit log sealed; verify it with: cmcp verify-chain ` + filepath.Join(dir, "audit") + `" epoch=1`; !strings.Contains(last, want) {
		t.Errorf("the gateway's last log line is %q, want %q", last, want)
	}
}
