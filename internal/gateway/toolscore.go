package gateway

import (
	"context"
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/catalog"
	"github.com/confidential-mcp/cmcp/internal/machines"
	"github.com/confidential-mcp/cmcp/internal/upstream"
)

// listSession is a session as its tool list (internal/toollist) sees it
// (toollist.Session).
type listSession struct{ s *session }

// testHookCatalogRead, set only by tests, runs in a sync (toollist's Sync,
// reached by syncTools) right after the catalog is read: a test holds a
// sync there to order two of them.
var testHookCatalogRead atomic.Pointer[func(*session)]

func (l listSession) Catalog() *catalog.Catalog       { return l.s.g.Catalog() }
func (l listSession) Tool(e *catalog.Entry) *mcp.Tool { return l.s.g.exposedTool(e) }
func (l listSession) Bound() bool                     { return l.s.downSession() != nil }

func (l listSession) Filter(tools []*mcp.Tool) []*mcp.Tool {
	return l.s.g.opts.Filter.FilterTools(context.Background(), l.s.principal, l.s.info(), tools)
}

// Want is the catalog minus the tools the session's own connections
// refused for drift, and the list_machines tool of each tunnel upstream.
func (l listSession) Want(cat *catalog.Catalog) map[string]*catalog.Entry {
	s := l.s
	if h := testHookCatalogRead.Load(); h != nil {
		(*h)(s)
	}
	want := map[string]*catalog.Entry{}
	for _, e := range cat.Entries() {
		s.mu.Lock()
		lv := s.lives[e.Upstream]
		s.mu.Unlock()
		if lv != nil && !lv.allows(e.Name) {
			continue
		}
		want[e.Exposed] = e
	}
	for _, up := range s.g.order {
		if _, ok := s.g.ups[up].opts.Upstream.(*upstream.Tunnel); ok {
			e := machines.Entry(up)
			want[e.Exposed] = e // the gateway's, answered from its tunnels
		}
	}
	return want
}

func (l listSession) Shown(cat *catalog.Catalog, name string) *mcp.Tool {
	if st, _ := l.s.g.listMachinesOf(name); st != nil {
		return machines.Entry(st.name).Tool
	}
	if e, ok := cat.Lookup(name); ok {
		return e.Tool
	}
	return nil
}
