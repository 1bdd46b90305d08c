// Package tunnel is the gateway's side of cmcp tunnels: the WebSocket
// endpoint that `cmcp connect` dials out to from a machine the gateway
// cannot reach, the registry of the machines that registered under each
// tunnel upstream, and the gateway sessions carried over a machine's
// tunnel. The protocol is package wire.
//
// A connector authenticates with a machine token (stored as its SHA-256,
// compared in constant time; a token names the machine ids it may
// register, or any machine of a group), inside its register frame. A
// machine id is held by one connector at a time: a second one claiming it
// is refused while the first is live. The gateway pings every connector
// each heartbeat period; one whose pong does not come back within the
// period is dropped, so a half-open connection is gone within two
// heartbeats. Every queue is bounded: a gateway session that does not take
// its machine's messages is closed, a tunnel that does not take the
// gateway's within the write timeout is dropped.
package tunnel

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/confidential-mcp/cmcp/internal/tunnel/wire"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// Token is one machine token of a tunnel upstream: the SHA-256 of the
// secret, and the machine ids it may register (none: any id, a token
// shared by a group of machines).
type Token struct {
	SHA256   digest.Digest
	Machines []string
}

// Upstream is a tunnel upstream the hub accepts machines for.
type Upstream struct {
	Name   string
	Tokens []Token
	// MaxMachines bounds the machines registered at once (0: 64).
	MaxMachines int
}

// Options configure a Hub.
type Options struct {
	Upstreams []Upstream
	// Heartbeat is the ping period (0: 15 s). A connector whose pong does
	// not arrive within it is dropped.
	Heartbeat time.Duration
	// RegisterTimeout bounds the time from the upgrade to a register frame
	// (0: 10 s).
	RegisterTimeout time.Duration
	// WriteTimeout bounds one write to a tunnel; a tunnel that takes
	// nothing for that long is dropped (0: 30 s).
	WriteTimeout time.Duration
	// SessionQueue bounds the messages of one gateway session waiting to
	// be read (0: 256), SessionBytes their bytes (0: 32 MiB; one message
	// always fits an empty queue). A session over either is closed.
	SessionQueue int
	SessionBytes int
	// MaxSessions bounds the gateway sessions open on one machine (0: 1024).
	MaxSessions int
	// Attest, if set, answers a connector's hello: it returns the
	// gateway's evidence bundle (JSON) binding nonce and statement (the
	// tunnel's wire.ChannelStatement). Without it, a hello is refused.
	Attest func(ctx context.Context, nonce []byte, statement digest.Digest) ([]byte, error)
	// Admit, if set, runs once a machine registered and before any agent
	// session is routed to it (the upstream checks its tools there): an
	// error refuses the machine with wire.CodeTools and the error's text.
	Admit func(ctx context.Context, m *Machine) error
	// Event, if set, is told of every registration, refusal and drop. A
	// registration is told before the machine becomes routable: an error
	// then (the audit log cannot record it) refuses the machine.
	Event func(Event) error
	Log   *slog.Logger
}

// Event is a machine's registration, refusal or end, for the audit log.
type Event struct {
	Kind      string // "registered", "refused", "gone"
	Upstream  string
	MachineID string
	Name      string
	Remote    string
	Code      string // a refusal's code
	Reason    string
	Server    wire.Server
	Host      wire.Host
	Version   string
	Attested  bool // the connector asked for and got evidence before registering
	// TokenID names the upstream's machine token that matched, as
	// "tokens[N]" (its place in the upstream's list); never the token.
	TokenID string
	// Connected is how long a gone machine had been registered (0: it
	// went before it was admitted).
	Connected time.Duration
}

// Event kinds.
const (
	EventRegistered = "registered"
	EventRefused    = "refused"
	EventGone       = "gone"
)

// Hub accepts tunnels and keeps the live machines of each upstream.
type Hub struct {
	o  Options
	up map[string]*Upstream

	mu       sync.Mutex
	machines map[string]map[string]*Machine // upstream -> machine id -> machine (pending or live)
	changed  chan struct{}                  // closed and replaced on every change of a live set
	closed   bool
	wg       sync.WaitGroup

	nextSession atomic.Uint64
	// Dropped counts messages for sessions that no longer exist (or never
	// did), and answers nobody waits for, per hub.
	Dropped atomic.Int64
}

