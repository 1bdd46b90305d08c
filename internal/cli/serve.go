package cli

import (
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/confidential-mcp/cmcp/internal/config"
	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/confidential-mcp/cmcp/internal/metrics"
	"github.com/confidential-mcp/cmcp/internal/server"
)

type serveOptions struct {
	Config   string
	Stdio    bool
	Listen   string
	AuditDir string
	LogLevel string
}

func (o *serveOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVarP(&o.Config, "config", "c", "cmcp.yaml", "the gateway configuration")
	fs.BoolVar(&o.Stdio, "stdio", false, "serve one agent on stdin/stdout (the agent spawned cmcp) instead of HTTP")
	fs.StringVar(&o.Listen, "listen", "", "override server.listen (host:port)")
	fs.StringVar(&o.AuditDir, "audit-dir", "", "override audit.dir (the audit log directory), relative to the working directory (audit.dir is relative to the config file)")
	fs.StringVar(&o.LogLevel, "log-level", "info", "gateway log level on stderr: debug, info, warn or error")
}

func newServeCmd(e *env) *cobra.Command {
	o := &serveOptions{}
	cmd := &cobra.Command{
		Use:   "serve [-c cmcp.yaml] [--stdio] [--listen host:port]",
		Short: "Run the gateway: agents speak MCP to it, every call is decided and audited",
		Long:  serveLong,
		Example: `  bash scripts/quickstart.sh       # pins the sample server into .quickstart/cmcp.yaml and serves it
  cmcp serve -c .quickstart/cmcp.yaml
  cmcp serve -c cmcp.yaml --listen 127.0.0.1:9000
  cmcp serve -c cmcp.yaml --stdio      # in an MCP client's server command`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runServe(cmd, e, o)
		},
	}
	o.AddFlags(cmd.Flags())
	_ = cmd.RegisterFlagCompletionFunc("log-level", cobra.FixedCompletions([]string{"debug", "info", "warn", "error"}, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("config", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return []string{"yaml", "yml"}, cobra.ShellCompDirectiveFilterFileExt
	})
	return cmd
}

// serveLong is serve's help text.
const serveLong = `Run the cmcp gateway.

Agents connect to the Streamable HTTP endpoint /mcp (server.listen, default
127.0.0.1:8080), or, with --stdio, a local MCP client spawns cmcp and talks on
its stdin and stdout. The gateway spawns each stdio upstream itself after
checking its digest against the pin (a mismatch is refused, recorded and
reported to the agent), dials HTTP upstreams with their TLS pins, exposes
their tools as <upstream>__<tool>, and writes every tools/call to the audit
log (audit.dir) before forwarding it. The log's first record binds the
signing key to attestation evidence (server.tee; "software" is for
development and labelled unattested).

Without bearer tokens (server.tokens) or mutual TLS the gateway listens on
loopback addresses only. SIGTERM or SIGINT stops accepting, drains in-flight
calls for server.shutdown_grace, stops every child and seals the log; then
"cmcp verify-chain AUDIT_DIR" passes. Calls still running when the grace
ends are cut: cancelled upstream, answered -32068 and recorded as cut by
the shutdown, with a warning in the gateway log; the exit status is still 0,
over HTTP and over --stdio. With --stdio, EOF on stdin (the agent is done
sending) stops the gateway the same way once every request read before it
is answered on stdout; server.shutdown_grace then counts from the EOF.

With a policy: section every call is decided by that Cedar bundle (its
digest is pinned by policy.expect and recorded in the log's genesis record).
SIGHUP re-reads the configuration and switches to the bundle its policy:
section names, only if it validates and matches policy.expect; the switch,
or the refusal and its reason, is recorded, and a refused bundle leaves the
old one in force. SIGHUP also puts server.tokens and admin.token_sha256 in
force for every request from then on (recorded; an HTTP session opened,
or with a GET stream opened, with a token that no longer maps to its
identity ends), and the credential files of HTTP upstreams
(bearer_token_file, headers_from_file) are read again, a changed
credential sent with every request from then on (recorded; credentials
from environment variables are read only at start); other changed
settings are named in a warning and take effect only after a restart, and
a configuration that does not load changes nothing.

The kill switch (admin: listener) refuses every tools/call, resources/read,
resources/subscribe, prompts/get and completion/complete while it is
engaged, and is kept in AUDIT_DIR/kill-switch.json meanwhile: a gateway
restarted on that directory starts engaged, and records so, until an
operator clears it.`

// runServe loads the configuration and serves it until a signal or, with
// --stdio, the end of stdin.
func runServe(cmd *cobra.Command, e *env, o *serveOptions) error {
	cfg, err := config.Load(o.Config)
	if err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.LogLevel)); err != nil {
		return exitcode.Errorf(exitcode.ExitUsage, "--log-level %q: want debug, info, warn or error", o.LogLevel)
	}
	logger := slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: level}))
	server.TuneGC(e.environ)
	// A gateway whose log reader went away (`cmcp serve 2>&1 |
	// head`, a restarted log shipper) keeps serving: otherwise Go
	// kills a process whose write to stderr meets a closed pipe,
	// mid-call and with its audit epoch unsealed. With --stdio, a
	// closed stdout is the agent leaving, seen as a write error.
	// Notify, not Ignore: an ignored signal stays ignored in the
	// children the gateway executes; a caught one does not.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// A path argument is relative to the working directory, as
	// verify-chain's and replay's are; audit.dir in the file is
	// relative to the file (server.Serve resolves it so).
	auditDir := o.AuditDir
	if auditDir != "" {
		if auditDir, err = filepath.Abs(auditDir); err != nil {
			return exitcode.Errorf(exitcode.ExitIO, "--audit-dir %s: %w", o.AuditDir, err)
		}
	}
	so := server.ServeOptions{Stdio: o.Stdio, Listen: o.Listen, AuditDir: auditDir, Environ: e.environ, Logger: logger, Metrics: metrics.New()}
	if o.Stdio {
		so.Stdin, so.Stdout = readCloser(e.stdin), writeCloser(e.stdout)
	}
	return server.Serve(ctx, cfg, so)
}

func readCloser(r io.Reader) io.ReadCloser {
	if rc, ok := r.(io.ReadCloser); ok {
		return rc
	}
	return io.NopCloser(r)
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

func writeCloser(w io.Writer) io.WriteCloser {
	if wc, ok := w.(io.WriteCloser); ok && w != io.Writer(os.Stderr) {
		return wc
	}
	return nopWriteCloser{w}
}
