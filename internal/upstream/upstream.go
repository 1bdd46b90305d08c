package upstream

import (
	"context"
	"encoding/json"
	"errors"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
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

	closeOnce sync.Once
	closeErr  error
	close     func() error
	fault     func() error
	raw       func(ctx context.Context, method string, params json.RawMessage) (json.RawMessage, error)
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
	// client session go through the client's own handlers instead.
	ServerRequest func(ctx context.Context, req *jsonrpc.Request) (json.RawMessage, error)
}