// New returns a Hub for the upstreams in o.
func New(o Options) (*Hub, error) {
	if o.Heartbeat <= 0 {
		o.Heartbeat = 15 * time.Second
	}
	if o.RegisterTimeout <= 0 {
		o.RegisterTimeout = 10 * time.Second
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 30 * time.Second
	}
	if o.SessionQueue <= 0 {
		o.SessionQueue = 256
	}
	if o.SessionBytes <= 0 {
		o.SessionBytes = 32 << 20
	}
	if o.MaxSessions <= 0 {
		o.MaxSessions = 1024
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	h := &Hub{o: o, up: map[string]*Upstream{}, machines: map[string]map[string]*Machine{}, changed: make(chan struct{})}
	for i := range o.Upstreams {
		u := &o.Upstreams[i]
		if _, dup := h.up[u.Name]; dup {
			return nil, fmt.Errorf("tunnel upstream %q is configured twice", u.Name)
		}
		if len(u.Tokens) == 0 {
			return nil, fmt.Errorf("tunnel upstream %q has no machine tokens: no connector could register", u.Name)
		}
		if u.MaxMachines <= 0 {
			u.MaxMachines = 64
		}
		h.up[u.Name] = u
		h.machines[u.Name] = map[string]*Machine{}
	}
	return h, nil
}

// Heartbeat is the hub's ping period.
func (h *Hub) Heartbeat() time.Duration { return h.o.Heartbeat }

// Machines returns the live (registered and admitted) machines of
// upstream, ordered by machine id.
func (h *Hub) Machines(upstream string) []*Machine {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []*Machine
	for _, m := range h.machines[upstream] {
		if m.live.Load() {
			out = append(out, m)
		}
	}
	slices.SortFunc(out, func(a, b *Machine) int {
		if a.ID < b.ID {
			return -1
		}
		if a.ID > b.ID {
			return 1
		}
		return 0
	})
	return out
}

// Machine returns the live machine id of upstream, or nil.
func (h *Hub) Machine(upstream, id string) *Machine {
	h.mu.Lock()
	defer h.mu.Unlock()
	if m := h.machines[upstream][id]; m != nil && m.live.Load() {
		return m
	}
	return nil
}

// Changed returns a channel closed at the next change of any upstream's
// live machines.
func (h *Hub) Changed() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.changed
}

func (h *Hub) notifyLocked() {
	close(h.changed)
	h.changed = make(chan struct{})
}

// Close drops every tunnel and refuses new ones; it waits for their
// goroutines.
func (h *Hub) Close() {
	h.mu.Lock()
	h.closed = true
	var all []*Machine
	for _, ms := range h.machines {
		for _, m := range ms {
			all = append(all, m)
		}
	}
	h.mu.Unlock()
	for _, m := range all {
		m.drop(errors.New("the gateway is stopping"), websocket.StatusGoingAway)
	}
	h.wg.Wait()
}

// ServeHTTP accepts one tunnel.
func (h *Hub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		http.Error(w, "cmcp: the gateway is stopping; connect again shortly", http.StatusServiceUnavailable)
		return
	}
	h.wg.Add(1)
	h.mu.Unlock()
	defer h.wg.Done()
	var tlsState *tls.ConnectionState
	if r.TLS != nil {
		cs := *r.TLS
		tlsState = &cs
	}
	remote := r.RemoteAddr
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{wire.Subprotocol}})
	if err != nil {
		h.o.Log.Warn("tunnel: websocket upgrade failed", "remote", remote, "err", err)
		return
	}
	if c.Subprotocol() != wire.Subprotocol {
		c.Close(websocket.StatusPolicyViolation, "cmcp: the connector must offer subprotocol "+wire.Subprotocol)
		return
	}
	c.SetReadLimit(-1) // ReadFrame bounds each message
	h.serve(c, tlsState, remote)
}

