// Package connect is `cmcp connect`: it runs beside an MCP server on a
// machine the gateway cannot reach, dials out to the gateway's tunnel
// endpoint over a WebSocket, registers the machine, and serves each
// gateway session the gateway opens over the tunnel with a connection of
// its own to the server: a stdio server is spawned per session exactly as
// `cmcp serve` spawns it (measured, pinned, its own process group, bounded
// stderr), an HTTP server gets each session's messages
// verbatim (httpRelay), with a session of its own.
//
// With RequireAttested it first asks the gateway for evidence bound to the
// TLS channel it is on (wire.ChannelStatement) and a fresh nonce, verifies
// it offline with pkg/evidence against reference values, and only then
// sends its token and registers: a machine hands its tools only to a
// gateway whose code and hardware it checked, and a proxy in between
// cannot pass on the gateway's evidence.
//
// On a lost tunnel it reconnects with exponential backoff and full jitter
// and registers again. A refused token is retried only after the longest
// backoff, never in a tight loop; a gateway whose evidence does not verify
// ends Run with the verification's error.
package connect

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/buildinfo"
	"github.com/confidential-mcp/cmcp/internal/rpcwire"
	"github.com/confidential-mcp/cmcp/internal/tunnel"
	"github.com/confidential-mcp/cmcp/internal/tunnel/wire"
	"github.com/confidential-mcp/cmcp/internal/upstream"
	"github.com/confidential-mcp/cmcp/pkg/digest"
	"github.com/confidential-mcp/cmcp/pkg/evidence"
)

// Options configure a connector.
type Options struct {
	// Gateway is the tunnel endpoint: https://host/path (or http:// on
	// loopback; ws:// and wss:// are the same).
	Gateway string
	// Token is the machine token (never logged).
	Token string
	// Upstream is the tunnel upstream of the gateway this machine serves.
	Upstream string
	// MachineID identifies the machine (wire.ValidMachineID); MachineName
	// is for people (default: the host name).
	MachineID   string
	MachineName string

	// Stdio is the server to spawn per gateway session, Environ the
	// environment it inherits from (filtered by Stdio.EnvAllow).
	Stdio   *upstream.StdioSpec
	Environ []string
	// HTTP is the URL of a local HTTP MCP server (instead of Stdio).
	HTTP string

	// TLS configures the connection to the gateway (roots, server name).
	TLS *tls.Config

	// RequireAttested: register only with a gateway whose evidence
	// verifies against Reference (and Roots; nil: the embedded vendor
	// roots). Software evidence is refused unless AllowSoftware.
	RequireAttested bool
	Reference       *evidence.ReferenceValues
	Roots           *evidence.Roots
	AllowSoftware   bool

	// InitialBackoff and MaxBackoff bound the wait before reconnecting
	// (0: 1 s and 60 s).
	InitialBackoff time.Duration
	MaxBackoff     time.Duration
	// WriteTimeout bounds one write to the tunnel (0: 30 s).
	WriteTimeout time.Duration
	// SessionQueue bounds the messages waiting for one session's server
	// (0: 256); a session over it is closed.
	SessionQueue int

	// Log receives the connector's events; State, if set, is told of
	// every change of the tunnel's state (for tests and status output).
	Log   *slog.Logger
	State func(State)
}

// State is a change of the connector's tunnel.
type State struct {
	Kind   string // "registered", "disconnected", "refused"
	Err    error
	Wait   time.Duration // before the next attempt
	Result *evidence.Result
}

// RefusedError is a registration the gateway refused.
type RefusedError struct {
	Code   string
	Reason string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("the gateway refused the registration (%s): %s", e.Code, e.Reason)
}

// VerifyError is a gateway whose evidence did not verify: the connector
// does not register with it, and Run ends.
type VerifyError struct {
	Result *evidence.Result
	Err    error
}

func (e *VerifyError) Error() string {
	return fmt.Sprintf("the gateway's evidence did not verify; not registering with it: %v", e.Err)
}

func (e *VerifyError) Unwrap() error { return e.Err }

// Connector is a running `cmcp connect`.
type Connector struct {
	o      Options
	server wire.Server
	url    string
	client *http.Client
	// local dials the --http server: its idle connections are kept for
	// every session's requests in flight at once.
	local *http.Client
}

