// Package server assembles a running gateway from its configuration: cmcp
// serve's start phases in order (settings, policy, listeners, measurement,
// upstreams, audit log, gateway, reload, admin listener), the front the
// agents reach (Streamable HTTP or stdio), SIGHUP reload and the garbage
// collector's settings. It is the only runtime package that reads
// internal/config; the gateway core, the fronts and the upstreams get plain
// option structs from here.
package server

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/confidential-mcp/cmcp/internal/admin"
	"github.com/confidential-mcp/cmcp/internal/buildinfo"
	"github.com/confidential-mcp/cmcp/internal/config"
	"github.com/confidential-mcp/cmcp/internal/contain"
	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/confidential-mcp/cmcp/internal/front/httpfront"
	"github.com/confidential-mcp/cmcp/internal/gateway"
	"github.com/confidential-mcp/cmcp/internal/killswitch"
	"github.com/confidential-mcp/cmcp/internal/metrics"
	"github.com/confidential-mcp/cmcp/internal/oauth"
	"github.com/confidential-mcp/cmcp/internal/policy"
	"github.com/confidential-mcp/cmcp/internal/sessionbounds"
	"github.com/confidential-mcp/cmcp/internal/spawnaudit"
	"github.com/confidential-mcp/cmcp/internal/tee"
	"github.com/confidential-mcp/cmcp/internal/tunnel"
	"github.com/confidential-mcp/cmcp/internal/upstream"
	"github.com/confidential-mcp/cmcp/internal/witness"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// ServeOptions are what `cmcp serve` adds to the configuration.
type ServeOptions struct {
	// Stdio serves one agent over Stdin/Stdout instead of HTTP.
	Stdio  bool
	Stdin  io.ReadCloser
	Stdout io.WriteCloser
	// Listen overrides server.listen; AuditDir overrides audit.dir (and
	// stands in for a missing audit: section). A relative AuditDir is
	// relative to the configuration file's directory, as audit.dir is;
	// the CLI makes the --audit-dir flag absolute first.
	Listen   string
	AuditDir string
	// Environ is the gateway's environment (children get an allowlist).
	Environ []string
	// Logger receives the gateway log (stderr).
	Logger *slog.Logger
	// Decider and Filter replace the policy engine that Serve builds from
	// the policy: section. With neither, every call is allowed and recorded
	// with mode "none".
	Decider      gateway.Decider
	Filter       gateway.ListFilter
	PolicyDigest digest.Digest
	PolicyMode   string
	// IdleConnTimeout closes a connection to the MCP listener that carries
	// no request for this long (0: 2 minutes). A request in progress,
	// such as a long-lived GET stream, is not idle.
	IdleConnTimeout time.Duration
	// Metrics, if set, counts calls, decisions, spawns and upstream health.
	Metrics *metrics.Registry
	// Started, if set, is called once the gateway serves, with the MCP
	// endpoint URL ("" for stdio), the gateway and the audit log writer
	// (the admin listener hooks in here).
	Started func(endpoint string, g *gateway.Gateway, w *auditlog.Writer)
}

// Serve runs the gateway described by cfg until ctx ends (SIGTERM/SIGINT in
// the CLI) or, with Stdio, until the agent disconnects. When ctx ends it
// refuses new calls, drains in-flight calls for server.shutdown_grace
// (answering them, over stdio too), stops every child, and closes the
// audit log (seal record, final checkpoint).
func Serve(ctx context.Context, cfg *config.Config, o ServeOptions) (err error) {
	s := &serve{ctx: ctx, cfg: cfg, o: o, binary: hashSelf()}
	defer func() { err = s.unwind(err) }()
	// The order matters: everything that can refuse the configuration
	// (settings, policy, listeners, files) runs before anything is opened
	// or started, so a refused start leaves no epoch and runs no child;
	// the upstreams are built before the audit log is opened, and the
	// gateway starts on the open log.
	for _, phase := range []func() error{
		s.settings,
		s.policy,
		s.checkAddresses,
		s.bindListeners,
		s.measure,
		s.buildUpstreams,
		s.openAuditLog,
		s.startGateway,
		s.startReload,
		s.startAdmin,
		s.releaseStartPages,
	} {
		if err := phase(); err != nil {
			return err
		}
	}
	if o.Stdio {
		return s.serveStdio()
	}
	return s.serveHTTP()
}

// serve is one run of Serve: what each phase leaves for the next ones.
type serve struct {
	ctx    context.Context
	cfg    *config.Config
	o      ServeOptions
	logger *slog.Logger
	// started is the file as it was read, before the overrides: SIGHUP
	// tells which of its settings changed (reload.go).
	started config.Config
	srv     *config.Server
	eng     *policy.Engine
	listen  string
	hasAuth bool
	lc      *config.ListenCheck

	ln      net.Listener // the MCP endpoint (nil with stdio)
	scheme  string
	adminLn net.Listener

	gwInfo record.GatewayInfo
	binary func() digest.Digest // the gateway's own binary's digest (hashSelf)
	prov   tee.Provider
	key    ed25519.PrivateKey
	nonce  []byte
	ups    []gateway.UpstreamOptions
	// minted records the upstream credentials the brokers mint.
	minted mintRecorder
	hub    *tunnel.Hub // the tunnel endpoint's, if any upstream is a tunnel
	// machines records the hub's machine events in the audit log.
	machines machineRecorder

	auditDir string
	w        *auditlog.Writer
	wit      *witness.Gateway // audit.log, audit.witnesses (nil without)
	rcpt     *receipter
	g        *gateway.Gateway
	hup      *reloadTargets
	grace    time.Duration

	// undo runs when Serve returns, last first; each may replace the
	// error Serve returns.
	undo []func(error) error
}