// refuse sends a refused frame and closes the tunnel.
func (h *Hub) refuse(c *websocket.Conn, ev Event, code, reason string) {
	ev.Kind, ev.Code, ev.Reason = EventRefused, code, reason
	_ = h.event(ev) // a refusal refuses whether or not it is recorded
	h.o.Log.Warn("tunnel: machine refused", "upstream", ev.Upstream, "machine", ev.MachineID, "remote", ev.Remote, "code", code, "reason", reason)
	ctx, cancel := context.WithTimeout(context.Background(), h.o.WriteTimeout)
	defer cancel()
	_ = c.Write(ctx, websocket.MessageText, wire.Encode(&wire.Frame{T: wire.TRefused, Code: code, Reason: reason}))
	status := websocket.StatusPolicyViolation
	if code == wire.CodeBadFrame {
		status = websocket.StatusProtocolError
	}
	c.Close(status, code)
}

func (h *Hub) event(ev Event) error {
	if h.o.Event != nil {
		return h.o.Event(ev)
	}
	return nil
}

// serve runs one tunnel from its first frame to its end: the connector
// registers (after a hello, if it asks for evidence), takes its place
// among the upstream's machines, is admitted and then served until it
// goes.
func (h *Hub) serve(c *websocket.Conn, tlsState *tls.ConnectionState, remote string) {
	ev := Event{Remote: remote}
	ctx, cancel := context.WithTimeout(context.Background(), h.o.RegisterTimeout)
	defer cancel()
	reg := h.readRegister(ctx, c, tlsState, &ev)
	if reg == nil {
		return
	}
	m := h.claim(c, reg, &ev)
	if m == nil {
		return
	}
	cancel()
	if err := m.write(wire.Encode(&wire.Frame{T: wire.TRegistered, HeartbeatMS: h.o.Heartbeat.Milliseconds()})); err != nil {
		m.drop(err, websocket.StatusInternalError)
		m.forget()
		return
	}
	go m.heartbeat()
	if !h.run(m, &ev) {
		return
	}
	h.gone(m, &ev)
}

// readRegister reads the connector's register frame (within ctx), after
// answering a hello with the gateway's evidence; ev learns what the
// connector says. On anything else it refuses the tunnel and returns nil.
func (h *Hub) readRegister(ctx context.Context, c *websocket.Conn, tlsState *tls.ConnectionState, ev *Event) *wire.Register {
	f, err := ReadFrame(ctx, c)
	if err != nil {
		h.refuse(c, *ev, wire.CodeBadFrame, fmt.Sprintf("no register frame within %v: %v", h.o.RegisterTimeout, err))
		return nil
	}
	if f.T == wire.THello {
		if f = h.hello(ctx, c, tlsState, f, ev); f == nil {
			return nil
		}
	}
	if f.T != wire.TRegister {
		h.refuse(c, *ev, wire.CodeBadFrame, fmt.Sprintf("the first frame must be register (or hello), not %s", f.T))
		return nil
	}
	reg := f.Register
	ev.Upstream, ev.MachineID, ev.Name, ev.Server, ev.Host, ev.Version = reg.Upstream, reg.MachineID, reg.Name, reg.Server, reg.Host, reg.Version
	return reg
}

// hello answers the hello frame f with the gateway's evidence, bound to
// the tunnel's TLS channel, and returns the frame that follows it; on an
// error it refuses the tunnel (or, if the evidence could not be sent,
// just ends) and returns nil.
func (h *Hub) hello(ctx context.Context, c *websocket.Conn, tlsState *tls.ConnectionState, f *wire.Frame, ev *Event) *wire.Frame {
	if h.o.Attest == nil {
		h.refuse(c, *ev, wire.CodeBadFrame, "this gateway gives no evidence to connectors (it has no attestation configured); run the connector without --require-attested only if you trust this gateway otherwise")
		return nil
	}
	st, err := wire.ChannelStatement(tlsState)
	if err != nil {
		h.refuse(c, *ev, wire.CodeBadFrame, "no evidence: "+err.Error())
		return nil
	}
	bundle, err := h.o.Attest(ctx, f.Nonce, st)
	if err != nil {
		h.refuse(c, *ev, wire.CodeBadFrame, "the gateway could not produce evidence: "+err.Error())
		return nil
	}
	if err := c.Write(ctx, websocket.MessageText, wire.Encode(&wire.Frame{T: wire.TEvidence, Bundle: json.RawMessage(bundle)})); err != nil {
		return nil
	}
	ev.Attested = true
	if f, err = ReadFrame(ctx, c); err != nil {
		h.refuse(c, *ev, wire.CodeBadFrame, fmt.Sprintf("no register frame after the evidence within %v: %v", h.o.RegisterTimeout, err))
		return nil
	}
	return f
}

