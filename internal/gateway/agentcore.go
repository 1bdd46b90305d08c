package gateway

import (
	"context"
	"log/slog"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/front/httpfront"
	"github.com/confidential-mcp/cmcp/internal/front/stdiofront"
	"github.com/confidential-mcp/cmcp/internal/toagent"
)

//lint:file-ignore SA1019 go-sdk deprecates MCP logging, sampling and roots (SEP-2577) with no replacement; the gateway still relays them while clients use them

// relayAgent is a session as internal/toagent reaches it (toagent.Agent):
// what an upstream sends the agent on its own initiative goes through it.
// It is comparable: two of the same session are equal.
type relayAgent struct{ s *session }

// agentOf is s as the relay sees it.
func agentOf(s *session) toagent.Agent { return relayAgent{s} }

func (a relayAgent) Down() *mcp.ServerSession            { return a.s.downSession() }
func (a relayAgent) Logs(level mcp.LoggingLevel) bool    { return a.s.logs(level) }
func (a relayAgent) Requests() *stdiofront.AgentRequests { return &a.s.stdio.agentReqs }
func (a relayAgent) ListChanged(kind string)             { a.s.notifyListChanged(kind) }
func (a relayAgent) ResourceUpdated(p *mcp.ResourceUpdatedNotificationParams) {
	_ = a.s.srv.ResourceUpdated(context.Background(), p)
}

// liveConn is an upstream connection as its relay sees it (toagent.Conn).
type liveConn struct{ lv *live }

func (c liveConn) Upstream() string                             { return c.lv.st.name }
func (c liveConn) Logger() *slog.Logger                         { return c.lv.st.g.logger }
func (c liveConn) Stream(ctx context.Context) *httpfront.Stream { return sinkFrom(ctx) }
func (c liveConn) ToolsChanged()                                { c.lv.onToolsChanged(context.Background(), nil) }

func (c liveConn) Owner() toagent.Agent {
	if s := c.lv.owner.Load(); s != nil {
		return agentOf(s)
	}
	return nil
}

func (c liveConn) Agents() []toagent.Agent {
	ss := c.lv.st.g.sessionList()
	out := make([]toagent.Agent, len(ss))
	for i, s := range ss {
		out[i] = agentOf(s)
	}
	return out
}