// unwind runs the undo steps, last first.
func (s *serve) unwind(err error) error {
	for i := len(s.undo) - 1; i >= 0; i-- {
		err = s.undo[i](err)
	}
	return err
}

// onReturn adds f to what Serve does when it returns.
func (s *serve) onReturn(f func()) {
	s.undo = append(s.undo, func(err error) error { f(); return err })
}

// settings applies the command line's overrides and refuses a
// configuration that could not serve (no audit log, no upstreams).
func (s *serve) settings() error {
	cfg, o := s.cfg, s.o
	s.logger = o.Logger
	if s.logger == nil {
		s.logger = slog.New(slog.DiscardHandler)
	}
	s.started = *cfg
	s.srv = cfg.Server
	if s.srv == nil {
		s.srv = &config.Server{}
	}
	if o.AuditDir != "" {
		a := config.Audit{Dir: o.AuditDir}
		if cfg.Audit != nil {
			a = *cfg.Audit
			a.Dir = o.AuditDir
		}
		cfg.Audit = &a
	}
	if cfg.Audit == nil {
		return exitcode.Errorf(exitcode.ExitConfig, "%s: no audit: section: the gateway never runs calls unrecorded", cfg.Path).
			Hint("add an audit: section with dir: audit/, or pass --audit-dir DIR")
	}
	return nil
}

// policy starts the policy engine of the policy: section, unless the
// caller brought its own decider.
func (s *serve) policy() error {
	if s.o.Decider == nil {
		eng, err := PolicyFromConfig(s.ctx, s.cfg, s.logger)
		if err != nil {
			return err
		}
		if eng != nil {
			s.o.PolicyDigest, s.o.PolicyMode = eng.Bundle().Digest(), string(eng.Mode())
		}
		s.eng = eng
	}
	if len(s.cfg.Upstreams) == 0 {
		return exitcode.Errorf(exitcode.ExitConfig, "%s: no upstreams: the gateway has nothing to serve", s.cfg.Path).Hint("add an upstream; see examples/cmcp.yaml")
	}
	return nil
}

// checkAddresses checks the addresses, after --listen, and the files and
// environment variables serve reads at start, before anything is opened
// or started.
func (s *serve) checkAddresses() error {
	cfg, o, srvCfg := s.cfg, s.o, s.srv
	s.listen = o.Listen
	if s.listen == "" {
		s.listen = srvCfg.ListenOrDefault()
	}
	s.hasAuth = len(srvCfg.Tokens) > 0 || (srvCfg.TLS != nil && srvCfg.TLS.ClientCA != "")
	// An unauthenticated MCP endpoint off loopback, or an admin listener
	// on the MCP endpoint's address, is a configuration error that names
	// its line (config.CheckListeners).
	lc, err := cfg.CheckListeners(o.Listen, o.Stdio)
	if err != nil {
		return err
	}
	s.lc = lc
	for _, w := range lc.Warnings {
		s.logger.Warn(w)
	}
	// The files and environment variables serve reads at start (TLS
	// certificates, upstream CA files and credentials): a start refused
	// for one of them leaves no epoch, and the error names the setting's
	// line.
	return checkStartFiles(cfg, o.Environ, o.Stdio)
}

// bindListeners binds the MCP endpoint and the admin listener, still
// before the audit log is opened and the upstreams started: a start that
// cannot serve (the port is taken) leaves no epoch and runs no child.
// Connections that arrive meanwhile wait in the backlog until the gateway
// serves.
func (s *serve) bindListeners() error {
	cfg, srvCfg := s.cfg, s.srv
	var err error
	s.scheme = "http"
	if !s.o.Stdio {
		if s.ln, err = listenMCP(s.lc.MCP, s.listen, s.hasAuth); err != nil {
			return err
		}
		ln := s.ln
		s.onReturn(func() { ln.Close() }) // closed already when the server was started
		if srvCfg.TLS != nil {
			tc, err := serverTLS(cfg, srvCfg.TLS)
			if err != nil {
				return exitcode.WithCode(exitcode.ExitConfig, err)
			}
			s.ln = tls.NewListener(s.ln, tc)
			s.scheme = "https"
		}
	}
	if cfg.Admin != nil {
		if s.adminLn, err = net.Listen("tcp", cfg.Admin.Listen); err != nil {
			e := exitcode.Errorf(exitcode.ExitRuntime, "admin listener: %w", err)
			if errors.Is(err, syscall.EADDRINUSE) {
				e.Hint("another process is listening on %s (another cmcp serve?): stop it, or set admin.listen in %s to a free address", cfg.Admin.Listen, cfg.Path)
			}
			return e
		}
		adminLn := s.adminLn
		s.onReturn(func() { adminLn.Close() }) // closed already when the admin listener was shut down
	}
	return nil
}

