// Package toollist keeps the tools one agent session is shown in step with
// the gateway's newest catalog: a List registers them with the session's
// MCP server (go-sdk then sends the agent notifications/tools/list_changed),
// and, when a list filter (the policy's list_tools decisions) decides what
// the agent sees, re-checks that after the session's calls and tells the
// agent when it changed. It reaches the gateway core only through Session.
package toollist

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/catalog"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// Session is what a List asks of its session in the gateway core.
type Session interface {
	// Catalog is the newest catalog.
	Catalog() *catalog.Catalog
	// Want is what the session may be shown of cat (and of the gateway's
	// own tools), by exposed name.
	Want(cat *catalog.Catalog) map[string]*catalog.Entry
	// Tool is the definition the session registers for e.
	Tool(e *catalog.Entry) *mcp.Tool
	// Shown is the definition tools/list shows for the exposed name in
	// cat, nil if none.
	Shown(cat *catalog.Catalog, name string) *mcp.Tool
	// Filter is what the list filter lets the agent see of tools.
	Filter(tools []*mcp.Tool) []*mcp.Tool
	// Bound reports whether the agent's session is initialised.
	Bound() bool
}

// RecheckDelay coalesces the re-checks of one session's tool list after
// its calls: at most one per delay, however many calls it makes.
const RecheckDelay = 200 * time.Millisecond

// A List is one session's registered tools. Its locks: syncMu runs one
// Sync at a time; mu guards visible; listMu guards listed.
type List struct {
	srv      *mcp.Server
	handler  mcp.ToolHandler
	sess     Session
	logger   *slog.Logger
	filtered bool // a list filter decides what tools/list shows

	syncMu  sync.Mutex
	mu      sync.Mutex
	visible map[string]digest.Digest // registered tools: exposed name -> Definition

	// What tools/list last showed the agent (or what it was last told
	// changed), as sorted names, once it has listed; see Recheck.
	listMu    sync.Mutex
	listed    string
	hasListed atomic.Bool
	recheck   atomic.Bool // a re-check is scheduled
}

// New is the tool list of the session sess, registered with srv and
// answered by handler; filtered says a list filter decides what
// tools/list shows (Session.Filter is called only then).
func New(srv *mcp.Server, handler mcp.ToolHandler, sess Session, logger *slog.Logger, filtered bool) *List {
	return &List{srv: srv, handler: handler, sess: sess, logger: logger, filtered: filtered, visible: map[string]digest.Digest{}}
}

// Names are the registered tools' exposed names, sorted.
func (l *List) Names() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	names := make([]string, 0, len(l.visible))
	for n := range l.visible {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Sync makes the registered tools match what the session may be shown
// of the newest catalog. Adding, removing or replacing tools makes the
// SDK send notifications/tools/list_changed to the agent. A tool whose
// definition changed (a shared upstream's tool that drift: warn let
// through) is replaced: the agent is shown what the policy decides on,
// and told that it changed.
func (l *List) Sync() {
	// Serialised, with the catalog read inside: of two rebuilds syncing at
	// once, the later sync reads the newest catalog, so an older list never
	// lands last (found in review).
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	want := l.sess.Want(l.sess.Catalog())
	l.mu.Lock()
	defer l.mu.Unlock()
	var gone []string
	for name := range l.visible {
		if _, ok := want[name]; !ok {
			gone = append(gone, name)
			delete(l.visible, name)
		}
	}
	if len(gone) > 0 {
		l.srv.RemoveTools(gone...)
	}
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, name := range names {
		e := want[name]
		if d, ok := l.visible[name]; ok && d.Equal(e.Definition) {
			continue
		}
		if err := addTool(l.srv, l.sess.Tool(e), l.handler); err != nil {
			l.logger.Error("expose tool", "tool", name, "err", err)
			if _, ok := l.visible[name]; ok {
				// Not the old definition instead of the new one.
				l.srv.RemoveTools(name)
				delete(l.visible, name)
			}
			continue
		}
		l.visible[name] = e.Definition
	}
}

// NotifyChanged sends the agent notifications/tools/list_changed although
// the registered tools did not change (what tools/list shows may have: a
// new policy bundle). The SDK sends it when a tool is (re)added, so one
// visible tool is registered again, unchanged.
func (l *List) NotifyChanged() {
	cat := l.sess.Catalog()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range cat.Entries() {
		if _, ok := l.visible[e.Exposed]; !ok {
			continue
		}
		if err := addTool(l.srv, l.sess.Tool(e), l.handler); err != nil {
			l.logger.Error("notify tools/list_changed", "tool", e.Exposed, "err", err)
		}
		return
	}
}

func addTool(srv *mcp.Server, t *mcp.Tool, h mcp.ToolHandler) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("tool %q refused by the MCP server library: %v", t.Name, r)
		}
	}()
	srv.AddTool(t, h)
	return nil
}

// visibleNames is what tools/list would show the agent now: its registered
// tools that the list filter lets it see, as sorted names.
func (l *List) visibleNames() string {
	cat := l.sess.Catalog()
	names := l.Names()
	tools := make([]*mcp.Tool, 0, len(names))
	for _, n := range names {
		if t := l.sess.Shown(cat, n); t != nil {
			tools = append(tools, t)
		}
	}
	return namesKey(l.sess.Filter(tools))
}

// namesKey is a list of tools as its sorted names.
func namesKey(tools []*mcp.Tool) string {
	names := make([]string, len(tools))
	for i, t := range tools {
		names[i] = t.Name
	}
	slices.Sort(names)
	return strings.Join(names, "\x00")
}

// Listed remembers what the agent was just shown by tools/list: shown,
// when it was the whole list (one page), else what the whole list is now.
func (l *List) Listed(shown []*mcp.Tool, whole bool) {
	var v string
	if whole {
		v = namesKey(shown)
	} else {
		v = l.visibleNames()
	}
	l.listMu.Lock()
	l.listed = v
	l.listMu.Unlock()
	l.hasListed.Store(true)
}

// Recheck sends the agent notifications/tools/list_changed when what it
// may see differs from what it was last shown: the policy's list_tools
// decisions can depend on the session's own calls and on the time.
func (l *List) Recheck() {
	if !l.filtered || !l.hasListed.Load() || !l.sess.Bound() {
		return
	}
	v := l.visibleNames()
	l.listMu.Lock()
	changed := v != l.listed
	l.listed = v
	l.listMu.Unlock()
	if changed {
		l.NotifyChanged()
	}
}

// CallsChanged schedules a Recheck after a call changed the session's
// facts (calls made, tools used).
func (l *List) CallsChanged() {
	if !l.filtered || !l.hasListed.Load() || !l.recheck.CompareAndSwap(false, true) {
		return
	}
	time.AfterFunc(RecheckDelay, func() {
		l.recheck.Store(false)
		l.Recheck()
	})
}