// New checks o and measures the server once, for the register frame (each
// session's spawn measures again and refuses a mismatch).
func New(o Options) (*Connector, error) {
	if o.InitialBackoff <= 0 {
		o.InitialBackoff = time.Second
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = 60 * time.Second
	}
	if o.MaxBackoff < o.InitialBackoff {
		return nil, fmt.Errorf("the longest backoff (%v) is shorter than the first (%v)", o.MaxBackoff, o.InitialBackoff)
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 30 * time.Second
	}
	if o.SessionQueue <= 0 {
		o.SessionQueue = 256
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if !wire.ValidMachineID(o.MachineID) {
		return nil, fmt.Errorf("machine id %q is not 1 to 64 of [A-Za-z0-9._-] starting with a letter or digit", o.MachineID)
	}
	if o.MachineName == "" {
		o.MachineName, _ = os.Hostname()
	}
	if o.Token == "" {
		return nil, errors.New("no machine token: the gateway accepts machines only with one of the upstream's tokens")
	}
	if o.RequireAttested && o.Reference == nil && !o.AllowSoftware {
		return nil, errors.New("attestation needs reference values: without them any code on genuine hardware would pass")
	}
	c := &Connector{o: o}
	u := o.Gateway
	switch {
	case strings.HasPrefix(u, "https://"), strings.HasPrefix(u, "wss://"):
	case strings.HasPrefix(u, "http://"), strings.HasPrefix(u, "ws://"):
		if o.RequireAttested {
			return nil, fmt.Errorf("gateway URL %q is not https: attestation is bound to the TLS channel", u)
		}
	default:
		return nil, fmt.Errorf("gateway URL %q must start with https:// (or http:// on loopback)", u)
	}
	c.url = u
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = o.TLS
	tr.Proxy = nil
	c.client = &http.Client{Transport: tr, Timeout: 20 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	switch {
	case o.Stdio != nil && o.HTTP != "":
		return nil, errors.New("a server command and --http both given: serve one server")
	case o.Stdio != nil:
		var err error
		if c.server, err = stdioServer(o); err != nil {
			return nil, err
		}
	case o.HTTP != "":
		if !strings.HasPrefix(o.HTTP, "http://") && !strings.HasPrefix(o.HTTP, "https://") {
			return nil, fmt.Errorf("--http %q is not an http:// or https:// URL", o.HTTP)
		}
		class := upstream.ClassPlaintext
		if strings.HasPrefix(o.HTTP, "https://") {
			class = upstream.ClassTLSCA
		}
		c.server = wire.Server{Kind: "http", Command: o.HTTP, Class: class}
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = maxHTTPInFlight
		c.local = &http.Client{Transport: tr}
	default:
		return nil, errors.New("no server: give a command after -- or --http URL")
	}
	return c, nil
}

// stdioServer resolves and measures the server command o.Stdio names and
// checks it against its pin: what the connector tells the gateway.
func stdioServer(o Options) (wire.Server, error) {
	path, err := digest.ResolveCommand(o.Stdio.Command, lookupEnv(o.Environ, "PATH"))
	if err != nil {
		return wire.Server{}, fmt.Errorf("server command: %w", err)
	}
	f, d, err := digest.OpenFile(path)
	if err != nil {
		return wire.Server{}, fmt.Errorf("measure %s: %w", path, err)
	}
	f.Close()
	srv := wire.Server{Kind: "stdio", Command: path, Digest: d.String(), Class: upstream.ClassSpawnMeasured}
	if !o.Stdio.Pin.IsZero() {
		srv.Pin = o.Stdio.Pin.String()
		if !o.Stdio.Pin.Equal(d) {
			return wire.Server{}, fmt.Errorf("%s measures %s, not its pin %s: %w", path, d, o.Stdio.Pin, upstream.ErrPinMismatch)
		}
	} else if !o.Stdio.AllowUnmeasured {
		return wire.Server{}, fmt.Errorf("the server %s has no pin (%s measures %s): %w", o.Stdio.Command, path, d, upstream.ErrUnpinned)
	} else {
		srv.Class = upstream.ClassSpawnUnmeasured
	}
	if o.Stdio.AllowCodeEnv {
		srv.Class = upstream.ClassSpawnUnmeasured
	}
	return srv, nil
}

// Server is what the connector tells the gateway about its server.
func (c *Connector) Server() wire.Server { return c.server }

// Run keeps the machine registered until ctx ends (nil) or the gateway's
// evidence fails verification (a *VerifyError).
func (c *Connector) Run(ctx context.Context) error {
	delay := c.o.InitialBackoff
	for {
		registered, err := c.once(ctx)
		if ctx.Err() != nil {
			return nil
		}
		var ve *VerifyError
		if errors.As(err, &ve) {
			c.state(State{Kind: "refused", Err: err, Result: ve.Result})
			return err
		}
		if registered {
			delay = c.o.InitialBackoff
		}
		wait := delay
		var re *RefusedError
		kind := "disconnected"
		if errors.As(err, &re) {
			kind = "refused"
			if re.Code == wire.CodeUnauthorized {
				wait = c.o.MaxBackoff // never a tight loop on a wrong token
			}
		}
		// Full jitter in [wait/2, wait]: connectors that lost one gateway
		// at once come back spread out.
		wait = wait/2 + mrand.N(wait/2+1)
		c.o.Log.Warn("tunnel down; reconnecting", "gateway", c.url, "err", err, "wait", wait)
		c.state(State{Kind: kind, Err: err, Wait: wait})
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		delay = min(2*delay, c.o.MaxBackoff)
	}
}

func (c *Connector) state(s State) {
	if c.o.State != nil {
		c.o.State(s)
	}
}

// once runs one tunnel: dial, (attest,) register, serve until it breaks.
func (c *Connector) once(ctx context.Context) (registered bool, err error) {
	dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	ws, resp, err := websocket.Dial(dctx, c.url, &websocket.DialOptions{HTTPClient: c.client, Subprotocols: []string{wire.Subprotocol}})
	if err != nil {
		if resp != nil {
			return false, fmt.Errorf("dial %s: HTTP %s: %w", c.url, resp.Status, err)
		}
		return false, fmt.Errorf("dial %s: %w", c.url, err)
	}
	defer ws.CloseNow()
	if ws.Subprotocol() != wire.Subprotocol {
		return false, fmt.Errorf("%s did not accept the tunnel protocol %s: is it a cmcp gateway's tunnel endpoint?", c.url, wire.Subprotocol)
	}
	ws.SetReadLimit(-1) // tunnel.ReadFrame bounds each message
	t := &tun{c: c, ws: ws, sessions: map[string]*session{}, done: make(chan struct{})}
	if c.o.RequireAttested {
		if err := t.attest(dctx, resp.TLS); err != nil {
			return false, err
		}
	}
	reg := &wire.Register{Token: c.o.Token, Upstream: c.o.Upstream, MachineID: c.o.MachineID, Name: c.o.MachineName,
		Version: buildinfo.Get().Version, Server: c.server, Host: t.host()}
	if err := t.write(dctx, wire.Encode(&wire.Frame{T: wire.TRegister, Register: reg})); err != nil {
		return false, err
	}
	f, err := t.read(dctx)
	if err != nil {
		return false, fmt.Errorf("waiting for the registration's answer: %w", err)
	}
	switch f.T {
	case wire.TRegistered:
	case wire.TRefused:
		return false, &RefusedError{Code: f.Code, Reason: f.Reason}
	default:
		return false, fmt.Errorf("the gateway answered the registration with a %s frame", f.T)
	}
	cancel()
	hb := time.Duration(f.HeartbeatMS) * time.Millisecond
	if hb <= 0 {
		hb = 15 * time.Second
	}
	c.o.Log.Info("registered", "gateway", c.url, "upstream", c.o.Upstream, "machine", c.o.MachineID)
	c.state(State{Kind: "registered"})
	return true, t.serve(ctx, hb)
}

// attest asks for the gateway's evidence bound to this TLS channel and a
// fresh nonce, and verifies it.
func (t *tun) attest(ctx context.Context, cs *tls.ConnectionState) error {
	st, err := wire.ChannelStatement(cs)
	if err != nil {
		return &VerifyError{Err: err}
	}
	nonce := make([]byte, 32)
	if _, err := rand.Read(nonce); err != nil {
		return err
	}
	if err := t.write(ctx, wire.Encode(&wire.Frame{T: wire.THello, Nonce: nonce})); err != nil {
		return err
	}
	f, err := t.read(ctx)
	if err != nil {
		return fmt.Errorf("waiting for the gateway's evidence: %w", err)
	}
	switch f.T {
	case wire.TEvidence:
	case wire.TRefused:
		return &VerifyError{Err: fmt.Errorf("the gateway gave no evidence: %s", f.Reason)}
	default:
		return &VerifyError{Err: fmt.Errorf("the gateway answered hello with a %s frame, not evidence", f.T)}
	}
	b, err := evidence.Decode(f.Bundle)
	if err != nil {
		return &VerifyError{Err: fmt.Errorf("the gateway's evidence bundle: %w", err)}
	}
	ref := t.c.o.Reference
	if b.Platform == evidence.PlatformSoftware && t.c.o.AllowSoftware {
		// Reference values are for hardware; software evidence matches
		// none. Allowed for development, it is checked for its binding
		// (this channel, this nonce) only, and said so.
		ref = nil
		t.c.o.Log.Warn("the gateway runs without hardware attestation (software evidence, allowed by --allow-software): its binding to this TLS channel is checked, its code is not")
	}
	if ref == nil && b.Platform != evidence.PlatformSoftware {
		return &VerifyError{Err: fmt.Errorf("the gateway gave %s evidence and there are no reference values to check its code against: give --reference", b.Platform)}
	}
	r, err := evidence.Verify(b, evidence.VerifyOptions{Roots: t.c.o.Roots, Reference: ref, ExpectNonce: nonce, ExpectStatement: st, AllowSoftware: t.c.o.AllowSoftware})
	if err != nil {
		return &VerifyError{Err: err}
	}
	if err := r.Err(); err != nil {
		return &VerifyError{Result: r, Err: err}
	}
	t.c.o.Log.Info("gateway evidence verified", "platform", b.Platform, "verdict", r.Verdict)
	return nil
}

// tun is one live tunnel.
type tun struct {
	c        *Connector
	ws       *websocket.Conn
	mu       sync.Mutex
	sessions map[string]*session
	done     chan struct{}
	nsess    atomic.Int64
	// watchdogs are stopped timers that close the tunnel once a session's
	// write waited WriteTimeout (send), kept for the next writes.
	watchdogs sync.Pool
}

func (t *tun) write(ctx context.Context, b []byte) error {
	ctx, cancel := context.WithTimeout(ctx, t.c.o.WriteTimeout)
	defer cancel()
	return t.ws.Write(ctx, websocket.MessageText, b)
}

func (t *tun) read(ctx context.Context) (*wire.Frame, error) {
	f, err := tunnel.ReadFrame(ctx, t.ws)
	if err != nil {
		var ce websocket.CloseError
		if errors.As(err, &ce) {
			return nil, fmt.Errorf("the gateway closed the tunnel (%d %s)", ce.Code, ce.Reason)
		}
		if errors.Is(err, tunnel.ErrTooLarge) {
			return nil, fmt.Errorf("the gateway sent %w", err)
		}
		return nil, err
	}
	return f, nil
}

func (t *tun) host() wire.Host {
	h := wire.Host{OS: runtime.GOOS, Arch: runtime.GOARCH, CPUs: runtime.NumCPU(), Sessions: int(t.nsess.Load())}
	h.Hostname, _ = os.Hostname()
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			h.Load1, _ = strconv.ParseFloat(f[0], 64)
		}
	}
	return h
}