// hashSelf starts hashing the gateway's own binary (tens of megabytes:
// tens of milliseconds) while the configuration and the policy are read
// and checked; the function it returns waits for the digest (zero if the
// binary cannot be read).
func hashSelf() func() digest.Digest {
	done := make(chan digest.Digest, 1)
	go func() {
		var d digest.Digest
		if exe, err := os.Executable(); err == nil {
			if f, fd, err := digest.OpenFile(exe); err == nil {
				f.Close()
				d = fd
			}
		}
		done <- d
	}()
	return sync.OnceValue(func() digest.Digest { return <-done })
}

// measure measures the gateway's own binary, finds the attestation
// provider and makes the epoch's key.
func (s *serve) measure() error {
	srvCfg := s.srv
	s.gwInfo = record.GatewayInfo{Version: buildinfo.Get().Version, Commit: buildinfo.Get().Commit, Binary: s.binary()}
	// server.tee unset: hardware if there is any, else the software
	// provider, loudly. "auto" insists on hardware.
	teeName := srvCfg.TEE
	if teeName == "" {
		teeName = tee.Auto
	}
	prov, err := tee.Detect(tee.Options{Provider: teeName})
	var nohw *tee.NoHardwareError
	if err != nil && srvCfg.TEE == "" && errors.As(err, &nohw) {
		s.logger.Warn("no SEV-SNP or TDX attestation interface found; using the software provider (set server.tee: auto to require hardware)", "probed", nohw.Error())
		prov, err = tee.Detect(tee.Options{Provider: tee.Software})
	}
	if err != nil {
		return exitcode.WithCode(exitcode.ExitRuntime, fmt.Errorf("attestation: %w", err))
	}
	s.prov = prov
	s.gwInfo.Platform = prov.Platform()
	if prov.Platform() == tee.Software {
		s.logger.Warn("running on the software provider: the audit log's key is NOT bound to hardware attestation (development only)")
	}
	if _, s.key, err = ed25519.GenerateKey(rand.Reader); err != nil {
		return err
	}
	s.nonce = make([]byte, 32)
	if _, err := rand.Read(s.nonce); err != nil {
		return err
	}
	return nil
}

// buildUpstreams builds the upstreams before the audit log is opened, so
// that a configuration they refuse leaves no epoch; stdio upstreams get
// the log's hooks once it is open.
func (s *serve) buildUpstreams() error {
	ups, err := buildUpstreams(s.cfg, s.srv, s.o.Environ, &s.minted)
	if err != nil {
		return err
	}
	hub, tuns, err := s.tunnelHub()
	if err != nil {
		return exitcode.WithCode(exitcode.ExitConfig, err)
	}
	s.hub = hub
	for i, u := range s.cfg.Upstreams {
		if t := tuns[u.Name]; t != nil {
			ups[i].Upstream, ups[i].Transport, ups[i].Class = t, "tunnel", upstream.ClassTunnel
		}
	}
	s.ups = ups
	// A stdio command that is not there is refused at its line before the
	// log opens, shared or per session, like a missing credential file.
	byName := map[string]*upstream.Stdio{}
	for _, u := range ups {
		if st, ok := u.Upstream.(*upstream.Stdio); ok {
			byName[st.Name()] = st
		}
	}
	if err := s.cfg.CheckCommands(func(u *config.Upstream) error {
		if st := byName[u.Name]; st != nil {
			_, err := st.ResolveCommand()
			return err
		}
		return nil
	}); err != nil {
		return exitcode.WithCode(exitcode.ExitConfig, err)
	}
	return nil
}