// claim checks reg's token and takes the machine's place among its
// upstream's machines (pending: not yet routable). It refuses the tunnel
// and returns nil if the token is not the upstream's, the machine id is
// taken or the upstream is full.
func (h *Hub) claim(c *websocket.Conn, reg *wire.Register, ev *Event) *Machine {
	u := h.up[reg.Upstream]
	if u == nil {
		// Said the same way as a wrong token: the names of upstreams are
		// not for whoever holds no token.
		h.refuse(c, *ev, wire.CodeUnauthorized, fmt.Sprintf("the token is not a machine token of upstream %q for machine %q; check --token-file and the upstream's tunnel.tokens", reg.Upstream, reg.MachineID))
		return nil
	}
	tok := authorized(u, reg.Token, reg.MachineID)
	if tok < 0 {
		h.refuse(c, *ev, wire.CodeUnauthorized, fmt.Sprintf("the token is not a machine token of upstream %q for machine %q; check --token-file and the upstream's tunnel.tokens", reg.Upstream, reg.MachineID))
		return nil
	}
	ev.TokenID = fmt.Sprintf("tokens[%d]", tok)
	m := &Machine{
		hub: h, c: c, ID: reg.MachineID, Name: reg.Name, Upstream: reg.Upstream, Remote: ev.Remote,
		Version: reg.Version, Server: reg.Server, Attested: ev.Attested, Since: time.Now(),
		sessions: map[string]*Session{}, done: make(chan struct{}),
	}
	host := reg.Host
	m.host.Store(&host)
	m.lastBeat.Store(m.Since.UnixNano())
	h.mu.Lock()
	ms := h.machines[reg.Upstream]
	if old := ms[reg.MachineID]; old != nil {
		h.mu.Unlock()
		h.refuse(c, *ev, wire.CodeDuplicate, fmt.Sprintf("machine id %q of upstream %q is held by another connector (from %s, connected since %s); stop that one or give this one another --machine-id", reg.MachineID, reg.Upstream, old.Remote, old.Since.UTC().Format(time.RFC3339)))
		return nil
	}
	if len(ms) >= u.MaxMachines {
		h.mu.Unlock()
		h.refuse(c, *ev, wire.CodeFull, fmt.Sprintf("upstream %q has %d machines, the most it may have", reg.Upstream, u.MaxMachines))
		return nil
	}
	ms[reg.MachineID] = m
	h.mu.Unlock()
	return m
}

// run admits the registered machine m (Options.Admit, then the
// registration event) while reading its tunnel, makes it routable, and
// serves it until the tunnel ends. It reports false if m was refused at
// admission: the refusal is its event, and no gone event follows.
func (h *Hub) run(m *Machine, ev *Event) bool {
	admitted := make(chan error, 1)
	go func() {
		if h.o.Admit == nil {
			admitted <- nil
			return
		}
		actx, acancel := context.WithTimeout(context.Background(), 2*h.o.RegisterTimeout)
		defer acancel()
		admitted <- h.o.Admit(actx, m)
	}()
	readDone := make(chan error, 1)
	go func() { readDone <- m.readLoop() }()
	select {
	case err := <-admitted:
		code := wire.CodeTools
		if err == nil {
			ev.Kind = EventRegistered
			if rerr := h.event(*ev); rerr != nil {
				code, err = wire.CodeUnavailable, fmt.Errorf("the gateway could not record the registration: %w", rerr)
			}
		}
		if err != nil {
			m.forgetWith(func() { h.refuse(m.c, *ev, code, err.Error()) })
			<-readDone
			m.drop(err, websocket.StatusPolicyViolation)
			return false
		}
		m.registered.Store(time.Now().UnixNano())
		h.mu.Lock()
		m.live.Store(true)
		h.notifyLocked()
		h.mu.Unlock()
		h.o.Log.Info("tunnel: machine registered", "upstream", m.Upstream, "machine", m.ID, "name", m.Name, "remote", m.Remote, "attested", m.Attested)
		err = <-readDone
		m.drop(err, websocket.StatusInternalError)
	case err := <-readDone:
		m.drop(err, websocket.StatusInternalError)
		<-admitted
	}
	return true
}

