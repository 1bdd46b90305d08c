package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/rpcwire"
	"github.com/confidential-mcp/cmcp/internal/tunnel"
	"github.com/confidential-mcp/cmcp/pkg/digest"
	"github.com/confidential-mcp/cmcp/pkg/framing"
)

// ClassTunnel is the evidence class of an upstream reached through a
// machine's tunnel: what the connector says it measured is its claim,
// recorded as such, never the gateway's own measurement.
const ClassTunnel = "tunnel"

// ErrNoMachine is wrapped by the error of a Connect or route to a tunnel
// upstream with no live machine of the id asked for (or none at all).
var ErrNoMachine = errors.New("no such live machine")

// Tunnel is an upstream served by the machines that registered under it
// with `cmcp connect` (tunnel.Hub). A connection starts on one machine
// (the one asked for, or the first live one by id) and reaches the others
// through Conn.Machine, each with its own session on that machine.
type Tunnel struct {
	name string
	hub  *tunnel.Hub
	// OpenTimeout bounds the start of a session on a machine (0: 30 s).
	OpenTimeout time.Duration
	// Log receives the warnings of dropped answers.
	Log interface {
		Warn(msg string, args ...any)
	}

	mu           sync.Mutex
	baseline     map[string]string // tool name -> digest of its definition, from the first machine admitted
	baselineFrom string
}

// NewTunnel returns the tunnel upstream name whose machines register with hub.
func NewTunnel(name string, hub *tunnel.Hub) *Tunnel { return &Tunnel{name: name, hub: hub} }

// Name implements Upstream.
func (t *Tunnel) Name() string { return t.name }

// Hub is the hub the upstream's machines register with.
func (t *Tunnel) Hub() *tunnel.Hub { return t.hub }

type machineKey struct{}

// WithMachine asks Connect for machine id.
func WithMachine(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, machineKey{}, id)
}

// Connect implements Upstream: a session on the machine named by
// WithMachine, or else on the first live machine.
func (t *Tunnel) Connect(ctx context.Context, client *mcp.Client, opts ConnectOptions) (*Conn, error) {
	id, _ := ctx.Value(machineKey{}).(string)
	first, err := t.connectOn(ctx, id, client, opts)
	if err != nil {
		return nil, err
	}
	// The others, on demand, each with a client like the first one's.
	var mu sync.Mutex
	subs := map[string]*Conn{first.Machine: first}
	first.machine = func(ctx context.Context, id string) (*Conn, error) {
		mu.Lock()
		defer mu.Unlock()
		if c := subs[id]; c != nil && c.Fault() == nil {
			return c, nil
		}
		c, err := t.connectOn(ctx, id, mcp.NewClient(&mcp.Implementation{Name: "cmcp", Version: "tunnel"}, nil), opts)
		if err != nil {
			return nil, err
		}
		subs[id] = c
		return c, nil
	}
	closeFirst := first.close
	first.close = func() error {
		mu.Lock()
		var others []*Conn
		for id, c := range subs {
			if c != first {
				others = append(others, c)
			}
			delete(subs, id)
		}
		mu.Unlock()
		errs := []error{closeFirst()}
		for _, c := range others {
			errs = append(errs, c.Close())
		}
		return errors.Join(errs...)
	}
	return first, nil
}

// LiveMachines names the live machines, for errors.
func (t *Tunnel) LiveMachines() []string {
	var ids []string
	for _, m := range t.hub.Machines(t.name) {
		ids = append(ids, m.ID)
	}
	return ids
}

func (t *Tunnel) connectOn(ctx context.Context, id string, client *mcp.Client, opts ConnectOptions) (*Conn, error) {
	var m *tunnel.Machine
	if id == "" {
		if ms := t.hub.Machines(t.name); len(ms) > 0 {
			m = ms[0]
		}
	} else {
		m = t.hub.Machine(t.name, id)
	}
	if m == nil {
		live := t.LiveMachines()
		what := "no machine is connected"
		if len(live) > 0 {
			what = "live machines: " + strings.Join(live, ", ")
		}
		if id != "" {
			return nil, fmt.Errorf("upstream %q: machine %q is not connected (%s): %w", t.name, id, what, ErrNoMachine)
		}
		return nil, fmt.Errorf("upstream %q unavailable: %s; start `cmcp connect` on a machine that serves it: %w", t.name, what, ErrNoMachine)
	}
	timeout := t.OpenTimeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	octx, cancel := context.WithTimeout(ctx, timeout)
	s, err := m.Open(octx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("upstream %q: %w", t.name, err)
	}
	tc := &tunnelConn{s: s, Inbox: rpcwire.NewInbox(), intercept: opts.Intercept, raw: rpcwire.Pending{Prefix: rawIDPrefix}, name: t.name}
	if t.Log != nil {
		var last atomic.Int64
		tc.raw.Dropped = func(rid string) {
			now := time.Now().UnixNano()
			if l0 := last.Load(); now-l0 < int64(time.Second) || !last.CompareAndSwap(l0, now) {
				return
			}
			t.Log.Warn("a machine answered a request that no longer waits (or was never sent); the answer was dropped",
				"upstream", t.name, "machine", m.ID, "id", framing.Excerpt([]byte(rid)))
		}
	}
	s.SetFast(tc.fastAnswer)
	go tc.readLoop()
	client.AddReceivingMiddleware(limitServerRequests())
	cs, err := client.Connect(ctx, &tunnelTransport{c: tc}, &mcp.ClientSessionOptions{ProtocolVersion: ProtocolVersion})
	if err != nil {
		s.Close()
		if f := s.Err(); f != nil && !strings.HasSuffix(f.Error(), "session closed") {
			return nil, f
		}
		return nil, fmt.Errorf("upstream %q: machine %q: initialize: %w", t.name, m.ID, err)
	}
	conn := NewConn(cs, ClassTunnel, "machine "+m.ID, s.Close, s.Err)
	conn.Machine = m.ID
	conn.raw = tc.rawCall
	return conn, nil
}