// openAuditLog opens the epoch (genesis record: the gateway, the
// configuration, policy and catalog digests, the attestation), and seals
// it when Serve returns.
func (s *serve) openAuditLog() error {
	cfg, o, logger := s.cfg, s.o, s.logger
	durability := cfg.Audit.Durability
	if durability == "" {
		durability = record.DurabilityGroup
	}
	auditDir := cfg.Resolve(cfg.Audit.Dir)
	s.auditDir = auditDir
	if err := os.MkdirAll(auditDir, 0o700); err != nil {
		return exitcode.Errorf(exitcode.ExitIO, "audit log directory: %w", err)
	}
	prov, nonce, ctx := s.prov, s.nonce, s.ctx
	// The log identity and the witnesses (pkg/auditlog FORMAT.md section
	// 11): the witness client stops after the log is closed, once the
	// witnesses cosigned its final checkpoint (a few seconds at most).
	var logID *auditlog.LogIdentity
	if l := cfg.Audit.Log; l != nil {
		var ws []witness.Witness
		for _, w := range cfg.Audit.Witnesses {
			ws = append(ws, witness.Witness{Name: w.Name, URL: w.URL, Key: w.Key})
		}
		wit, err := witness.NewGateway(l.Origin, cfg.Resolve(l.KeyFile), ws, auditDir, logger)
		if err != nil {
			return exitcode.WithCode(exitcode.ExitConfig, err)
		}
		s.wit = wit
		logID = wit.Identity
		s.undo = append(s.undo, func(err error) error {
			if werr := wit.Close(5 * time.Second); werr != nil {
				logger.Warn("the witnesses did not all cosign the final checkpoint before the gateway stopped; they will at its next start", "err", werr)
			}
			return err
		})
	}
	w, err := auditlog.Open(auditDir, auditlog.Options{
		Log:        logID,
		Key:        s.key,
		Durability: durability,
		Gateway:    s.gwInfo,
		// The digest of the bytes that were loaded and checked, not of
		// the file as it is now.
		ConfigDigest:  cfg.Digest,
		PolicyDigest:  o.PolicyDigest,
		PolicyMode:    o.PolicyMode,
		CatalogDigest: configCatalogDigest(cfg),
		Recipients:    cfg.Audit.Recipients,
		Vault:         cfg.Audit.Vault,
		Evidence: func(statement digest.Digest, pub ed25519.PublicKey) (json.RawMessage, error) {
			b, err := prov.Attest(ctx, pub, nonce, statement)
			if err != nil {
				return nil, err
			}
			return b.Marshal()
		},
	})
	if err != nil {
		// A log damaged where recovery may not cut (before its last
		// checkpoint) is an integrity finding: verify-chain's exit code.
		code := exitcode.ExitIO
		var ve *record.VerifyError
		if errors.As(err, &ve) && ve.IsVerification() {
			code = exitcode.LogFailureCode(string(ve.Class))
		}
		e := exitcode.Errorf(code, "open audit log in %s: %w", auditDir, err)
		if errors.Is(err, auditlog.ErrInUse) {
			e.Hint("another cmcp serve is writing to this directory: stop it first (it seals its log), or give this gateway its own audit directory (--audit-dir DIR, or audit.dir in %s)", cfg.Path)
		}
		return e
	}
	s.w = w
	epoch, epochDir := w.Epoch()
	s.undo = append(s.undo, func(err error) error {
		if cerr := w.Close(); cerr != nil {
			if err == nil {
				err = exitcode.Errorf(exitcode.ExitIO, "close audit log: %w", cerr)
			}
			return err
		}
		// The last line of a gateway that stops: what to do next.
		logger.Info("audit log sealed; verify it with: cmcp verify-chain "+auditDir, "epoch", epoch)
		return err
	})
	logger.Info("audit log open", "dir", epochDir, "epoch", epoch, "durability", durability, "platform", s.gwInfo.Platform, "key", w.VerifierKey())
	if wit := s.wit; wit != nil {
		if err := wit.Attach(w); err != nil {
			return exitcode.WithCode(exitcode.ExitRuntime, err)
		}
		logger.Info("log identity", "origin", cfg.Audit.Log.Origin, "log_key", w.LogVerifierKey(), "witnesses", len(cfg.Audit.Witnesses))
	}
	out := ""
	if rc := cfg.Audit.Receipts; rc != nil {
		out = cfg.Resolve(rc.Dir)
	}
	s.rcpt = newReceipter(w, s.wit, auditDir, out, logger)
	// The receipts of the sessions that ended are written before the log
	// closes (undo runs last first).
	s.undo = append(s.undo, func(err error) error { s.rcpt.stop(); return err })
	if rec := w.Recovery(); rec != nil {
		logger.Warn("recovered the previous epoch, which did not end as the gateway closes one (it crashed or was killed, or bytes were added after its seal); a recovery record in this epoch says what was kept and cut, and the records kept after its last checkpoint stay unsigned (verify-chain lists them)",
			"epoch", rec.Epoch, "records_kept", rec.Records, "unsealed_kept", rec.Unsealed, "cut_file", rec.File, "cut_bytes", rec.DroppedBytes, "saved_as", rec.SavedAs, "reason", rec.Reason)
	}
	return nil
}

