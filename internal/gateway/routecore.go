package gateway

import (
	"context"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/policy"
	"github.com/confidential-mcp/cmcp/internal/route"
)

// routeSession is the session as internal/route sees it (route.Session):
// the router routes resource, prompt and completion requests through it
// and never touches the session's state.
type routeSession struct{ s *session }

func (r routeSession) Upstreams() []string { return r.s.g.order }

func (r routeSession) Has(name string, has func(*mcp.ServerCapabilities) bool) bool {
	st := r.s.g.ups[name]
	if st == nil {
		return false
	}
	st.mu.Lock()
	init := st.init
	st.mu.Unlock()
	return init != nil && init.Capabilities != nil && has(init.Capabilities)
}

func (r routeSession) Known(name string) bool { return r.s.g.ups[name] != nil }

func (r routeSession) Namespaced(name string) bool {
	st := r.s.g.ups[name]
	return st != nil && st.opts.Namespaced
}

func (r routeSession) Forward(ctx context.Context, name string, tok any, f func(ctx context.Context, c route.Conn, upTok any) error) error {
	_, err := forward(r.s, ctx, name, tok, func(ctx context.Context, lv *live, upTok any) (struct{}, error) {
		return struct{}{}, f(ctx, routeConn{lv: lv, s: r.s}, upTok)
	})
	return err
}

func (r routeSession) Visible(action policy.Action, name string, keys []string) []bool {
	return r.s.gate().Visible(action, name, keys)
}

func (r routeSession) Gate(ctx context.Context, a route.Access, ups []string) ([]string, error) {
	return r.s.gate().Access(ctx, a, ups)
}

// routeConn is one of the session's upstream connections as the router
// uses it (route.Conn).
type routeConn struct {
	lv *live
	s  *session
}

func (c routeConn) Client() *mcp.ClientSession { return c.lv.conn.Session }
func (c routeConn) Shared() bool               { return c.lv.owner.Load() == nil }
func (c routeConn) Subscribe(uri string) bool  { return c.lv.subscribe(c.s, uri) }
func (c routeConn) Unsubscribe(uri string) bool {
	return len(c.lv.unsubscribe(c.s, uri)) > 0
}
