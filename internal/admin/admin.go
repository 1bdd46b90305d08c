// Package admin is the operators' listener of cmcp serve: /healthz and
// /readyz (no credential; up or down), and behind the admin bearer token
// /metrics, the kill switch (/admin/kill-switch: state, engage, clear), a
// forced checkpoint (/admin/checkpoint) and session receipts
// (/admin/receipt). It drives the gateway core through its exported
// controls (the kill switch, readiness, sessions, upstreams) and never
// reaches into it; the core does not know it.
package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/confidential-mcp/cmcp/internal/contain"
	"github.com/confidential-mcp/cmcp/internal/killswitch"
	"github.com/confidential-mcp/cmcp/internal/metrics"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// Log is what the admin listener needs from the audit log: the record
// of a forced checkpoint, and the checkpoint. *auditlog.Writer implements it.
type Log interface {
	Append(ctx context.Context, rec record.Record) (auditlog.Receipt, error)
	Checkpoint() error
}

// KillSwitch is the gateway's kill switch (*Gateway implements it): while
// engaged every tools/call is refused, and each change is recorded in the
// audit log (engaging fails closed even when the record cannot be written;
// clearing does not happen unrecorded). It survives a restart.
type KillSwitch interface {
	SetKillSwitch(ctx context.Context, on bool, actor, reason string) error
	KillSwitch() bool
	KillStatus() killswitch.Status
}

// Checkpoint is the action of the admin record of a forced checkpoint.
const Checkpoint = "checkpoint"

// Options configures the admin listener.
type Options struct {
	// Addr is the listen address (host:port). It must never be the MCP
	// listener's address: agents must not reach this endpoint.
	Addr string
	// Listener, if set, is Addr already bound (server.Serve binds it before the
	// audit log is opened); Start serves on it instead of listening.
	Listener net.Listener
	// TokenDigest is "sha256:<hex>" of the admin bearer token. Required:
	// the admin endpoint never runs without its own credential.
	TokenDigest digest.Digest
	Kill        KillSwitch
	Metrics     *metrics.Registry
	Log         Log
	// Ready reports whether the gateway can serve calls (audit log open,
	// catalog loaded); nil means ready.
	Ready func() error
	// Containment, if set, names how the upstream children's descendants
	// are contained (contain.Info); /readyz says it to the admin token.
	Containment func() string
	// Notes, if set, are more lines /readyz says to the admin token (the
	// tunnel upstreams' machines).
	Notes func() []string
	// Routes are more endpoints behind the admin token, by pattern
	// ("GET /admin/machines").
	Routes map[string]http.Handler
	// BeforeScrape, if set, runs before /metrics is written (to refresh
	// gauges such as upstream health).
	BeforeScrape func()
	// Receipt, if set, serves GET /admin/receipt?session=ID (behind the
	// token): the session's receipt (pkg/auditlog FORMAT.md section 12),
	// nil if the log holds no record of it.
	Receipt func(ctx context.Context, session string) ([]byte, error)
	Logger  *slog.Logger
}

// Admin is the operators' listener: /healthz and /readyz (no credential,
// they reveal nothing but up/down), and behind the admin token /metrics,
// /admin/kill-switch (GET state, POST engage, POST clear) and
// /admin/checkpoint (POST).
type Admin struct {
	o   Options
	ln  net.Listener
	srv *http.Server
	mux *http.ServeMux

	killMu sync.Mutex // serialises kill switch changes

	token atomic.Pointer[digest.Digest] // the admin token's digest in force (SetTokenDigest)
}

// maxAdminBody bounds an admin request body (a reason string).
const maxAdminBody = 64 << 10