type tunnelTransport struct{ c *tunnelConn }

func (t *tunnelTransport) Connect(context.Context) (mcp.Connection, error) { return t.c, nil }

// tunnelConn is an mcp.Connection over one session on a machine's tunnel,
// with raw calls beside the SDK's, as childConn has.
type tunnelConn struct {
	s              *tunnel.Session
	*rpcwire.Inbox // Read
	intercept      func(jsonrpc.Message) bool
	raw            rpcwire.Pending
	name           string
}

func (c *tunnelConn) readLoop() {
	for {
		b, err := c.s.Read(context.Background())
		if err != nil {
			c.raw.Fail(err)
			c.Fail(err)
			return
		}
		msg, err := rpcwire.DecodeMessage(b)
		if err != nil {
			err = fmt.Errorf("upstream %q: machine %q sent something that is not a JSON-RPC message (it starts %s); the session was closed", c.name, c.s.Machine().ID, framing.Excerpt(b))
			c.s.Close()
			c.raw.Fail(err)
			c.Fail(err)
			return
		}
		if resp, ok := msg.(*jsonrpc.Response); ok && c.raw.Deliver(resp) {
			continue
		}
		if c.intercept != nil && c.intercept(msg) {
			continue
		}
		if !c.Deliver(msg) {
			c.raw.Fail(fmt.Errorf("upstream %q: connection closed", c.name))
			return
		}
	}
}

// fastAnswer hands an answer to one of the raw calls straight to its
// caller from the machine's read loop (tunnel.Session.SetFast: b was
// checked to be valid JSON, and is not reused).
func (c *tunnelConn) fastAnswer(b []byte) bool {
	if !bytes.Contains(b, []byte(`"`+c.raw.Prefix)) {
		return false
	}
	msg, ok := rpcwire.DecodeChecked(b)
	if !ok {
		return false
	}
	resp, ok := msg.(*jsonrpc.Response)
	return ok && c.raw.Deliver(resp)
}

func (c *tunnelConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	b, err := jsonrpc.EncodeMessage(msg)
	if err != nil {
		return err
	}
	return c.s.Write(ctx, b)
}

func (c *tunnelConn) Close() error {
	c.Inbox.Close()
	c.raw.Fail(fmt.Errorf("upstream %q: connection closed", c.name))
	return c.s.Close()
}

func (c *tunnelConn) SessionID() string { return "" }

func (c *tunnelConn) rawCall(ctx context.Context, method string, params json.RawMessage) (json.RawMessage, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	id, ch, err := c.raw.Register()
	if err != nil {
		return nil, err
	}
	if err := c.s.Write(ctx, encodeRequest(id, method, params)); err != nil {
		c.raw.Forget(id)
		return nil, err
	}
	Waiting(ctx)
	select {
	case resp, ok := <-ch:
		if !ok {
			return nil, c.raw.Err()
		}
		if resp.Error != nil {
			return nil, resp.Error
		}
		return resp.Result, nil
	case <-ctx.Done():
		c.raw.Forget(id)
		nctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cancelWriteWait)
		_ = c.s.Write(nctx, cancelledNotification(id, ctx.Err()))
		cancel()
		return nil, ctx.Err()
	}
}

// Admit checks a machine before it is routable: its server must publish
// exactly the tools (names and definitions, canonical JSON) of the first
// machine admitted for this upstream in this run, so that the upstream's
// tool pins, checked on the connections the gateway makes, hold for each
// of its machines. A machine whose tools differ is refused, and says which.
func (t *Tunnel) Admit(ctx context.Context, m *tunnel.Machine) error {
	s, err := m.Open(ctx)
	if err != nil {
		return err
	}
	tc := &tunnelConn{s: s, Inbox: rpcwire.NewInbox(), raw: rpcwire.Pending{Prefix: rawIDPrefix}, name: t.name}
	go tc.readLoop()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "cmcp", Version: "admit"}, nil).Connect(ctx, &tunnelTransport{c: tc}, &mcp.ClientSessionOptions{ProtocolVersion: ProtocolVersion})
	if err != nil {
		s.Close()
		return fmt.Errorf("machine %q: initialize: %w", m.ID, err)
	}
	defer cs.Close()
	defs := map[string]string{}
	for tool, err := range cs.Tools(ctx, nil) {
		if err != nil {
			return fmt.Errorf("machine %q: tools/list: %w", m.ID, err)
		}
		b, err := json.Marshal(tool)
		if err != nil {
			return err
		}
		c, err := digest.JSON(b)
		if err != nil {
			return err
		}
		defs[tool.Name] = c.String()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.baseline == nil {
		t.baseline, t.baselineFrom = defs, m.ID
		return nil
	}
	var diff []string
	for name, d := range defs {
		if b, ok := t.baseline[name]; !ok {
			diff = append(diff, name+" (not on "+t.baselineFrom+")")
		} else if b != d {
			diff = append(diff, name+" (another definition)")
		}
	}
	for name := range t.baseline {
		if _, ok := defs[name]; !ok {
			diff = append(diff, name+" (missing)")
		}
	}
	if len(diff) > 0 {
		slices.Sort(diff)
		return fmt.Errorf("machine %q publishes other tools than upstream %q's first machine %q: %s; every machine of an upstream must run the same server", m.ID, t.name, t.baselineFrom, strings.Join(diff, ", "))
	}
	return nil
}