// startGateway builds the gateway on the open log and starts its
// upstreams.
func (s *serve) startGateway() error {
	o, srvCfg, logger, w := s.o, s.srv, s.logger, s.w
	// Before the first child: what its descendants can and cannot leave.
	ci := contain.Setup()
	if ci.Mode == contain.ModeNone {
		logger.Warn("the upstream children's descendants are not contained: one that leaves its process group (setsid) can outlive its child and the gateway", "containment", ci.String())
	} else {
		logger.Info("upstream children contained", "containment", ci.String())
	}
	s.undo = append(s.undo, func(err error) error {
		contain.KillOrphans(nil) // every child is stopped by now
		return err
	})
	for _, u := range s.ups {
		if st, ok := u.Upstream.(*upstream.Stdio); ok {
			st.Hooks = spawnaudit.Hooks(w, logger, coreMetrics(o.Metrics))
		}
	}
	s.minted.log.Store(w)
	s.machines.log.Store(w)
	s.minted.logger.Store(logger)
	g, err := gateway.New(gateway.Options{Version: s.gwInfo.Version, Upstreams: s.ups, Log: w, Decider: o.Decider, Filter: o.Filter, Policy: s.eng, Logger: logger,
		CallTimeout: srvCfg.CallTimeout, ConnectTimeout: srvCfg.ConnectTimeout, Environ: o.Environ, Metrics: coreMetrics(o.Metrics),
		KillSwitchFile: filepath.Join(s.auditDir, killswitch.StateFile), OnSessionEnd: s.sessionEnded()})
	if err != nil {
		return exitcode.WithCode(exitcode.ExitConfig, err)
	}
	s.minted.gw.Store(g)
	if err := g.Start(s.ctx); err != nil {
		return exitcode.WithCode(exitcode.ExitRuntime, err)
	}
	s.g = g
	s.watchTunnels(g)
	for _, u := range g.Upstreams() {
		if u.Available {
			logger.Info("upstream ready", "upstream", u.Name, "class", u.EvidenceClass, "tools", u.Tools)
		} else {
			logger.Error("upstream unavailable; its calls are refused until it can be started", "upstream", u.Name, "reason", u.Error)
		}
	}
	s.grace = srvCfg.ShutdownGrace
	if s.grace <= 0 {
		s.grace = 10 * time.Second
	}
	return nil
}

// startReload reloads the configuration on SIGHUP (reload.go) until Serve
// returns.
func (s *serve) startReload() error {
	srvCfg := s.srv
	s.hup = &reloadTargets{started: &s.started, ups: s.ups}
	s.hup.Open = len(srvCfg.Tokens) == 0 && (srvCfg.TLS == nil || srvCfg.TLS.ClientCA == "")
	if !s.o.Stdio {
		s.hup.Tokens = httpfront.NewTokenSet(tokens(srvCfg))
	}
	s.onReturn(reloadOnSIGHUP(s.ctx, s.g, s.cfg.Path, s.hup, s.logger))
	return nil
}

// sessionEnded is the gateway's OnSessionEnd: with audit.receipts, each
// session that ends gets its receipt.
func (s *serve) sessionEnded() func(string) {
	if s.cfg.Audit.Receipts == nil {
		return nil
	}
	return s.rcpt.ended
}

// shutdownBy drains the gateway until deadline, then cuts what runs.
func (s *serve) shutdownBy(deadline time.Time) error {
	sctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	return s.g.Shutdown(sctx)
}

// shutdown drains the gateway for server.shutdown_grace.
func (s *serve) shutdown() error { return s.shutdownBy(time.Now().Add(s.grace)) }

// coreMetrics is m as the gateway core counts into it: nil (not a nil
// *metrics.Registry in the interface) when there are no metrics.
func coreMetrics(m *metrics.Registry) gateway.Metrics {
	if m == nil {
		return nil
	}
	return m
}

// startAdmin starts the operators' listener (its own address and token),
// and shuts it down when Serve returns.
func (s *serve) startAdmin() error {
	c := s.cfg.Admin
	if c == nil {
		return nil
	}
	m := s.o.Metrics
	if m == nil {
		m = metrics.New() // what admin.Start would make: the witness gauges go there too
	}
	s.wit.RegisterMetrics(m)
	adm, err := admin.Start(admin.Config{Listen: c.Listen, TokenSHA256: c.TokenSHA256, Ready: s.wit.Ready, Receipt: s.rcpt.serve,
		Notes: s.tunnelNotes, Routes: s.tunnelRoutes()}, s.adminLn, s.g, s.w, m, s.logger)
	if err != nil {
		s.shutdown()
		return exitcode.WithCode(exitcode.ExitRuntime, err)
	}
	s.hup.Admin.Store(adm)
	s.onReturn(func() {
		actx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		adm.Shutdown(actx)
	})
	return nil
}

// serveStdio serves one agent over stdin and stdout until it is done or
// ctx ends.
//
// A signal drains, as on HTTP: new calls are refused (-32068, recorded)
// while the calls in flight finish and are answered over the agent's
// connection, which stays open until they are, or until shutdown_grace is
// over: then the calls still running are cut and answered -32068
// (Shutdown), and only then does the session end. The agent closing its
// end of stdin (EOF) means it is done sending, not that it stopped
// reading: every request it sent before is handled and answered as usual,
// and the session ends once they are (the transport waits for them), or
// at shutdown_grace after the EOF, when the calls still running are cut as
// on a signal.
func (s *serve) serveStdio() error {
	o, g := s.o, s.g
	if o.Started != nil {
		o.Started("", g, s.w)
	}
	session, endSession := context.WithCancel(context.Background())
	defer endSession()
	inputEnded := make(chan struct{})
	stop := make(chan stdioStopped, 1)
	go s.stopStdio(session, endSession, inputEnded, stop)
	serr := g.ServeStdioNotify(session, o.Stdin, o.Stdout, s.srv.StdioIdentity, sync.OnceFunc(func() { close(inputEnded) }))
	endSession()
	st := <-stop
	if !st.ran {
		st.err = s.shutdown()
	}
	return errors.Join(serr, st.err)
}

// stdioStopped is how a stdio session's stop went.
type stdioStopped struct {
	ran bool // the signal's (or the EOF's) shutdown ran
	err error
}

