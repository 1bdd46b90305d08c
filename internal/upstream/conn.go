package upstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/rpcwire"
	"github.com/confidential-mcp/cmcp/pkg/framing"
)

// childTransport is an mcp.Transport over a spawned child's stdin and stdout,
// with strict framing: one JSON-RPC object per line. A line that is not one
// is fatal for the child (the stream is never resynchronised): the read
// fails, the child is killed and the fault is recorded.
//
// The read loop itself takes the responses to raw calls (Conn.RawCall) and
// the messages the gateway intercepts (ConnectOptions.Intercept) off the
// wire, in order, before anything reaches the MCP client.
type childTransport struct {
	child     *Child
	intercept func(jsonrpc.Message) bool
	conn      *childConn // set by Connect
}

func (t *childTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c := &childConn{child: t.child, Inbox: rpcwire.NewInbox(), intercept: t.intercept, raw: rpcwire.Pending{Prefix: rawIDPrefix}}
	if l := t.child.hooks.Log; l != nil {
		// A late answer (its call was cancelled or timed out) is normal;
		// one to an id never sent, or a second one, is the child's fault.
		// Either way it is dropped, and said so.
		var last atomic.Int64 // unix nanoseconds of the last warning: one a second at most
		var quiet atomic.Int64
		c.raw.Dropped = func(id string) {
			now := time.Now().UnixNano()
			if l0 := last.Load(); now-l0 < int64(time.Second) || !last.CompareAndSwap(l0, now) {
				quiet.Add(1)
				return
			}
			l.Warn("upstream answered a request that no longer waits (it ended, was cancelled, was answered already, or was never sent); the answer was dropped",
				"upstream", t.child.name, "id", framing.Excerpt([]byte(id)), "dropped_since_last_warning", quiet.Swap(0))
		}
	}
	t.conn = c
	go c.readLoop()
	return c, nil
}

type childConn struct {
	child          *Child
	*rpcwire.Inbox // Read
	intercept      func(jsonrpc.Message) bool
	raw            rpcwire.Pending
}

func (c *childConn) readLoop() {
	r := framing.NewReader(c.child.stdout, maxFrame)
	for {
		line, err := r.Read()
		var msg jsonrpc.Message
		if err == nil {
			msg, err = rpcwire.DecodeMessage(line)
			if err != nil {
				err = &DesyncError{Offset: r.Offset() - int64(len(line)) - 1, Excerpt: framing.Excerpt(line), Cause: err}
			}
		}
		var fd *framing.DesyncError
		if errors.As(err, &fd) {
			err = &DesyncError{Offset: fd.Offset, Excerpt: fd.Excerpt, Cause: fd}
		}
		if err == nil {
			if resp, ok := msg.(*jsonrpc.Response); ok && c.raw.Deliver(resp) {
				continue
			}
			if c.intercept != nil && c.intercept(msg) {
				continue
			}
			if c.Deliver(msg) {
				continue
			}
			c.raw.Fail(fmt.Errorf("upstream %q: connection closed", c.child.name))
			return
		}
		var de *DesyncError
		if errors.As(err, &de) {
			de.Upstream = c.child.name
			c.child.fail(de)
		} else if errors.Is(err, io.EOF) || errors.Is(err, os.ErrClosed) {
			err = c.child.exitFault()
		} else {
			err = fmt.Errorf("upstream %q: read stdout: %w", c.child.name, err)
			c.child.fail(err)
		}
		c.raw.Fail(err)
		c.Fail(err)
		return
	}
}

func (c *childConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	b, err := jsonrpc.EncodeMessage(msg)
	if err != nil {
		return err
	}
	if err := c.child.write(ctx, b); err != nil {
		return fmt.Errorf("upstream %q: write stdin: %w", c.child.name, err)
	}
	return nil
}

func (c *childConn) Close() error {
	c.Inbox.Close()
	// go-sdk closes the connection when a write fails: the calls that
	// follow learn why, if the gateway stopped the child.
	err := fmt.Errorf("upstream %q: connection closed", c.child.name)
	if p := c.child.fault.Load(); p != nil {
		err = *p
	}
	c.raw.Fail(err)
	return c.child.Stop()
}

func (c *childConn) SessionID() string { return "" }

// DesyncError says that an upstream wrote something on stdout that is not a
// JSON-RPC message. The child is killed; the next use respawns it.
type DesyncError struct {
	Upstream string
	Offset   int64  // byte offset of the offending line in the child's stdout
	Excerpt  string // the start of the offending line, quoted
	Cause    error
}

func (e *DesyncError) Error() string {
	if errors.Is(e.Cause, framing.ErrTooLarge) {
		return fmt.Sprintf("upstream %q wrote a line longer than the limit of %d MiB for one message on stdout at byte %d (it starts %s): the child was stopped and will be respawned, re-measured, on the next call; each JSON-RPC message a stdio MCP server writes, results included, must fit in %d MiB",
			e.Upstream, maxFrame>>20, e.Offset, e.Excerpt, maxFrame>>20)
	}
	return fmt.Sprintf("upstream %q wrote a line that is not a JSON-RPC message on stdout at byte %d (it starts %s): the child was stopped and will be respawned, re-measured, on the next call; a stdio MCP server must write only JSON-RPC to stdout and its logs to stderr",
		e.Upstream, e.Offset, e.Excerpt)
}

func (e *DesyncError) Unwrap() error { return e.Cause }

// maxFrame bounds one JSON-RPC message read from a child (the go-sdk
// default); DesyncError names it in MiB.
const maxFrame = 16 << 20
