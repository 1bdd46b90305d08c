package upstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/credential"
)

// ProtocolVersion is the MCP protocol version the gateway speaks to every
// upstream. Newer versions turn logging, sampling and elicitation into
// per-request metadata that a legacy downstream session cannot receive, so
// the gateway pins this one (gateways.md §3.4).
const ProtocolVersion = "2025-11-25"

// Evidence classes of an upstream connection (see ARCHITECTURE.md). They are
// the same strings as pkg/evidence's constants.
const (
	ClassSpawnMeasured   = "spawn-measured"
	ClassSpawnUnmeasured = "spawn-unmeasured"
	ClassTLSPinned       = "tls-pinned"
	ClassTLSCA           = "tls-ca"
	ClassPlaintext       = "plaintext"
)

// Upstream is one configured MCP server. Connect starts or dials it and runs
// the MCP handshake with client; every call returns a fresh connection (a
// per-session child, or the one shared child when the caller keeps it).
type Upstream interface {
	// Name is the configured upstream name.
	Name() string
	// Connect returns a live, initialised connection. Errors say which
	// upstream failed and why, in words an agent can act on.
	Connect(ctx context.Context, client *mcp.Client, opts ConnectOptions) (*Conn, error)
}

// Conn is a live connection to an upstream.
type Conn struct {
	// Session is the MCP client session to the upstream.
	Session *mcp.ClientSession
	// Class is the evidence class of this connection.
	Class string
	// Ref identifies this connection in the audit log (for a child: its
	// spawn record's details; for HTTP: the endpoint).
	Ref string
	// Machine is the machine of a tunnel upstream's connection ("" for
	// other kinds).
	Machine string

	closeOnce sync.Once
	closeErr  error
	close     func() error
	fault     func() error
	raw       func(ctx context.Context, method string, params json.RawMessage) (json.RawMessage, error)
	rawThen   func(ctx context.Context, method string, params json.RawMessage, done func(json.RawMessage, error))
	machine   func(ctx context.Context, id string) (*Conn, error)
	assign    func(session string)
	changed   func() string
}

// OnMachine returns the connection to machine id of the same tunnel
// upstream, opening a session on it at first use (the connection itself
// when it is on that machine). Only a tunnel upstream's connections have
// machines: for any other it fails.
func (c *Conn) OnMachine(ctx context.Context, id string) (*Conn, error) {
	if c.machine == nil {
		return nil, errors.New("not a tunnel upstream: it has no machines")
	}
	return c.machine(ctx, id)
}

// Assign names the agent session a connection made before any session (a
// warm spare) now serves: a child's exit and stderr records then name it.
func (c *Conn) Assign(session string) {
	if c.assign != nil {
		c.assign(session)
	}
}

// Changed says why the code this connection runs no longer matches what is
// on disk at its paths (for a child: its command file, or a "#!" script's
// interpreter, was changed, replaced or removed since it was measured), or
// is "". A connection made ahead of demand is not handed out then: a new
// one measures the files again, and a pin refuses them.
func (c *Conn) Changed() string {
	if c.changed == nil {
		return ""
	}
	return c.changed()
}

// NewConn is for Upstream implementations: it wraps a session, its evidence
// class, a reference for the audit log, the function that tears the
// connection down and the function that reports why it died (nil while
// healthy).
func NewConn(s *mcp.ClientSession, class, ref string, closeFn, faultFn func() error) *Conn {
	return &Conn{Session: s, Class: class, Ref: ref, close: closeFn, fault: faultFn}
}

// Close releases the upstream (for a child: stops the whole process group)
// and ends the session. It is safe to call more than once. The upstream
// goes first: the session's close waits for its answers to the upstream's
// requests, which a child that stopped reading would hold up until
// writeTimeout; stopping the child ends them at once.
func (c *Conn) Close() error {
	c.closeOnce.Do(func() {
		var errs []error
		if c.close != nil {
			errs = append(errs, c.close())
		}
		if c.Session != nil {
			errs = append(errs, c.Session.Close())
		}
		c.closeErr = errors.Join(errs...)
	})
	return c.closeErr
}

// Fault returns why the connection died (a desynchronised stdout, a child
// that exited), or nil while it is healthy.
func (c *Conn) Fault() error {
	if c.fault == nil {
		return nil
	}
	return c.fault()
}

// ConnectOptions are what the gateway asks of every connection.
type ConnectOptions struct {
	// Intercept, if set, sees every message from the upstream in wire
	// order before the MCP client does; returning true consumes it. The
	// gateway uses it for progress and logging notifications, which the
	// client would otherwise dispatch after the response they precede. On
	// an HTTP upstream it sees the messages on raw calls' streams; those
	// on the client session's own streams go to the client's handlers.
	Intercept func(jsonrpc.Message) bool
	// ServerRequest, if set, answers a request the upstream sends on the
	// response stream of a raw call (an HTTP upstream's elicitation/create,
	// sampling/createMessage or roots/list while it works on a tools/call):
	// it returns the result to send back, or the error (a *jsonrpc.Error
	// is sent as it is). ctx is the raw call's. Requests that reach the MCP
	// client session go through the client's own handlers instead. Either
	// way at most maxServerRequests run at once, per call here and per
	// connection there.
	ServerRequest func(ctx context.Context, req *jsonrpc.Request) (json.RawMessage, error)
	// Identity is who the connection serves: an HTTP upstream with a
	// credential source mints its credential for this identity (and
	// refuses to connect without one).
	Identity *credential.Identity
}

// maxServerRequests bounds the requests (sampling, elicitation, roots) an
// upstream may have waiting for their answers at once: on one call's event
// stream (an HTTP upstream's raw call), and on a connection's MCP client
// session (a stdio child, whose requests name no call, and an HTTP
// upstream's own streams). An MCP server asks the agent one question
// at a time while a tool runs, or a few in parallel; each one beyond the
// bound is answered at once with CodeTooManyServerRequests and never
// reaches the agent, and the call goes on: a server that fans out may
// retry it once an answer came, where failing the call would take the
// answers already given with it. Without the bound, one call's stream
// carrying 50,000 roots/list requests made 50,000 concurrent requests to
// the agent, each with a goroutine of its own.
const maxServerRequests = 16

// CodeTooManyServerRequests is the JSON-RPC error code an upstream's
// request is answered with when maxServerRequests of its requests already
// wait for their answers. It goes to the upstream, not to an agent.
const CodeTooManyServerRequests = -32072

// tooManyServerRequests is the error an upstream's request beyond the
// bound is answered with.
func tooManyServerRequests(method string) *jsonrpc.Error {
	return &jsonrpc.Error{Code: CodeTooManyServerRequests, Message: fmt.Sprintf(
		"cmcp: %s refused: %d requests from this upstream already wait for their answers, the most there may be; send it again once one is answered",
		method, maxServerRequests)}
}

// limitServerRequests is receiving middleware for a connection's MCP client
// session: at most maxServerRequests of the upstream's requests are
// handled at once, the others are refused (tooManyServerRequests) without
// reaching the handler, which forwards them to the agent.
func limitServerRequests() mcp.Middleware {
	sem := make(chan struct{}, maxServerRequests)
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method == "ping" || strings.HasPrefix(method, "notifications/") {
				return next(ctx, method, req) // answered at once, by go-sdk
			}
			select {
			case sem <- struct{}{}:
				defer func() { <-sem }()
				return next(ctx, method, req)
			default:
				return nil, tooManyServerRequests(method)
			}
		}
	}
}
