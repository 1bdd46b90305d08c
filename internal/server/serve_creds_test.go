package server

import (
	"context"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/confidential-mcp/cmcp/internal/exitcode"
)

// TestServeChecksUpstreamFilesBeforeOpeningTheLog: an HTTP upstream's
// credential that is not there (bearer_token_env naming an unset variable,
// a missing or empty bearer_token_file, a missing headers_from_file or
// ca_file, a ca_file without a certificate) and server.tls files that do
// not load (a client_ca without a PEM certificate, a missing cert) stop
// serve with exit 4 at the setting's file:line, before the audit log is
// opened: a start that is refused leaves no sealed epoch behind. (Each
// used to fail after a new epoch was written, without a line.)
func TestServeChecksUpstreamFilesBeforeOpeningTheLog(t *testing.T) {
	exe, pin := selfDigest(t)
	const unset = "CMCP_TEST_SURELY_UNSET_TOKEN"
	for _, tc := range []struct{ name, server, http, want, hint string }{
		{"bearer_token_env unset", "", "      bearer_token_env: " + unset + "\n",
			"cmcp.yaml:10:25: upstreams[0] (remote).http.bearer_token_env: " + unset + " is not set (or is empty) in the gateway's environment", "set " + unset},
		{"bearer_token_file missing", "", "      bearer_token_file: missing.txt\n",
			"cmcp.yaml:10:26: upstreams[0] (remote).http.bearer_token_file: ", "relative to the configuration file"},
		{"bearer_token_file empty", "", "      bearer_token_file: empty.txt\n",
			"cmcp.yaml:10:26: upstreams[0] (remote).http.bearer_token_file: " + "$DIR/empty.txt is empty", "write the credential into"},
		{"headers_from_file missing", "", "      headers_from_file: {X-Key: missing.txt}\n",
			"cmcp.yaml:10:34: upstreams[0] (remote).http.headers_from_file.X-Key: ", "relative to the configuration file"},
		{"headers_from_env unset", "", "      headers_from_env: {X-Key: " + unset + "}\n",
			"cmcp.yaml:10:33: upstreams[0] (remote).http.headers_from_env.X-Key: " + unset + " is not set (or is empty) in the gateway's environment", "set " + unset},
		{"ca_file missing", "", "      ca_file: missing.pem\n",
			"cmcp.yaml:10:16: upstreams[0] (remote).http.ca_file: ", "relative to the configuration file"},
		{"ca_file without a certificate", "", "      ca_file: notpem.txt\n",
			"cmcp.yaml:10:16: upstreams[0] (remote).http.ca_file: $DIR/notpem.txt holds no PEM certificate", "PEM"},
		{"client_ca without a certificate", "  tls: {cert: server.crt, key: server.key, client_ca: notpem.txt}\n", "",
			"cmcp.yaml:4:55: server.tls.client_ca: $DIR/notpem.txt holds no PEM certificate", "PEM"},
		{"cert missing", "  tls: {cert: missing.crt, key: server.key}\n", "",
			"cmcp.yaml:4:15: server.tls.cert: open $DIR/missing.crt: no such file or directory", "create the file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			_, serverCert, _, _ := certs(t)
			writePEM(t, filepath.Join(dir, "server.crt"), "CERTIFICATE", serverCert.Certificate[0])
			key, _ := x509.MarshalPKCS8PrivateKey(serverCert.PrivateKey)
			writePEM(t, filepath.Join(dir, "server.key"), "PRIVATE KEY", key)
			os.WriteFile(filepath.Join(dir, "notpem.txt"), []byte("not a certificate\n"), 0o600)
			os.WriteFile(filepath.Join(dir, "empty.txt"), []byte("\n"), 0o600)
			ups := "  - name: remote\n    http:\n      url: https://127.0.0.1:1/mcp\n" + tc.http
			if tc.http == "" {
				ups = ""
			}
			yaml := fmt.Sprintf("version: 1\nserver:\n  tee: software\n%saudit:\n  dir: audit\nupstreams:\n%s  - name: t\n    stdio:\n      command: %s\n      env: {%s: server}\n    pin:\n      command: %s\n",
				tc.server, ups, exe, childEnv, pin)
			cfg, _ := loadConfigFile(t, dir, yaml)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := Serve(ctx, cfg, ServeOptions{Listen: "127.0.0.1:0", Environ: os.Environ(), Logger: slog.New(slog.DiscardHandler)})
			want := strings.ReplaceAll(tc.want, "$DIR", dir)
			if err == nil || !strings.Contains(err.Error(), want) || exitcode.CodeOf(err) != exitcode.ExitConfig {
				t.Fatalf("serve: %v (exit %d), want exit 4 and %q", err, exitcode.CodeOf(err), want)
			}
			if hs := strings.Join(exitcode.HintsOf(err), "\n"); !strings.Contains(hs, tc.hint) {
				t.Errorf("hints %q do not say %q", hs, tc.hint)
			}
			if _, err := os.Stat(filepath.Join(dir, "audit")); !os.IsNotExist(err) {
				t.Errorf("the audit directory was created before the upstreams' files were checked (%v)", err)
			}
		})
	}
}