// serve runs the tunnel: frames in, heartbeats out, until it breaks.
func (t *tun) serve(ctx context.Context, hb time.Duration) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer t.closeAll()
	// The reads below have no context: the tunnel's end closes the
	// connection, which ends a read (and a session's write, send). A
	// context per read would cost coder/websocket a hook registered on it
	// for every message.
	defer context.AfterFunc(ctx, func() { t.ws.CloseNow() })()
	go func() {
		tick := time.NewTicker(hb)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if err := t.write(ctx, wire.Encode(&wire.Frame{T: wire.THeartbeat, Host: ptr(t.host())})); err != nil {
				cancel(fmt.Errorf("send heartbeat: %w", err))
				t.ws.CloseNow()
				return
			}
			pctx, pcancel := context.WithTimeout(ctx, hb)
			err := t.ws.Ping(pctx)
			pcancel()
			if err != nil && ctx.Err() == nil {
				cancel(fmt.Errorf("no pong from the gateway within the heartbeat period of %v (a half-open or stalled connection)", hb))
				t.ws.CloseNow()
				return
			}
		}
	}()
	for {
		f, err := t.read(context.Background())
		if err != nil {
			if c := context.Cause(ctx); c != nil && !errors.Is(c, context.Canceled) {
				return c
			}
			return err
		}
		switch f.T {
		case wire.TOpen:
			t.open(ctx, f.S)
		case wire.TMsg:
			t.mu.Lock()
			s := t.sessions[f.S]
			t.mu.Unlock()
			if s == nil {
				t.c.o.Log.Warn("a message for a session this connector does not have; dropped", "session", f.S)
				continue
			}
			s.enqueue(queued{f.M, f.Checked()})
		case wire.TClose:
			t.mu.Lock()
			s := t.sessions[f.S]
			delete(t.sessions, f.S)
			t.mu.Unlock()
			if s != nil {
				s.stop()
			}
		case wire.TRefused:
			return &RefusedError{Code: f.Code, Reason: f.Reason}
		default:
			return fmt.Errorf("the gateway sent a %s frame, which only a connector sends", f.T)
		}
	}
}

