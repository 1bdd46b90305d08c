package upstream

import (
	"context"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Relay returns the child's stdin and stdout as an mcp.Connection that
// passes messages through (for `cmcp connect`, which relays a gateway's
// session to the child it spawned): the same strict framing as the
// gateway's own connection, whose failure (a line that is not JSON-RPC,
// the child's exit) is the Read error and stops the child. Closing it
// stops the child. Call Handshook once the child answered initialize.
func (c *Child) Relay(ctx context.Context) (mcp.Connection, error) {
	// A relay sends no raw calls of its own: every answer, whatever its
	// id (the gateway's raw calls use rawIDPrefix too), is the gateway's.
	return (&childTransport{child: c, rawPrefix: relayNoRawPrefix}).Connect(ctx)
}

// relayNoRawPrefix is a raw-call prefix no id sent through a relay has.
const relayNoRawPrefix = "\x00cmcp-relay-sends-no-raw-calls"

// Handshook is Connect's check once the child answered the MCP handshake:
// the files it may have read by path are still what was measured. On a
// change the child is stopped and the refusal returned (and recorded
// through Hooks.Spawn).
func (c *Child) Handshook() error {
	c.handshook.Store(true)
	return c.verifyMeasured()
}