// New validates o and builds the handler; Start listens.
func New(o Options) (*Admin, error) {
	if o.TokenDigest.IsZero() {
		return nil, errors.New("admin listener: no token configured; set admin.token_sha256 to the sha256 digest " +
			"of a random token (the admin endpoint never runs without its own credential)")
	}
	if o.Kill == nil || o.Metrics == nil || o.Log == nil {
		return nil, errors.New("admin listener: kill switch, metrics and audit log are required")
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	a := &Admin{o: o, mux: http.NewServeMux()}
	a.token.Store(&o.TokenDigest)
	a.mux.HandleFunc("GET /healthz", a.healthz)
	a.mux.HandleFunc("GET /readyz", a.readyz)
	a.mux.Handle("GET /metrics", a.auth(a.metrics))
	a.mux.Handle("GET /admin/kill-switch", a.auth(a.killStatus))
	a.mux.Handle("POST /admin/kill-switch/engage", a.auth(a.killEngage))
	a.mux.Handle("POST /admin/kill-switch/clear", a.auth(a.killClear))
	a.mux.Handle("POST /admin/checkpoint", a.auth(a.checkpoint))
	if o.Receipt != nil {
		a.mux.Handle("GET /admin/receipt", a.auth(a.receipt))
	}
	for pattern, h := range o.Routes {
		a.mux.Handle(pattern, a.auth(h.ServeHTTP))
	}
	o.Metrics.GaugeFunc("cmcp_kill_switch_engaged", "1 while the operator's kill switch stops all calls.", func() float64 {
		if o.Kill.KillSwitch() {
			return 1
		}
		return 0
	})
	return a, nil
}

// Handler is the admin endpoint's HTTP handler (for tests and embedding).
func (a *Admin) Handler() http.Handler { return a.mux }

// Start listens on o.Addr and serves in the background.
func (a *Admin) Start() error {
	ln := a.o.Listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", a.o.Addr); err != nil {
			return fmt.Errorf("admin listener: %w", err)
		}
	}
	a.ln = ln
	a.srv = &http.Server{
		Handler:           a.mux,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(a.o.Logger.Handler(), slog.LevelWarn),
	}
	go func() {
		if err := a.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.o.Logger.Error("admin listener stopped", "err", err)
		}
	}()
	a.o.Logger.Info("admin listener", "addr", ln.Addr().String())
	return nil
}

// Addr is the address the listener is bound to (after Start).
func (a *Admin) Addr() string {
	if a.ln == nil {
		return ""
	}
	return a.ln.Addr().String()
}

// Shutdown stops the listener, letting requests in flight finish until ctx ends.
func (a *Admin) Shutdown(ctx context.Context) error {
	if a.srv == nil {
		return nil
	}
	return a.srv.Shutdown(ctx)
}