// stopStdio waits for a signal, the end of the agent's input or the end of
// the session, and drains the gateway as serveStdio says.
func (s *serve) stopStdio(session context.Context, endSession func(), inputEnded <-chan struct{}, stop chan<- stdioStopped) {
	ctx, logger, grace := s.ctx, s.logger, s.grace
	var deadline time.Time
	select {
	case <-ctx.Done():
		deadline = time.Now().Add(grace)
		logger.Info("shutting down: draining in-flight calls", "grace", grace)
	case <-inputEnded:
		deadline = time.Now().Add(grace)
		logger.Info("the agent closed stdin: answering the requests it sent, then stopping", "grace", grace)
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-session.Done(): // all answered: the session ended
			stop <- stdioStopped{}
			return
		case <-ctx.Done():
			logger.Info("shutting down: draining in-flight calls", "grace", time.Until(deadline).Round(time.Millisecond))
		case <-t.C:
		}
	case <-session.Done():
		stop <- stdioStopped{}
		return
	}
	err := s.shutdownBy(deadline)
	endSession()
	stop <- stdioStopped{ran: true, err: err}
}

// serveHTTP serves the agents over Streamable HTTP until ctx ends, then
// drains.
func (s *serve) serveHTTP() error {
	o, g, srvCfg, logger := s.o, s.g, s.srv, s.logger
	mux := http.NewServeMux()
	ov, err := s.oauthVerifier(mux)
	if err != nil {
		return err
	}
	mux.Handle("/mcp", httpfront.New(g.HTTPCore(), httpfront.Options{Tokens: tokens(srvCfg), TokenSet: s.hup.Tokens, OAuth: ov, ClientCerts: srvCfg.TLS != nil && srvCfg.TLS.ClientCA != "",
		SessionTimeout: srvCfg.SessionTimeout, MaxRequestBytes: srvCfg.MaxRequestBytes, MaxSessions: srvCfg.MaxSessions, MaxSessionsPerAgent: srvCfg.MaxSessionsPerAgent}))
	if err := loginHandlers(mux, s.ups); err != nil {
		return exitcode.WithCode(exitcode.ExitConfig, err)
	}
	if s.hub != nil {
		mux.Handle(config.TunnelPath, s.hub)
	}
	maxSessions, _ := srvCfg.SessionBounds()
	sessionbounds.WarnFileLimit(logger, maxSessions, perSessionStdio(s.cfg))
	// Requests other than the long-lived GET streams are counted, so that
	// shutdown waits for them (their responses included) and not for idle
	// notification streams.
	var posts atomic.Int64
	counted := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			posts.Add(1)
			defer posts.Add(-1)
		}
		mux.ServeHTTP(w, r)
	})
	// No ReadTimeout or WriteTimeout: they would cut the long-lived GET
	// streams and long calls. A POST's body has its own deadline
	// (HTTPOptions.BodyTimeout), and so has writing its response when it
	// makes no progress (HTTPOptions.WriteStallTimeout: call_timeout); a connection between requests is closed
	// after IdleTimeout, so that a client, authenticated or not, cannot
	// keep connections (file descriptors) open for ever.
	idle := o.IdleConnTimeout
	if idle <= 0 {
		idle = 2 * time.Minute
	}
	hs := &http.Server{Handler: counted, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: idle, ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)}
	endpoint := fmt.Sprintf("%s://%s/mcp", s.scheme, s.ln.Addr())
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(s.ln) }()
	logger.Info("serving MCP", "endpoint", endpoint, "auth", authMode(srvCfg))
	if o.Started != nil {
		o.Started(endpoint, g, s.w)
	}
	select {
	case <-s.ctx.Done():
	case err := <-errc:
		s.shutdown()
		return exitcode.Errorf(exitcode.ExitRuntime, "serve %s: %w", endpoint, err)
	}
	return s.drainHTTP(hs, &posts)
}

// drainHTTP stops the HTTP front. One deadline for the whole drain: the
// requests in progress (their responses included) have shutdown_grace;
// then Shutdown, on the same deadline, cuts the calls still running, which
// are answered -32068 on their own requests before the sessions end; only
// then are the connections closed.
func (s *serve) drainHTTP(hs *http.Server, posts *atomic.Int64) error {
	s.logger.Info("shutting down: draining in-flight calls", "grace", s.grace)
	sctx, cancel := context.WithTimeout(context.Background(), s.grace)
	defer cancel()
	s.g.BeginDrain()
	go hs.Shutdown(sctx) // stop accepting; idle connections close
	waited := false
	for posts.Load() > 0 && sctx.Err() == nil {
		waited = true
		time.Sleep(20 * time.Millisecond)
	}
	if n := posts.Load(); n > 0 {
		s.logger.Warn("shutdown grace over with requests still in flight; cutting them", "requests", n)
	} else if waited {
		// The answers of the requests waited for are written, but each
		// agent reads its own on its own connection; ending the sessions
		// now would close their notification streams, which a client may
		// see first and fail the call it was about to read (the gateway's
		// drain lingers the same way after calls it waited for itself).
		select {
		case <-time.After(gateway.ShutdownLinger):
		case <-sctx.Done():
		}
	}
	err := s.g.Shutdown(sctx)
	hs.Close() // the remaining notification streams, and idle connections
	return err
}