// gone removes the ended machine m from its upstream and tells of its end
// (the event, ev, and the log).
func (h *Hub) gone(m *Machine, ev *Event) {
	m.forget()
	ev.Kind, ev.Code, ev.Reason = EventGone, "", m.Err().Error()
	if m.registered.Load() != 0 {
		ev.Connected = time.Since(time.Unix(0, m.registered.Load()))
	} else {
		ev.Reason = "before it was admitted: " + ev.Reason
	}
	h.event(*ev)
	h.o.Log.Info("tunnel: machine gone", "upstream", m.Upstream, "machine", m.ID, "reason", ev.Reason)
}

// authorized compares token with every token of u in constant time (all of
// them, whichever matches) and checks the machine id against the one that
// matched. It returns the index of that token in u.Tokens, or -1.
func authorized(u *Upstream, token, machine string) int {
	sum := sha256.Sum256([]byte(token))
	found := -1
	for i, t := range u.Tokens {
		want := t.SHA256.Sum()
		if subtle.ConstantTimeCompare(sum[:], want[:]) == 1 {
			if (len(t.Machines) == 0 || slices.Contains(t.Machines, machine)) && found < 0 {
				found = i
			}
		}
	}
	return found
}

// ErrTooLarge is the read error of a WebSocket message over wire.MaxFrame.
var ErrTooLarge = fmt.Errorf("a message over the limit of %d bytes", wire.MaxFrame)

// ReadFrame reads one frame. A message over wire.MaxFrame is not read
// past the limit: the error is ErrTooLarge and the caller ends the tunnel
// (coder/websocket's own limit would close with a handshake that waits
// for a peer busy writing the rest).
func ReadFrame(ctx context.Context, c *websocket.Conn) (*wire.Frame, error) {
	return readFrameCounting(ctx, c, nil)
}

// countingReader adds what it reads to n.
type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c countingReader) Read(p []byte) (int, error) {
	k, err := c.r.Read(p)
	c.n.Add(int64(k))
	return k, err
}

func readFrameCounting(ctx context.Context, c *websocket.Conn, n *atomic.Int64) (*wire.Frame, error) {
	typ, r, err := c.Reader(ctx)
	if err != nil {
		return nil, err
	}
	if n != nil {
		r = countingReader{r, n}
	}
	b, err := io.ReadAll(io.LimitReader(r, wire.MaxFrame+1))
	if err != nil {
		return nil, err
	}
	if len(b) > wire.MaxFrame {
		return nil, ErrTooLarge
	}
	if typ != websocket.MessageText {
		return nil, errors.New("a binary message: the tunnel carries text frames only")
	}
	return wire.Decode(b)
}

// Machine is one registered connector.
type Machine struct {
	hub      *Hub
	c        *websocket.Conn
	ID       string
	Name     string
	Upstream string
	Remote   string
	Version  string
	Server   wire.Server
	Attested bool
	Since    time.Time

	host     atomic.Pointer[wire.Host]
	lastBeat atomic.Int64 // unix ns of the last heartbeat frame
	// readBytes counts the bytes of data messages read: a pong queued
	// behind a long message comes late, but the tunnel is not half-open.
	readBytes  atomic.Int64
	live       atomic.Bool
	registered atomic.Int64 // unix ns of its admission (0: not admitted)

	mu       sync.Mutex
	sessions map[string]*Session
	done     chan struct{}
	err      error
	dropOnce sync.Once
	forgot   sync.Once

	// watchdogs are stopped timers that drop the machine once a write
	// waited WriteTimeout (writeCtx), kept for the next writes.
	watchdogs sync.Pool
}

// Info is what list_machines shows of a machine.
type Info struct {
	ID            string    `json:"id"`
	Name          string    `json:"name"`
	ConnectedAt   time.Time `json:"connected_since"`
	LastHeartbeat time.Time `json:"last_heartbeat"`
	Host          wire.Host `json:"host"`
	Version       string    `json:"version"`
	Server        struct {
		Kind   string `json:"kind"`
		Digest string `json:"digest,omitempty"`
		Class  string `json:"class"`
	} `json:"server"`
	Attested bool `json:"gateway_attested_to_it"`
	Sessions int  `json:"sessions"`
}

