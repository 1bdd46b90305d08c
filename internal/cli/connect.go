package cli

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/confidential-mcp/cmcp/internal/config"
	"github.com/confidential-mcp/cmcp/internal/connect"
	"github.com/confidential-mcp/cmcp/internal/exepages"
	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/confidential-mcp/cmcp/internal/upstream"
	"github.com/confidential-mcp/cmcp/pkg/digest"
	"github.com/confidential-mcp/cmcp/pkg/evidence"
)

type connectOptions struct {
	Gateway         string
	TokenFile       string
	Name            string
	MachineID       string
	MachineName     string
	Config          string
	Pin             string
	Target          string
	TargetPin       string
	InterpreterPin  string
	AllowUnmeasured bool
	HTTP            string
	CAFile          string
	RequireAttested bool
	Reference       string
	AllowSoftware   bool
	BackoffInitial  time.Duration
	BackoffMax      time.Duration
	LogLevel        string
}

func (o *connectOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Gateway, "gateway", "", "the gateway's tunnel endpoint, https://HOST/tunnel (http:// on loopback)")
	fs.StringVar(&o.TokenFile, "token-file", "", "a file holding this machine's token for the upstream (one line)")
	fs.StringVar(&o.Name, "name", "", "the gateway's tunnel upstream this machine serves")
	fs.StringVar(&o.MachineID, "machine-id", "", "this machine's id: 1 to 64 of [A-Za-z0-9._-] (agents pick it as machineId)")
	fs.StringVar(&o.MachineName, "machine-name", "", "a name for people (default: the host name)")
	fs.StringVarP(&o.Config, "config", "c", "", "take the server and its pins from the stdio upstream --name of this cmcp.yaml")
	fs.StringVar(&o.Pin, "pin", "", "the digest the server's command file must have (cmcp spawn-digest prints it)")
	fs.StringVar(&o.Target, "target", "", "an interpreted server's script or package directory, measured too")
	fs.StringVar(&o.TargetPin, "target-pin", "", "the digest --target must have")
	fs.StringVar(&o.InterpreterPin, "interpreter-pin", "", "the digest of a \"#!\" command's interpreter")
	fs.BoolVar(&o.AllowUnmeasured, "allow-unmeasured", false, "run a server without a pin (the gateway records it as spawn-unmeasured, claimed by this connector)")
	fs.StringVar(&o.HTTP, "http", "", "serve a local HTTP MCP server at this URL instead of spawning one")
	fs.StringVar(&o.CAFile, "ca-file", "", "PEM roots to verify the gateway's TLS certificate with (default: the system's)")
	fs.BoolVar(&o.RequireAttested, "require-attested", false, "register only with a gateway whose evidence, bound to this TLS connection, verifies against --reference")
	fs.StringVar(&o.Reference, "reference", "", "reference values (JSON, as for cmcp attest verify) the gateway's evidence must match")
	fs.BoolVar(&o.AllowSoftware, "allow-software", false, "with --require-attested, accept a gateway with software evidence (development only: its code is not attested)")
	fs.DurationVar(&o.BackoffInitial, "backoff-initial", time.Second, "the first wait before reconnecting; it doubles up to --backoff-max, with jitter")
	fs.DurationVar(&o.BackoffMax, "backoff-max", time.Minute, "the longest wait before reconnecting (also the wait after a refused token)")
	fs.StringVar(&o.LogLevel, "log-level", "info", "log level on stderr: debug, info, warn or error")
}