// auth admits a request only with the admin bearer token, compared as a
// digest in constant time.
func (a *Admin) auth(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !a.authorized(r) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="cmcp-admin"`)
			writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "the admin token is missing or wrong"})
			return
		}
		h(w, r)
	})
}

// authorized reports whether r carries the admin token, compared as a
// digest in constant time. The scheme is matched case-insensitively (RFC
// 7235), as the MCP front does.
func (a *Admin) authorized(r *http.Request) bool {
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	tok = strings.TrimSpace(tok)
	return ok && strings.EqualFold(scheme, "bearer") && tok != "" && digest.Bytes([]byte(tok)).Equal(*a.token.Load())
}

// TokenDigest is the digest of the admin token in force.
func (a *Admin) TokenDigest() digest.Digest { return *a.token.Load() }

// SetTokenDigest puts another admin token in force for every request that
// arrives from now on (SIGHUP re-reads admin.token_sha256). A zero digest
// is refused: the admin endpoint never runs without its own credential.
func (a *Admin) SetTokenDigest(d digest.Digest) error {
	if d.IsZero() {
		return errors.New("admin listener: no token: the admin endpoint never runs without its own credential")
	}
	a.token.Store(&d)
	return nil
}

func (a *Admin) healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.WriteString(w, "ok\n")
}

// readyz answers 200 "ready" or 503 "not ready". The reason (which names
// upstreams and paths) is only given with the admin token; a probe without
// it learns nothing but up or down.
func (a *Admin) readyz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	why := ""
	if a.o.Ready != nil {
		if err := a.o.Ready(); err != nil {
			why = err.Error()
		}
	}
	if why == "" && a.o.Kill.KillSwitch() {
		why = "kill switch engaged"
	}
	contained := ""
	if a.o.Containment != nil && a.authorized(r) {
		contained = "containment: " + a.o.Containment() + "\n"
	}
	if a.o.Notes != nil && a.authorized(r) {
		for _, n := range a.o.Notes() {
			contained += n + "\n"
		}
	}
	if why == "" {
		io.WriteString(w, "ready\n"+contained)
		return
	}
	w.WriteHeader(http.StatusServiceUnavailable)
	if a.authorized(r) {
		fmt.Fprintf(w, "not ready: %s\n%s", why, contained)
		return
	}
	io.WriteString(w, "not ready\n")
}

func (a *Admin) metrics(w http.ResponseWriter, _ *http.Request) {
	if a.o.BeforeScrape != nil {
		a.o.BeforeScrape()
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	if err := a.o.Metrics.WriteText(w); err != nil {
		a.o.Logger.Warn("write /metrics", "err", err)
	}
}

func (a *Admin) killStatus(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, a.status())
}

func (a *Admin) status() killswitch.Status { return a.o.Kill.KillStatus() }

// adminRequest is the optional JSON body of an admin POST.
type adminRequest struct {
	Reason string `json:"reason"`
}

func readAdminRequest(w http.ResponseWriter, r *http.Request) (adminRequest, bool) {
	var req adminRequest
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxAdminBody))
	if err != nil {
		writeJSON(w, http.StatusRequestEntityTooLarge, map[string]string{"error": fmt.Sprintf("request body: %v", err)})
		return req, false
	}
	if len(strings.TrimSpace(string(body))) == 0 {
		return req, true
	}
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	err = dec.Decode(&req)
	if err == nil && dec.Decode(&struct{}{}) != io.EOF {
		err = errors.New("data after the JSON object")
	}
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf(`request body: %v; send {"reason": "..."} or nothing`, err)})
		return adminRequest{}, false
	}
	return req, true
}

func actorOf(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	return "admin-token@" + host
}

// killEngage stops every call. The gateway engages the switch even when its
// audit record cannot be written (fail closed), and the operator is told.
func (a *Admin) killEngage(w http.ResponseWriter, r *http.Request) {
	a.setKill(w, r, true)
}

// killClear lets calls through again, but only once the clearing is
// durably recorded: calls never resume unrecorded.
func (a *Admin) killClear(w http.ResponseWriter, r *http.Request) {
	a.setKill(w, r, false)
}

func (a *Admin) setKill(w http.ResponseWriter, r *http.Request, on bool) {
	req, ok := readAdminRequest(w, r)
	if !ok {
		return
	}
	actor := actorOf(r)
	a.killMu.Lock()
	defer a.killMu.Unlock()
	if a.o.Kill.KillSwitch() == on {
		writeJSON(w, http.StatusOK, map[string]any{"changed": false, "state": a.status()})
		return
	}
	err := a.o.Kill.SetKillSwitch(r.Context(), on, actor, req.Reason)
	st := a.status()
	verb := map[bool]string{true: "engaged", false: "cleared"}[on]
	if err != nil {
		a.o.Logger.Error("kill switch change incomplete", "want", verb, "engaged", st.Engaged, "err", err)
		code := http.StatusInternalServerError
		msg := fmt.Sprintf("the kill switch is engaged, but %v", strings.ReplaceAll(err.Error(), "\n", "; and "))
		if !on {
			code = http.StatusServiceUnavailable
			msg = fmt.Sprintf("the kill switch stays engaged: %v", err)
		}
		writeJSON(w, code, map[string]any{"error": msg, "state": st})
		return
	}
	a.o.Logger.Warn("kill switch "+verb, "actor", actor, "reason", req.Reason)
	writeJSON(w, http.StatusOK, map[string]any{"changed": true, "state": st})
}

// checkpoint records the request, then forces a signed checkpoint that
// covers it.
func (a *Admin) checkpoint(w http.ResponseWriter, r *http.Request) {
	req, ok := readAdminRequest(w, r)
	if !ok {
		return
	}
	actor := actorOf(r)
	if _, err := a.o.Log.Append(r.Context(), &record.Admin{Action: Checkpoint, Actor: actor, Reason: req.Reason}); err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": fmt.Sprintf("record the checkpoint request: %v", err)})
		return
	}
	if err := a.o.Log.Checkpoint(); err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": fmt.Sprintf("checkpoint: %v", err)})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"checkpoint": "written"})
}

// receipt answers the receipt of the session named by ?session=.
func (a *Admin) receipt(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("session")
	if id == "" {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "name the session: /admin/receipt?session=ID"})
		return
	}
	b, err := a.o.Receipt(r.Context(), id)
	switch {
	case err != nil:
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": fmt.Sprintf("receipt: %v", err)})
	case b == nil:
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "this epoch of the audit log holds no record of that session (a session of an earlier epoch: cmcp verify-chain DIR --make-receipt ID)"})
	default:
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.Write(b)
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// Config is the admin: section: the listener's address and the
// SHA-256 digest of its bearer token.
type Config struct {
	Listen      string
	TokenSHA256 digest.Digest
	// Ready, if set, is one more readiness check (the witnesses).
	Ready func() error
	// Receipt, if set, serves session receipts (Options.Receipt).
	Receipt func(ctx context.Context, session string) ([]byte, error)
	// Notes and Routes are Options.Notes and Routes.
	Notes  func() []string
	Routes map[string]http.Handler
}

// Core is the gateway core as the admin listener drives and reads it
// (*gateway.Gateway implements it).
type Core interface {
	KillSwitch
	// Sessions is the number of live agent sessions.
	Sessions() int
	// Draining reports that the gateway is shutting down.
	Draining() bool
	// UpstreamsReady says why no upstream is available, or nil.
	UpstreamsReady() error
	// UpstreamsUp reports, by name, whether each upstream is available.
	UpstreamsUp() map[string]bool
}

// Start starts the admin listener of the `admin:` section for a running
// gateway g and its audit log w, and registers the gauges that only exist
// once both run (audit queue depth, health and append errors, live
// sessions). Shut it down with
// (*Admin).Shutdown before closing w. ln, if not nil, is c.Listen already
// bound.
func Start(c Config, ln net.Listener, g Core, w *auditlog.Writer, m *metrics.Registry, logger *slog.Logger) (*Admin, error) {
	if m == nil {
		m = metrics.New()
	}
	m.GaugeFunc("cmcp_audit_queue_depth", "Audit records appended but not yet written by the committer.", func() float64 {
		return float64(w.QueueDepth())
	})
	m.GaugeFunc("cmcp_audit_log_healthy", "1 while the audit log can record, 0 once a write failed (every call is then refused with -32063 until an operator fixes it and restarts).", func() float64 {
		if w.Err() != nil {
			return 0
		}
		return 1
	})
	m.CounterFunc("cmcp_audit_append_errors_total", "Audit records that could not be appended (the call, access or event they record was refused or is missing).", func() float64 {
		return float64(w.AppendErrors())
	})
	m.GaugeFunc("cmcp_sessions", "Live agent sessions.", func() float64 { return float64(g.Sessions()) })
	a, err := New(Options{
		Addr:        c.Listen,
		Listener:    ln,
		TokenDigest: c.TokenSHA256,
		Kill:        g,
		Metrics:     m,
		Log:         w,
		Containment: func() string { return contain.Current().String() },
		Ready: func() error {
			if g.Draining() {
				// Draining: the MCP listener takes no new connection.
				return errors.New("shutting down: draining the calls in flight")
			}
			if err := w.Err(); err != nil {
				return fmt.Errorf("audit log: %w", err)
			}
			if err := g.UpstreamsReady(); err != nil {
				return err
			}
			if c.Ready != nil {
				return c.Ready()
			}
			return nil
		},
		Receipt: c.Receipt,
		Notes:   c.Notes,
		Routes:  c.Routes,
		BeforeScrape: func() {
			for name, up := range g.UpstreamsUp() {
				m.UpstreamHealth(name, up)
			}
		},
		Logger: logger,
	})
	if err != nil {
		return nil, err
	}
	if err := a.Start(); err != nil {
		return nil, err
	}
	return a, nil
}