// TestServeStdioDoesNotReadServerTLS: serve --stdio has no MCP listener and
// reads no server.tls file, so a missing one does not stop it; an HTTP
// upstream's files still do.
func TestServeStdioDoesNotReadServerTLS(t *testing.T) {
	dir := t.TempDir()
	cfg, _ := loadConfigFile(t, dir, "version: 1\nserver:\n  tls: {cert: missing.crt, key: missing.key}\naudit: {dir: audit}\nupstreams:\n  - name: remote\n    http: {url: 'https://127.0.0.1:1/mcp', ca_file: missing.pem}\n")
	err := checkStartFiles(cfg, nil, true)
	if err == nil || strings.Contains(err.Error(), "server.tls") || !strings.Contains(err.Error(), "cmcp.yaml:7:") || !strings.Contains(err.Error(), "http.ca_file") {
		t.Fatalf("stdio: %v; want only the ca_file, at its line", err)
	}
	if err := checkStartFiles(cfg, nil, false); err == nil || !strings.Contains(err.Error(), "server.tls.cert") || !strings.Contains(err.Error(), "server.tls.key") {
		t.Fatalf("http: %v; want server.tls's files", err)
	}
}

// TestServeRefusesAMissingStdioCommand: a stdio upstream whose command
// does not exist (a path, or a name not on the child's PATH), shared or
// per session, stops serve with exit 4 at the command's file:line before
// the audit log is opened, as a missing TLS or credential file does. (It
// used to start, log "spawn refused ... no such file" without a line and
// answer every call -32062.)
func TestServeRefusesAMissingStdioCommand(t *testing.T) {
	for _, tc := range []struct{ name, command, lifecycle string }{
		{"path, shared", "/nonexistent/cmcp-test-server", "shared"},
		{"path, per session", "/nonexistent/cmcp-test-server", "per-session"},
		{"name on PATH, per session", "cmcp-surely-no-such-command", "per-session"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			yaml := fmt.Sprintf("version: 1\nserver:\n  tee: software\naudit:\n  dir: audit\nupstreams:\n  - name: t\n    lifecycle: %s\n    allow_unmeasured: true\n    stdio:\n      command: %s\n",
				tc.lifecycle, tc.command)
			cfg, _ := loadConfigFile(t, dir, yaml)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := Serve(ctx, cfg, ServeOptions{Listen: "127.0.0.1:0", Environ: os.Environ(), Logger: slog.New(slog.DiscardHandler)})
			want := "cmcp.yaml:11:16: upstreams[0] (t).stdio.command: "
			if err == nil || !strings.Contains(err.Error(), want) || exitcode.CodeOf(err) != exitcode.ExitConfig {
				t.Fatalf("serve: %v (exit %d), want exit 4 and %q", err, exitcode.CodeOf(err), want)
			}
			if _, err := os.Stat(filepath.Join(dir, "audit")); !os.IsNotExist(err) {
				t.Errorf("the audit directory was created before the command was checked (%v)", err)
			}
		})
	}
}