// Info returns the machine's facts.
func (m *Machine) Info() Info {
	i := Info{ID: m.ID, Name: m.Name, ConnectedAt: m.Since.UTC(), LastHeartbeat: time.Unix(0, m.lastBeat.Load()).UTC(), Host: *m.host.Load(), Version: m.Version, Attested: m.Attested}
	i.Server.Kind, i.Server.Digest, i.Server.Class = m.Server.Kind, m.Server.Digest, m.Server.Class
	m.mu.Lock()
	i.Sessions = len(m.sessions)
	m.mu.Unlock()
	return i
}

// Done is closed once the machine's tunnel is gone; Err then says why.
func (m *Machine) Done() <-chan struct{} { return m.done }

// Err says why the machine's tunnel ended (nil while it is up).
func (m *Machine) Err() error {
	select {
	case <-m.done:
		return m.err
	default:
		return nil
	}
}

func (m *Machine) forget() { m.forgetWith(nil) }

// forgetWith removes the machine from the hub (once), running f first.
func (m *Machine) forgetWith(f func()) {
	m.forgot.Do(func() {
		if f != nil {
			f()
		}
		h := m.hub
		h.mu.Lock()
		if h.machines[m.Upstream][m.ID] == m {
			delete(h.machines[m.Upstream], m.ID)
		}
		if m.live.Swap(false) {
			h.notifyLocked()
		}
		h.mu.Unlock()
	})
}

// drop ends the tunnel with err (the first reason is kept) and fails every
// session on it.
func (m *Machine) drop(err error, status websocket.StatusCode) {
	m.dropOnce.Do(func() {
		if err == nil {
			err = errors.New("the connector closed the tunnel")
		}
		m.mu.Lock()
		m.err = fmt.Errorf("machine %q of upstream %q went away: %w", m.ID, m.Upstream, err)
		sessions := m.sessions
		m.sessions = map[string]*Session{}
		m.mu.Unlock()
		m.forget() // not listed any more once Done is closed
		close(m.done)
		for _, s := range sessions {
			s.fail(m.err)
		}
		go func() {
			// The close handshake waits for the connector; never hold the
			// caller (a read loop, Close) for it.
			if status == websocket.StatusInternalError {
				m.c.CloseNow()
				return
			}
			m.c.Close(status, "")
		}()
	})
}

// write sends one frame, waiting WriteTimeout at most; a tunnel that takes
// nothing for that long is dropped.
func (m *Machine) write(b []byte) error {
	return m.writeCtx(context.Background(), b)
}

func (m *Machine) writeCtx(ctx context.Context, b []byte) error {
	if err := m.Err(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err // the caller gave up: nothing written, the tunnel stays
	}
	// The caller's context does not reach the write: coder/websocket
	// closes the connection when a write's context ends, and one caller
	// giving up (an agent's cancelled call) must not end the tunnel of
	// every session on the machine. A caller waits WriteTimeout at most,
	// as the tunnel does: a watchdog timer drops the machine (closing the
	// connection, which ends the write) once this write, waiting for the
	// ones before it or writing, took that long. It is a stopped timer
	// kept from an earlier write where there is one: a context with a
	// deadline per write, and the hook coder/websocket registers on it,
	// cost several allocations on every call.
	wd, _ := m.watchdogs.Get().(*time.Timer)
	if wd == nil {
		wd = time.AfterFunc(m.hub.o.WriteTimeout, m.stalled)
	} else {
		wd.Reset(m.hub.o.WriteTimeout)
	}
	err := m.c.Write(context.Background(), websocket.MessageText, b)
	if wd.Stop() {
		m.watchdogs.Put(wd)
	}
	if err != nil {
		// coder/websocket closes the connection on any failed write.
		m.drop(err, websocket.StatusInternalError)
		return m.Err()
	}
	return nil
}