func newConnectCmd(e *env) *cobra.Command {
	o := &connectOptions{}
	cmd := &cobra.Command{
		Use:   "connect --gateway URL --token-file FILE --name UPSTREAM --machine-id ID (-- COMMAND [ARGS...] | --http URL | -c cmcp.yaml)",
		Short: "Serve an MCP server on this machine to a gateway that cannot reach it, through an outbound tunnel",
		Long: `Serve an MCP server on this machine to a cmcp gateway through a tunnel that
this machine opens: an outbound WebSocket to the gateway's tunnel endpoint, so
the machine may sit behind NAT or a firewall.

The connector registers the machine under the gateway's tunnel upstream
--name with --machine-id and the machine token in --token-file, and serves
every gateway session opened over the tunnel with its own connection to the
server: a stdio server (the command after --, or the stdio upstream --name
of -c cmcp.yaml) is spawned per session exactly as cmcp serve spawns it:
its command (and --target, and a "#!" script's interpreter) measured and
checked against --pin (or the config's pin:) through the descriptor that is
executed, in its own process group, with bounded stderr. A local HTTP
server (--http) is dialled per session instead.

Several machines may register under one upstream with the same server;
agents pick one with the machineId argument (see docs/tunnel.md).

When the tunnel breaks the connector reconnects, waiting --backoff-initial,
doubling up to --backoff-max, with jitter, and registers again. A token the
gateway refuses is retried only after --backoff-max.

With --require-attested the connector first asks the gateway for its
evidence, bound to this TLS connection's exported keying material and a
fresh nonce, verifies it offline against --reference, and only then sends
its token: a proxy in between cannot pass the gateway's evidence on.
Software evidence is refused unless --allow-software. A gateway whose
evidence does not verify ends the connector with exit 20, 21 or 22 as for
cmcp attest verify. SIGTERM or SIGINT stops the connector and its children.`,
		Example: `  cmcp connect --gateway https://gw.example/tunnel --token-file tok --name files \
      --machine-id lab-7 --pin sha256:... -- ./mcp-server --root /data
  cmcp connect --gateway https://gw.example/tunnel --token-file tok --name files \
      --machine-id lab-7 --http http://127.0.0.1:9000/mcp
  cmcp connect ... --require-attested --reference ref.json -c cmcp.yaml`,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runConnect(cmd, e, o, args)
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

func runConnect(cmd *cobra.Command, e *env, o *connectOptions, args []string) error {
	co, err := o.options(e, args)
	if err != nil {
		return err
	}
	c, err := connect.New(co)
	if err != nil {
		return connectNewErr(err)
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// Start-up is over: its pages of the executable go back, as a
	// serving gateway's do (internal/exepages; CMCP_KEEP_EXE_PAGES=1
	// keeps them).
	if _, _, err := exepages.ReleaseFor(e.environ); err != nil {
		co.Log.Warn("the executable's start-up pages stay resident", "err", err)
	}
	if err := c.Run(ctx); err != nil {
		return connectRunErr(err)
	}
	return nil
}

// options checks the flags and turns them into the connector's options,
// reading the token, the server's spec, the CA roots and the reference
// values.
func (o *connectOptions) options(e *env, args []string) (connect.Options, error) {
	for _, f := range []struct{ flag, v string }{{"--gateway", o.Gateway}, {"--token-file", o.TokenFile}, {"--name", o.Name}, {"--machine-id", o.MachineID}} {
		if f.v == "" {
			return connect.Options{}, exitcode.Errorf(exitcode.ExitUsage, "%s is required", f.flag)
		}
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.LogLevel)); err != nil {
		return connect.Options{}, exitcode.Errorf(exitcode.ExitUsage, "--log-level %q: want debug, info, warn or error", o.LogLevel)
	}
	b, err := os.ReadFile(o.TokenFile)
	if err != nil {
		return connect.Options{}, exitcode.Errorf(exitcode.ExitIO, "--token-file: %w", err)
	}
	token, err := config.Credential(b)
	if err != nil {
		return connect.Options{}, exitcode.Errorf(exitcode.ExitConfig, "--token-file %s: %w", o.TokenFile, err)
	}
	co := connect.Options{Gateway: o.Gateway, Token: token, Upstream: o.Name, MachineID: o.MachineID, MachineName: o.MachineName,
		Environ: e.environ, HTTP: o.HTTP, RequireAttested: o.RequireAttested, AllowSoftware: o.AllowSoftware,
		InitialBackoff: o.BackoffInitial, MaxBackoff: o.BackoffMax,
		Log: slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: level}))}
	if co.Stdio, err = o.stdioSpec(args); err != nil {
		return connect.Options{}, err
	}
	if err := o.gatewayTrust(&co); err != nil {
		return connect.Options{}, err
	}
	return co, nil
}

// stdioSpec is the server to spawn per session: the command after --
// with the pin flags, or the stdio upstream --name of -c; nil for --http.
// Exactly one of the three must be given.
func (o *connectOptions) stdioSpec(args []string) (*upstream.StdioSpec, error) {
	sources := 0
	for _, set := range []bool{len(args) > 0, o.HTTP != "", o.Config != ""} {
		if set {
			sources++
		}
	}
	if sources != 1 {
		return nil, exitcode.Errorf(exitcode.ExitUsage, "give the server one way: a command after --, --http URL, or -c cmcp.yaml")
	}
	if o.Config != "" && (o.Pin != "" || o.Target != "" || o.TargetPin != "" || o.InterpreterPin != "" || o.AllowUnmeasured) {
		return nil, exitcode.Errorf(exitcode.ExitUsage, "-c takes the pins from the configuration: drop --pin, --target, --target-pin, --interpreter-pin and --allow-unmeasured")
	}
	switch {
	case len(args) > 0:
		return o.commandSpec(args)
	case o.Config != "":
		return o.configSpec()
	}
	return nil, nil
}