// CheckListen refuses to listen on a non-loopback address without any
// authentication configured. A host name counts as loopback only if it
// resolves to a loopback address (as net.Listen resolves it); serve checks
// the address it bound too.
func CheckListen(addr string, authenticated bool) error {
	if authenticated {
		return nil
	}
	a, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen address %q: %w", addr, err)
	}
	if !config.IsLoopbackListener(a) {
		return fmt.Errorf("refusing to listen on %s without authentication: configure bearer tokens (or mutual TLS) for the MCP endpoint, or listen on a loopback address such as 127.0.0.1", addr)
	}
	return nil
}

// listenMCP binds the MCP endpoint's address, as checked, and checks what
// was bound: without authentication, only a loopback address will do.
// listen is the address as given (server.listen or --listen).
func listenMCP(addr *net.TCPAddr, listen string, hasAuth bool) (net.Listener, error) {
	ln, err := net.ListenTCP("tcp", addr)
	if err != nil {
		e := exitcode.Errorf(exitcode.ExitRuntime, "listen on %s: %w", listen, err)
		if errors.Is(err, syscall.EADDRINUSE) {
			e.Hint("another process is listening on %s (another cmcp serve?): stop it, or serve on a free address with --listen, e.g. --listen 127.0.0.1:9000", listen)
		}
		return nil, e
	}
	if err := CheckListen(ln.Addr().String(), hasAuth); err != nil {
		ln.Close()
		return nil, exitcode.WithCode(exitcode.ExitConfig, fmt.Errorf("%s: %w", listen, err))
	}
	return httpfront.LowWatermarkListener(ln), nil
}

func tokens(s *config.Server) []httpfront.Token {
	out := make([]httpfront.Token, 0, len(s.Tokens))
	for _, t := range s.Tokens {
		out = append(out, httpfront.Token{Digest: t.SHA256, Identity: t.Identity})
	}
	return out
}

// oauthVerifier makes the OAuth verifier of server.oauth (nil without it)
// and serves its Protected Resource Metadata on mux. The issuer's keys are
// fetched in the background: until they are, OAuth tokens are answered
// 503, and a mistake (an issuer whose metadata names another, no JWKS) is
// logged now rather than at the first agent's request.
func (s *serve) oauthVerifier(mux *http.ServeMux) (*oauth.Verifier, error) {
	o := s.srv.OAuth
	if o == nil {
		return nil, nil
	}
	v, err := oauth.New(oauthConfig(o))
	if err != nil {
		return nil, fmt.Errorf("server.oauth: %w", err)
	}
	for _, p := range v.MetadataPaths() {
		mux.Handle(p, v.MetadataHandler())
	}
	if u, err := url.Parse(o.Resource); err == nil && strings.TrimSuffix(u.Path, "/") != "/mcp" {
		s.logger.Warn("server.oauth.resource's path is not /mcp, where this gateway serves MCP: agents reach it there only through a proxy that maps the path", "resource", o.Resource)
	}
	go func() {
		ctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
		defer cancel()
		if err := v.Prefetch(ctx); err != nil && s.ctx.Err() == nil {
			s.logger.Warn("server.oauth: the authorization server's keys could not be fetched; OAuth tokens are answered 503 until they can", "issuer", o.Issuer, "err", err)
		}
	}()
	return v, nil
}

// oauthConfig is the verifier's configuration of server.oauth.
func oauthConfig(o *config.OAuth) oauth.Config {
	return oauth.Config{
		Issuer:        o.Issuer,
		Resource:      o.Resource,
		IdentityClaim: o.IdentityClaimOrDefault(),
		GroupsClaim:   o.GroupsClaim,
		Scopes:        slices.Clone(o.Scopes),
		JWKSURI:       o.JWKSURI,
		Algorithms:    o.AlgorithmsOrDefault(),
		ClockSkew:     o.ClockSkewOrDefault(),
		RefreshFloor:  o.JWKSRefreshFloorOrDefault(),
	}
}

func authMode(s *config.Server) string {
	if s.OAuth != nil {
		return "OAuth access tokens from " + s.OAuth.Issuer + " (" + authModeStatic(s) + " too)"
	}
	return authModeStatic(s)
}

func authModeStatic(s *config.Server) string {
	switch {
	case len(s.Tokens) > 0 && s.TLS != nil && s.TLS.ClientCA != "":
		return "bearer tokens or client certificates"
	case len(s.Tokens) > 0:
		return "bearer tokens"
	case s.TLS != nil && s.TLS.ClientCA != "":
		return "client certificates"
	default:
		return "none (loopback development mode)"
	}
}