// stalled drops the machine whose write waited WriteTimeout.
func (m *Machine) stalled() {
	m.drop(fmt.Errorf("the tunnel took nothing for %v (a stalled or too slow connection)", m.hub.o.WriteTimeout), websocket.StatusInternalError)
}

func (m *Machine) heartbeat() {
	period := m.hub.o.Heartbeat
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-m.done:
			return
		case <-t.C:
		}
		before := m.readBytes.Load()
		ctx, cancel := context.WithTimeout(context.Background(), period)
		err := m.c.Ping(ctx)
		cancel()
		if err != nil && m.readBytes.Load() != before && m.Err() == nil {
			// Data flowed while the pong did not come: it waits behind
			// a long message. Not half-open; the next ping decides.
			continue
		}
		if err != nil {
			if m.Err() == nil {
				m.drop(fmt.Errorf("no pong within the heartbeat period of %v (a half-open or stalled connection)", period), websocket.StatusInternalError)
			}
			return
		}
	}
}

func (m *Machine) readLoop() error {
	for {
		f, err := readFrameCounting(context.Background(), m.c, &m.readBytes)
		if err != nil {
			if errors.Is(err, ErrTooLarge) {
				return fmt.Errorf("the connector sent %w", err)
			}
			var ce websocket.CloseError
			if errors.As(err, &ce) {
				return fmt.Errorf("the connector closed the tunnel (%d %s)", ce.Code, ce.Reason)
			}
			if m.Err() != nil {
				return m.Err()
			}
			return fmt.Errorf("tunnel read: %w", err)
		}
		switch f.T {
		case wire.THeartbeat:
			m.host.Store(f.Host)
			m.lastBeat.Store(time.Now().UnixNano())
		case wire.TOpened, wire.TMsg, wire.TClosed:
			m.mu.Lock()
			s := m.sessions[f.S]
			m.mu.Unlock()
			if s == nil {
				m.hub.Dropped.Add(1)
				m.hub.o.Log.Warn("tunnel: a frame for a session the gateway does not have; dropped", "upstream", m.Upstream, "machine", m.ID, "type", f.T, "session", f.S)
				continue
			}
			s.receive(f)
		default:
			return fmt.Errorf("the connector sent a %s frame, which only the gateway sends", f.T)
		}
	}
}

// ErrTooManySessions is returned by Open at the bound of sessions per machine.
var ErrTooManySessions = errors.New("too many sessions on this machine")

// Open starts a gateway session on the machine: the connector starts its
// own connection to the server for it (for a stdio server, a child).
func (m *Machine) Open(ctx context.Context) (*Session, error) {
	s := &Session{m: m, id: strconv.FormatUint(m.hub.nextSession.Add(1), 10), in: make(chan []byte, m.hub.o.SessionQueue), opened: make(chan struct{}), closed: make(chan struct{})}
	m.mu.Lock()
	if m.err != nil {
		m.mu.Unlock()
		return nil, m.err
	}
	if len(m.sessions) >= m.hub.o.MaxSessions {
		m.mu.Unlock()
		return nil, fmt.Errorf("machine %q of upstream %q has %d sessions open, the most it may have: %w", m.ID, m.Upstream, m.hub.o.MaxSessions, ErrTooManySessions)
	}
	m.sessions[s.id] = s
	m.mu.Unlock()
	if err := m.writeCtx(ctx, wire.Encode(&wire.Frame{T: wire.TOpen, S: s.id})); err != nil {
		s.forget()
		return nil, err
	}
	select {
	case <-s.opened:
		return s, nil
	case <-s.closed:
		s.forget()
		return nil, s.Err()
	case <-ctx.Done():
		s.Close()
		return nil, fmt.Errorf("machine %q of upstream %q did not start the server in time: %w", m.ID, m.Upstream, ctx.Err())
	}
}

// Session is one gateway session on a machine.
type Session struct {
	m      *Machine
	id     string
	in     chan []byte
	inB    atomic.Int64
	opened chan struct{}
	open1  sync.Once

	closed    chan struct{}
	closeOnce sync.Once
	err       error

	fast atomic.Pointer[func([]byte) bool]
}