// commandSpec is the spec of the command after --, pinned by --pin,
// --target-pin and --interpreter-pin.
func (o *connectOptions) commandSpec(args []string) (*upstream.StdioSpec, error) {
	spec := &upstream.StdioSpec{Name: o.Name, Command: args[0], Args: args[1:], AllowUnmeasured: o.AllowUnmeasured, StopGrace: 5 * time.Second, MeasurePath: o.Target}
	for _, p := range []struct {
		flag, v string
		to      *digest.Digest
	}{{"--pin", o.Pin, &spec.Pin}, {"--target-pin", o.TargetPin, &spec.MeasurePin}, {"--interpreter-pin", o.InterpreterPin, &spec.InterpreterPin}} {
		if p.v == "" {
			continue
		}
		var err error
		if *p.to, err = digest.Parse(p.v); err != nil {
			return nil, exitcode.Errorf(exitcode.ExitUsage, "%s: %w", p.flag, err)
		}
	}
	if (o.Target == "") != (o.TargetPin == "") {
		return nil, exitcode.Errorf(exitcode.ExitUsage, "--target and --target-pin go together")
	}
	return spec, nil
}

// configSpec is the spec of the stdio upstream --name of -c cmcp.yaml,
// with the pins the configuration gives it.
func (o *connectOptions) configSpec() (*upstream.StdioSpec, error) {
	cfg, err := config.Load(o.Config)
	if err != nil {
		return nil, err
	}
	var u *config.Upstream
	for i := range cfg.Upstreams {
		if cfg.Upstreams[i].Name == o.Name {
			u = &cfg.Upstreams[i]
		}
	}
	if u == nil || u.Stdio == nil {
		return nil, exitcode.Errorf(exitcode.ExitConfig, "%s has no stdio upstream named %q", o.Config, o.Name)
	}
	spec := &upstream.StdioSpec{Name: u.Name, Command: u.Stdio.Command, Args: u.Stdio.Args, Dir: u.Stdio.Dir, Env: u.Stdio.Env, EnvAllow: u.Stdio.EnvAllow,
		Sealed: u.Stdio.Sealed, AllowUnmeasured: u.AllowUnmeasured, AllowCodeEnv: u.AllowCodeEnv, StopGrace: 5 * time.Second}
	if u.Pin != nil {
		spec.Pin, spec.MeasurePath, spec.MeasurePin, spec.InterpreterPin = u.Pin.Command, u.Pin.Target, u.Pin.TargetDigest, u.Pin.Interpreter
	}
	return spec, nil
}

// gatewayTrust sets how the connector trusts the gateway: the roots of
// --ca-file and, with --require-attested, the --reference values its
// evidence must match.
func (o *connectOptions) gatewayTrust(co *connect.Options) error {
	if o.CAFile != "" {
		pem, err := os.ReadFile(o.CAFile)
		if err != nil {
			return exitcode.Errorf(exitcode.ExitIO, "--ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return exitcode.Errorf(exitcode.ExitConfig, "--ca-file %s holds no PEM certificate", o.CAFile)
		}
		co.TLS = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	if o.Reference != "" {
		var err error
		if co.Reference, err = evidence.ReadReferenceFile(o.Reference); err != nil {
			return exitcode.Errorf(exitcode.ExitConfig, "--reference: %w", err)
		}
	}
	if o.RequireAttested && o.Reference == "" && !o.AllowSoftware {
		return exitcode.Errorf(exitcode.ExitUsage, "--require-attested needs --reference (the values the gateway's code must match)")
	}
	if !o.RequireAttested && (o.Reference != "" || o.AllowSoftware) {
		return exitcode.Errorf(exitcode.ExitUsage, "--reference and --allow-software apply only with --require-attested")
	}
	return nil
}

// connectNewErr gives an error of connect.New its exit code: a server
// that does not match its pin, or has none, is a mismatch (with a hint
// for the unpinned one); anything else a configuration error.
func connectNewErr(err error) error {
	code := exitcode.ExitConfig
	if errors.Is(err, upstream.ErrPinMismatch) || errors.Is(err, upstream.ErrUnpinned) {
		code = exitcode.ExitMismatch
	}
	ue := exitcode.WithCode(code, err).(*exitcode.Error)
	if errors.Is(err, upstream.ErrUnpinned) {
		ue.Hint("pin it: cmcp spawn-digest -- %s (then --pin), or run it unpinned with --allow-unmeasured", "COMMAND")
	}
	return ue
}

// connectRunErr gives the error that ended the connector its exit code:
// a gateway whose evidence did not verify exits as cmcp attest verify
// would; anything else with the evidence code.
func connectRunErr(err error) error {
	var ve *connect.VerifyError
	if errors.As(err, &ve) && ve.Result != nil {
		var ae *exitcode.Error
		if errors.As(attestVerifyErr(ve.Result), &ae) {
			return &exitcode.Error{Code: ae.Code, Err: err, Hints: ae.Hints}
		}
	}
	return exitcode.WithCode(exitcode.ExitEvidence, err)
}