func serverTLS(cfg *config.Config, t *config.TLS) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(cfg.Resolve(t.Cert), cfg.Resolve(t.Key))
	if err != nil {
		return nil, fmt.Errorf("server.tls: %w", err)
	}
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if t.ClientCA != "" {
		pem, err := os.ReadFile(cfg.Resolve(t.ClientCA))
		if err != nil {
			return nil, fmt.Errorf("server.tls.client_ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("server.tls.client_ca %s: no PEM certificates", t.ClientCA)
		}
		tc.ClientCAs = pool
		// A certificate is optional when bearer tokens are configured too;
		// a presented certificate is always verified.
		tc.ClientAuth = tls.VerifyClientCertIfGiven
	}
	return tc, nil
}

// checkStartFiles checks the files and environment variables serve reads
// at start (config.CheckFiles, config.CheckEnv), all problems at once.
// With stdio there is no MCP listener, and server.tls is not read.
func checkStartFiles(cfg *config.Config, environ []string, stdio bool) error {
	var all config.Errors
	for _, err := range []error{cfg.CheckFiles(), cfg.CheckEnv(lookupIn(environ), "the gateway's environment")} {
		var es config.Errors
		if errors.As(err, &es) {
			for _, e := range es {
				if stdio && strings.HasPrefix(e.Field, "server.tls") {
					continue
				}
				all = append(all, e)
			}
		}
	}
	if len(all) > 0 {
		return all
	}
	return nil
}

// buildUpstreams turns the configuration's upstreams into gateway
// upstreams; a stdio upstream's Hooks are left for the caller to set once
// the audit log is open.
func buildUpstreams(cfg *config.Config, s *config.Server, environ []string, minted *mintRecorder) ([]gateway.UpstreamOptions, error) {
	var out []gateway.UpstreamOptions
	for i := range cfg.Upstreams {
		u := &cfg.Upstreams[i]
		uo := gateway.UpstreamOptions{Namespaced: u.Namespaced(), Shared: u.Shared(), ToolPins: cfg.ToolPins(u.Name), DriftWarn: cfg.DriftWarn(u.Name), WarmSpares: u.WarmSpares}
		switch {
		case u.Stdio != nil:
			spec := upstream.StdioSpec{Name: u.Name, Command: u.Stdio.Command, Args: u.Stdio.Args, Dir: u.Stdio.Dir,
				Env: u.Stdio.Env, EnvAllow: u.Stdio.EnvAllow, Sealed: u.Stdio.Sealed, AllowUnmeasured: u.AllowUnmeasured, AllowCodeEnv: u.AllowCodeEnv, StopGrace: s.ChildStopGrace}
			uo.Class = upstream.ClassSpawnUnmeasured
			if u.Pin != nil {
				spec.Pin, spec.MeasurePath, spec.MeasurePin = u.Pin.Command, u.Pin.Target, u.Pin.TargetDigest
				spec.InterpreterPin = u.Pin.Interpreter
				if !u.AllowCodeEnv {
					uo.Class = upstream.ClassSpawnMeasured
				}
			}
			share := "per-session"
			if u.Shared() {
				share = "shared"
			}
			uo.Upstream = &upstream.Stdio{Spec: spec, Environ: environ, Share: share}
			uo.Transport = "stdio"
		case u.HTTP != nil:
			ho := upstream.HTTPOptionsFromConfig(u.Name, u.HTTP, lookupIn(environ))
			if c := u.HTTP.Credential; c != nil {
				b, err := credentialBroker(u.Name, u.HTTP.Endpoint(), c, credentialEnv{LookupEnv: lookupIn(environ), OnMint: minted.record, OnSignIn: minted.signedIn})
				if err != nil {
					return nil, exitcode.WithCode(exitcode.ExitConfig, err)
				}
				ho.Credentials, uo.Credentials = b, b
			}
			h, err := upstream.NewHTTP(ho)
			if err != nil {
				return nil, exitcode.WithCode(exitcode.ExitConfig, err)
			}
			uo.Upstream = h
			uo.Transport, uo.Class = "http", h.Class()
		}
		out = append(out, uo)
	}
	return out, nil
}

func lookupIn(environ []string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		for i := len(environ) - 1; i >= 0; i-- {
			if n, v, ok := cutEnv(environ[i]); ok && n == k {
				return v, true
			}
		}
		return "", false
	}
}

func cutEnv(kv string) (string, string, bool) {
	for i := 0; i < len(kv); i++ {
		if kv[i] == '=' {
			return kv[:i], kv[i+1:], true
		}
	}
	return "", "", false
}

// configCatalogDigest is the digest of the configured tool pins (upstream ->
// tool -> pin), the approved catalog recorded in the genesis record.
func configCatalogDigest(cfg *config.Config) digest.Digest {
	m := map[string]map[string]string{}
	for _, u := range cfg.Upstreams {
		pins := map[string]string{}
		for t, d := range cfg.ToolPins(u.Name) {
			pins[t] = d.String()
		}
		m[u.Name] = pins
	}
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	b, _ := json.Marshal(m)
	d, _ := digest.JSON(b)
	return d
}

// perSessionStdio counts the stdio upstreams that run a child per session.
func perSessionStdio(cfg *config.Config) int {
	n := 0
	for _, u := range cfg.Upstreams {
		if u.Stdio != nil && !u.Shared() {
			n++
		}
	}
	return n
}