// SetFast has the machine's read loop offer each message of the session to
// f first, while none waits in the session's queue (so that f never takes
// a message before one that came earlier): f returns true if it took the
// message, at once and without blocking (an answer handed to the call
// waiting for it), saving the hand-over to the session's reader. f is
// offered only messages checked to be valid JSON in the strict sense
// (wire.Frame.Checked), with bytes it may keep: it may decode them with
// rpcwire.DecodeChecked.
func (s *Session) SetFast(f func(msg []byte) bool) { s.fast.Store(&f) }

// ID is the session's id on the tunnel.
func (s *Session) ID() string { return s.id }

// Machine is the machine the session runs on.
func (s *Session) Machine() *Machine { return s.m }

func (s *Session) receive(f *wire.Frame) {
	switch f.T {
	case wire.TOpened:
		s.open1.Do(func() { close(s.opened) })
	case wire.TClosed:
		reason := f.Reason
		if reason == "" {
			reason = "the connector ended the session"
		}
		s.fail(fmt.Errorf("machine %q of upstream %q ended the session: %s", s.m.ID, s.m.Upstream, reason))
		s.forget()
	case wire.TMsg:
		if fast := s.fast.Load(); fast != nil && f.Checked() && len(s.in) == 0 && (*fast)(f.M) {
			return
		}
		n := int64(len(f.M))
		if s.inB.Add(n) > int64(s.m.hub.o.SessionBytes) && len(s.in) > 0 {
			s.inB.Add(-n)
			s.overflow()
			return
		}
		select {
		case s.in <- f.M:
		case <-s.closed:
			s.inB.Add(-n)
		default:
			s.inB.Add(-n)
			s.overflow()
		}
	}
}

func (s *Session) overflow() {
	err := fmt.Errorf("machine %q of upstream %q: the gateway session did not take its messages (more than %d messages or %d MiB waiting); the session was closed", s.m.ID, s.m.Upstream, s.m.hub.o.SessionQueue, s.m.hub.o.SessionBytes>>20)
	s.m.hub.o.Log.Warn("tunnel: session overflow", "upstream", s.m.Upstream, "machine", s.m.ID, "session", s.id)
	s.fail(err)
	s.forget()
	go s.m.write(wire.Encode(&wire.Frame{T: wire.TClose, S: s.id, Reason: "the gateway session fell behind"}))
}

// Read returns the session's next JSON-RPC message (verbatim bytes), or why
// the session ended.
func (s *Session) Read(ctx context.Context) ([]byte, error) {
	select {
	case b := <-s.in:
		s.inB.Add(-int64(len(b)))
		return b, nil
	default:
	}
	select {
	case b := <-s.in:
		s.inB.Add(-int64(len(b)))
		return b, nil
	case <-s.closed:
		return nil, s.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Write sends one JSON-RPC message (a JSON object) to the session's server.
func (s *Session) Write(ctx context.Context, msg []byte) error {
	select {
	case <-s.closed:
		return s.err
	default:
	}
	if len(msg) > wire.MaxMessage {
		return fmt.Errorf("a message of %d bytes is over the tunnel's limit of %d", len(msg), wire.MaxMessage)
	}
	return s.m.writeCtx(ctx, wire.EncodeMsg(s.id, msg))
}

// Done is closed when the session ends; Err says why.
func (s *Session) Done() <-chan struct{} { return s.closed }

// Err says why the session ended (nil while open).
func (s *Session) Err() error {
	select {
	case <-s.closed:
		return s.err
	default:
		return nil
	}
}

func (s *Session) fail(err error) {
	s.closeOnce.Do(func() {
		s.err = err
		close(s.closed)
	})
}

func (s *Session) forget() {
	s.m.mu.Lock()
	if s.m.sessions[s.id] == s {
		delete(s.m.sessions, s.id)
	}
	s.m.mu.Unlock()
}

// Close ends the session; the connector stops its server connection.
func (s *Session) Close() error {
	first := false
	s.closeOnce.Do(func() {
		first = true
		s.err = fmt.Errorf("machine %q of upstream %q: session closed", s.m.ID, s.m.Upstream)
		close(s.closed)
	})
	s.forget()
	if first && s.m.Err() == nil {
		go s.m.write(wire.Encode(&wire.Frame{T: wire.TClose, S: s.id, Reason: "the gateway session ended"}))
	}
	return nil
}
