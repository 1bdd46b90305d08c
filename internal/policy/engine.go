package policy

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// Engine is the policy state of a running gateway: the current bundle, the
// mode, the agents' groups and the facts of every open session. It is safe
// for concurrent use; Reload swaps the bundle atomically.
type Engine struct {
	cur      atomic.Pointer[engineState]
	reloadMu sync.Mutex
	sessions sync.Map // session id -> *sessionFacts
	now      func() time.Time
}

type engineState struct {
	bundle *Bundle
	memo   *Memo // the bundle's live decisions; nil when it reads session or time
	mode   Mode
	groups map[string][]string // agent -> sorted groups
}

type sessionFacts struct {
	mu    sync.Mutex
	calls int64
	used  []string // sorted, unique
}

// NewEngine starts an engine on a loaded bundle. groups maps a group name to
// its member agents (the config's policy.groups).
func NewEngine(b *Bundle, mode Mode, groups map[string][]string) *Engine {
	e := &Engine{now: time.Now}
	e.cur.Store(newState(b, mode, groups))
	return e
}

func newState(b *Bundle, mode Mode, groups map[string][]string) *engineState {
	byAgent := map[string][]string{}
	for _, g := range slices.Sorted(maps.Keys(groups)) {
		for _, a := range groups[g] {
			if !slices.Contains(byAgent[a], g) {
				byAgent[a] = append(byAgent[a], g)
			}
		}
	}
	return &engineState{bundle: b, memo: b.NewLiveMemo(), mode: mode, groups: byAgent}
}

// decide decides r with the bundle, through its live memo when it has one.
func (st *engineState) decide(r *Request) Decision {
	if st.memo != nil {
		return st.memo.Decide(r)
	}
	return st.bundle.Decide(r)
}

// Bundle is the bundle in force.
func (e *Engine) Bundle() *Bundle { return e.cur.Load().bundle }

// Mode is the mode in force.
func (e *Engine) Mode() Mode { return e.cur.Load().mode }

// withGroups is the sorted union of an agent's configured groups and the
// groups its credential names (configured alone when it names none: no
// copy).
func withGroups(configured, credential []string) []string {
	if len(credential) == 0 {
		return configured
	}
	all := slices.Concat(configured, credential)
	slices.Sort(all)
	return slices.Compact(all)
}

// GroupsOf lists the groups of an agent, sorted.
func (e *Engine) GroupsOf(agent string) []string { return slices.Clone(e.cur.Load().groups[agent]) }

// Call is one tools/call as the gateway sees it.
type Call struct {
	Agent string
	// Groups are groups the agent's credential names (an OAuth token's
	// groups claim), Group parents beside the config's policy.groups.
	Groups        []string
	Session       string
	Tool          string // exposed name
	ToolName      string // name at the upstream
	Upstream      string
	EvidenceClass string
	Machine       string // the tunnel machine the call is routed to (context.machine)
	Annotations   Annotations
	Arguments     []byte // exact bytes of params.arguments
}

// Outcome is a decision with everything the call record needs.
type Outcome struct {
	Decision
	Mode   Mode
	Bundle digest.Digest
	// Refuse is true when the call must not reach the upstream: a deny in
	// enforcing mode.
	Refuse bool
	// Request is the request that was decided, with Arguments left out (the
	// call record holds their commitment). Replay rebuilds it from the record.
	Request Request
}

// DecideCall decides one call and updates the session's facts: the call
// counts in calls, and its tool joins tools_used unless the call is refused.
func (e *Engine) DecideCall(c Call) Outcome {
	st := e.cur.Load()
	f := e.facts(c.Session)
	f.mu.Lock()
	defer f.mu.Unlock()
	r := Request{
		Action: ActionCallTool, Agent: c.Agent, Groups: withGroups(st.groups[c.Agent], c.Groups),
		Tool: c.Tool, ToolName: c.ToolName, Upstream: c.Upstream, EvidenceClass: c.EvidenceClass, Machine: c.Machine,
		Annotations: c.Annotations, Arguments: c.Arguments,
		Session: Session{ID: c.Session, Calls: f.calls, ToolsUsed: f.used},
		Time:    e.now().UTC().Truncate(time.Millisecond),
	}
	d := st.decide(&r)
	out := Outcome{Decision: d, Mode: st.mode, Bundle: st.bundle.Digest(), Refuse: !d.Allow && st.mode == Enforcing}
	r.Arguments = nil
	r.Groups = slices.Clone(r.Groups)
	out.Request = r
	f.calls++
	if !out.Refuse {
		if i, found := slices.BinarySearch(f.used, c.Tool); !found {
			// copy on write: the Request handed out keeps the old slice
			used := make([]string, 0, len(f.used)+1)
			used = append(append(append(used, f.used[:i]...), c.Tool), f.used[i:]...)
			f.used = used
		}
	}
	return out
}

// Visible reports whether list_tools permits the agent to see a tool.
func (e *Engine) Visible(agent, session string, t Call) bool {
	st := e.cur.Load()
	f := e.facts(session)
	f.mu.Lock()
	r := Request{
		Action: ActionListTools, Agent: agent, Groups: withGroups(st.groups[agent], t.Groups),
		Tool: t.Tool, ToolName: t.ToolName, Upstream: t.Upstream, EvidenceClass: t.EvidenceClass,
		Annotations: t.Annotations,
		Session:     Session{ID: session, Calls: f.calls, ToolsUsed: f.used},
		Time:        e.now().UTC().Truncate(time.Millisecond),
	}
	f.mu.Unlock()
	return st.decide(&r).Allow
}