func ptr[T any](v T) *T { return &v }

func (t *tun) closeAll() {
	t.mu.Lock()
	ss := t.sessions
	t.sessions = map[string]*session{}
	t.mu.Unlock()
	for _, s := range ss {
		s.stop()
	}
}

// queued is a message of the gateway waiting for the session's server;
// checked: wire.Frame.Checked.
type queued struct {
	m       []byte
	checked bool
}

// decode decodes q like rpcwire.DecodeMessage, without checking a checked
// message again.
func (q queued) decode() (jsonrpc.Message, error) {
	if q.checked {
		if msg, ok := rpcwire.DecodeChecked(q.m); ok {
			return msg, nil
		}
	}
	return rpcwire.DecodeMessage(q.m)
}

// session is one gateway session served on this machine.
type session struct {
	t      *tun
	id     string
	in     chan queued
	ctx    context.Context
	cancel context.CancelFunc
	once   sync.Once
}

func (t *tun) open(ctx context.Context, id string) {
	t.mu.Lock()
	if t.sessions[id] != nil {
		t.mu.Unlock()
		return
	}
	sctx, cancel := context.WithCancel(ctx)
	s := &session{t: t, id: id, in: make(chan queued, t.c.o.SessionQueue), ctx: sctx, cancel: cancel}
	t.sessions[id] = s
	t.mu.Unlock()
	t.nsess.Add(1)
	go s.run()
}

