package upstream

import (
	"context"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// HTTPConnector makes an HTTPUpstream an Upstream: every Connect opens a new
// MCP session over the pinned transport, at ProtocolVersion, with the
// gateway's interceptor in front of the client.
type HTTPConnector struct{ H *HTTPUpstream }

// Name implements Upstream.
func (a HTTPConnector) Name() string { return a.H.Name() }

// Connect implements Upstream.
func (a HTTPConnector) Connect(ctx context.Context, client *mcp.Client, o ConnectOptions) (*Conn, error) {
	cs, err := client.Connect(ctx, Intercept(a.H.Transport(), o.Intercept), &mcp.ClientSessionOptions{ProtocolVersion: ProtocolVersion})
	if err != nil {
		return nil, a.H.explain(err)
	}
	return NewConn(cs, a.H.Class(), a.H.URL(), nil, nil), nil
}