// Access is one read_resource or get_prompt request as the gateway sees it.
type Access struct {
	Action Action // ActionReadResource or ActionGetPrompt
	Agent  string
	// Groups are as a Call's: from the agent's credential.
	Groups        []string
	Session       string
	Upstream      string
	EvidenceClass string
	URI           string // read_resource
	Prompt        string // get_prompt: the name at the upstream
}

func (e *Engine) accessRequest(st *engineState, a Access) Request {
	f := e.facts(a.Session)
	f.mu.Lock()
	defer f.mu.Unlock()
	return Request{
		Action: a.Action, Agent: a.Agent, Groups: withGroups(st.groups[a.Agent], a.Groups),
		Upstream: a.Upstream, EvidenceClass: a.EvidenceClass, URI: a.URI, Prompt: a.Prompt,
		Session: Session{ID: a.Session, Calls: f.calls, ToolsUsed: f.used},
		Time:    e.now().UTC().Truncate(time.Millisecond),
	}
}

// DecideAccess decides one read_resource or get_prompt request. It sees the
// session's facts but does not change them: calls and tools_used count
// tools/call requests only. The Outcome's Request keeps the URI and the
// prompt (the access record holds the prompt in clear and a commitment to
// the URI).
func (e *Engine) DecideAccess(a Access) Outcome {
	st := e.cur.Load()
	r := e.accessRequest(st, a)
	d := st.decide(&r)
	r.Groups = slices.Clone(r.Groups)
	return Outcome{Decision: d, Mode: st.mode, Bundle: st.bundle.Digest(), Refuse: !d.Allow && st.mode == Enforcing, Request: r}
}

// AccessVisible reports whether an entry of resources/list,
// resources/templates/list or prompts/list may be shown to the agent: the
// read_resource or get_prompt decision permits it (whatever the mode, as
// for list_tools).
func (e *Engine) AccessVisible(a Access) bool {
	st := e.cur.Load()
	r := e.accessRequest(st, a)
	return st.decide(&r).Allow
}

// ReadsURI reports whether the bundle in force may read context.uri.
func (e *Engine) ReadsURI() bool { return e.cur.Load().bundle.ReadsURI() }

// ReadsPrompt reports whether the bundle in force may read context.prompt.
func (e *Engine) ReadsPrompt() bool { return e.cur.Load().bundle.ReadsPrompt() }

// EndSession forgets a session's facts.
func (e *Engine) EndSession(id string) { e.sessions.Delete(id) }

func (e *Engine) facts(id string) *sessionFacts {
	if v, ok := e.sessions.Load(id); ok {
		return v.(*sessionFacts)
	}
	v, _ := e.sessions.LoadOrStore(id, &sessionFacts{})
	return v.(*sessionFacts)
}

// Switch describes a reload.
type Switch struct {
	Old, New digest.Digest
	Mode     Mode
	Policies int
}

// Reload loads the bundle in dir and, only if it loads, validates and
// matches expect (when expect is set), puts it in force with the new mode
// and groups. On error the engine keeps its old bundle, mode and groups.
func (e *Engine) Reload(ctx context.Context, dir string, expect digest.Digest, mode Mode, groups map[string][]string) (Switch, error) {
	e.reloadMu.Lock()
	defer e.reloadMu.Unlock()
	old := e.cur.Load()
	b, err := Load(ctx, dir, LoadOptions{Expect: expect})
	if err != nil {
		return Switch{Old: old.bundle.Digest(), Mode: old.mode}, fmt.Errorf("reload refused, keeping bundle %s: %w", old.bundle.Digest(), err)
	}
	e.cur.Store(newState(b, mode, groups))
	return Switch{Old: old.bundle.Digest(), New: b.Digest(), Mode: mode, Policies: len(b.ids)}, nil
}

// Input is what the call record must carry beyond its own fields for replay
// to rebuild the request (pkg/auditlog/record.PolicyInput).
func (o *Outcome) Input() *record.PolicyInput {
	r := &o.Request
	a := r.Annotations
	return &record.PolicyInput{
		Groups: r.Groups, EvidenceClass: r.EvidenceClass, Machine: r.Machine,
		Hints:        record.ToolHints{ReadOnly: a.ReadOnly, Destructive: a.Destructive, Idempotent: a.Idempotent, OpenWorld: a.OpenWorld},
		SessionCalls: r.Session.Calls, ToolsUsed: r.Session.ToolsUsed, Time: r.Time, Errors: o.Errors,
	}
}

// AccessInput is what the access record must carry beyond its own fields
// for replay to rebuild the request (pkg/auditlog/record.AccessInput).
func (o *Outcome) AccessInput() *record.AccessInput {
	r := &o.Request
	return &record.AccessInput{Groups: r.Groups, EvidenceClass: r.EvidenceClass,
		SessionCalls: r.Session.Calls, ToolsUsed: r.Session.ToolsUsed, Time: r.Time, Errors: o.Errors}
}

// Effect is "allow" or "deny", as the call record spells it.
func (d Decision) Effect() string {
	if d.Allow {
		return record.DecisionAllow
	}
	return record.DecisionDeny
}