func (s *session) enqueue(q queued) {
	select {
	case s.in <- q:
	default:
		s.end(fmt.Sprintf("the server did not take the session's messages (more than %d waiting)", cap(s.in)))
	}
}

// end closes the session from this side, telling the gateway why.
func (s *session) end(reason string) {
	s.once.Do(func() {
		s.t.mu.Lock()
		if s.t.sessions[s.id] == s {
			delete(s.t.sessions, s.id)
		}
		s.t.mu.Unlock()
		s.cancel()
		_ = s.t.write(context.Background(), wire.Encode(&wire.Frame{T: wire.TClosed, S: s.id, Reason: clip(reason)}))
	})
}

// send writes one frame of the session to the gateway, with the tunnel's
// context, never the session's: coder/websocket closes the whole
// connection when a write's context ends mid-write, and a session the
// gateway closes (Admit's, after its tools/list) must not take the tunnel
// and every other session with it. A stopped session sends nothing more.
// A failed write leaves the tunnel unusable: the session stops and the
// tunnel is closed (the connector reconnects).
func (s *session) send(b []byte) error {
	if err := s.ctx.Err(); err != nil {
		return err
	}
	if err := s.t.send(b); err != nil {
		s.stop()
		s.t.ws.CloseNow()
		return err
	}
	return nil
}

// send writes b with no context of its own, waiting WriteTimeout at most:
// a watchdog timer closes the tunnel once the write, waiting for the ones
// before it or writing, took that long (the tunnel's end closes it too,
// see serve). The timer is a stopped one kept from an earlier write where
// there is one: a context with a deadline per write, and the hook
// coder/websocket registers on it, cost several allocations on every
// message.
func (t *tun) send(b []byte) error {
	wd, _ := t.watchdogs.Get().(*time.Timer)
	if wd == nil {
		wd = time.AfterFunc(t.c.o.WriteTimeout, func() { t.ws.CloseNow() })
	} else {
		wd.Reset(t.c.o.WriteTimeout)
	}
	err := t.ws.Write(context.Background(), websocket.MessageText, b)
	if wd.Stop() {
		t.watchdogs.Put(wd)
	} else if err != nil {
		err = fmt.Errorf("the tunnel took nothing for %v (a stalled or too slow connection): %w", t.c.o.WriteTimeout, err)
	}
	return err
}

// stop ends the session at the gateway's word (or the tunnel's end).
func (s *session) stop() {
	s.once.Do(func() { s.cancel() })
}

func clip(s string) string {
	if len(s) > 1000 {
		return s[:1000] + "..."
	}
	return s
}

func (s *session) run() {
	defer s.t.nsess.Add(-1)
	if s.t.c.o.Stdio == nil {
		s.runHTTP()
		return
	}
	conn, child, err := s.t.c.dialServer(s.ctx)
	if err != nil {
		s.end(err.Error())
		return
	}
	defer conn.Close()
	if err := s.send(wire.Encode(&wire.Frame{T: wire.TOpened, S: s.id})); err != nil {
		return
	}
	// Gateway to server.
	go func() {
		for {
			select {
			case <-s.ctx.Done():
				return
			case q := <-s.in:
				msg, err := q.decode() // what jsonrpc.DecodeMessage gives, without its large buffer
				if err != nil {
					s.end(fmt.Sprintf("the gateway sent a message that is not JSON-RPC: %v", err))
					return
				}
				if err := conn.Write(s.ctx, msg); err != nil {
					s.end(fmt.Sprintf("write to the server: %v", err))
					return
				}
			}
		}
	}()
	// Server to gateway.
	checked := child == nil
	for {
		msg, err := conn.Read(s.ctx)
		if err != nil {
			if s.ctx.Err() == nil {
				s.end(fmt.Sprintf("the server's connection ended: %v", err))
			}
			return
		}
		if !checked {
			if _, ok := msg.(*jsonrpc.Response); ok {
				checked = true
				if err := child.Handshook(); err != nil {
					s.end(err.Error())
					return
				}
			}
		}
		b, err := jsonrpc.EncodeMessage(msg)
		if err != nil {
			s.end(fmt.Sprintf("encode the server's message: %v", err))
			return
		}
		if len(b) > wire.MaxMessage {
			s.end(fmt.Sprintf("the server sent a message of %d bytes, over the tunnel's limit of %d", len(b), wire.MaxMessage))
			return
		}
		if err := s.send(wire.EncodeMsg(s.id, b)); err != nil {
			return
		}
	}
}

// runHTTP serves the session with the local HTTP server through an
// httpRelay.
func (s *session) runHTTP() {
	r := newHTTPRelay(s, s.t.c.o.HTTP, s.t.c.local)
	defer r.close()
	if err := s.send(wire.Encode(&wire.Frame{T: wire.TOpened, S: s.id})); err != nil {
		return
	}
	r.wg.Add(1)
	go func() { defer r.wg.Done(); r.serve(s.ctx) }()
	<-s.ctx.Done()
}

// dialServer starts the session's own stdio server: a child spawned,
// measured and pinned as serve spawns one.
func (c *Connector) dialServer(ctx context.Context) (mcp.Connection, *upstream.Child, error) {
	child, err := upstream.Spawn(ctx, *c.o.Stdio, c.o.Environ, upstream.Hooks{Log: c.o.Log}, "per-session")
	if err != nil {
		return nil, nil, err
	}
	conn, err := child.Relay(ctx)
	if err != nil {
		child.Stop()
		return nil, nil, err
	}
	return conn, child, nil
}

func lookupEnv(env []string, name string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == name {
			return v
		}
	}
	return ""
}
