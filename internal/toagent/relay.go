// Package toagent carries what an upstream sends the agent it works for on
// its own initiative: progress and log notifications, its requests for
// sampling, elicitation and roots (which the agent answers), and the list
// changes and resource updates that concern the agent's session. A Relay
// serves one upstream connection: it tracks the requests forwarded on it,
// so that each message reaches the agent whose request it belongs to, on
// that request's own stream (a fast HTTP call's response stream, a stdio
// agent's connection, or go-sdk's session). It reaches the gateway only
// through Conn and Agent.
package toagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/faults"
	"github.com/confidential-mcp/cmcp/internal/front/httpfront"
	"github.com/confidential-mcp/cmcp/internal/front/stdiofront"
)

//lint:file-ignore SA1019 go-sdk deprecates MCP logging, sampling and roots (SEP-2577) with no replacement; the gateway still relays them while clients use them

// Agent is one agent session as the relay reaches it. Values of it are
// compared (==): the gateway's implementation is a comparable struct
// holding its session.
type Agent interface {
	// Down is go-sdk's session with the agent; nil until it initialized.
	Down() *mcp.ServerSession
	// Logs reports whether the agent asked for log messages at level.
	Logs(level mcp.LoggingLevel) bool
	// Requests are the requests sent to a stdio agent that it has not
	// answered, until its input ends (stdiofront); unused for HTTP.
	Requests() *stdiofront.AgentRequests
	// ListChanged tells the agent that the upstreams' "prompts" or
	// "resources" changed.
	ListChanged(kind string)
	// ResourceUpdated tells the agent that a resource changed.
	ResourceUpdated(p *mcp.ResourceUpdatedNotificationParams)
}

// Conn is the upstream connection a relay serves.
type Conn interface {
	// Upstream is the upstream's name.
	Upstream() string
	// Owner is the session of a per-session connection; nil for a
	// shared one (or a probe's, or a warm spare not yet handed out).
	Owner() Agent
	// Agents are every live agent session (a shared connection's list
	// changes and resource updates go to each).
	Agents() []Agent
	// ToolsChanged handles the upstream's notifications/tools/list_changed
	// (the gateway lists and checks the tools again); it returns at once.
	ToolsChanged()
	// Stream is the response stream of the fast HTTP call ctx belongs
	// to, or nil.
	Stream(ctx context.Context) *httpfront.Stream
	Logger() *slog.Logger
}

// Relay relays one upstream connection's messages to the agents.
type Relay struct {
	c Conn

	mu     sync.Mutex
	calls  map[uint64]*pending
	tokens map[string]*pending
	next   atomic.Uint64
}

// New returns the relay of connection c.
func New(c Conn) *Relay {
	return &Relay{c: c, calls: map[uint64]*pending{}, tokens: map[string]*pending{}}
}

// pending is a forwarded request whose server-to-client traffic (progress,
// logging, sampling, elicitation, roots) must reach the agent on the
// request's own stream.
type pending struct {
	id    uint64
	ctx   context.Context
	a     Agent
	token any // the agent's progress token
	upTok string
}

// Track registers a request forwarded for agent a and returns the progress
// token to send upstream (nil if the agent sent none) and a release
// function, to call once the request is answered.
func (r *Relay) Track(ctx context.Context, a Agent, agentToken any) (upTok any, release func()) {
	p := &pending{id: r.next.Add(1), ctx: ctx, a: a, token: agentToken}
	r.mu.Lock()
	r.calls[p.id] = p
	if agentToken != nil {
		p.upTok = fmt.Sprintf("cmcp-%d", p.id)
		r.tokens[p.upTok] = p
	}
	r.mu.Unlock()
	release = func() {
		r.mu.Lock()
		delete(r.calls, p.id)
		if p.upTok != "" {
			delete(r.tokens, p.upTok)
		}
		r.mu.Unlock()
	}
	if p.upTok == "" {
		return nil, release
	}
	return p.upTok, release
}

// InFlight is the number of tracked requests not yet released.
func (r *Relay) InFlight() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.calls)
}

// route picks where a server-to-client message goes: the request it belongs
// to (by progress token), else any in-flight request of this connection,
// else the owning session outside any request. It finds none (nil) when a
// shared connection has calls of several sessions in flight: busy is their
// number then.
func (r *Relay) route(tok any) (ctx context.Context, a Agent, busy int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t, ok := tok.(string); ok {
		if p, ok := r.tokens[t]; ok {
			return p.ctx, p.a, 0
		}
	}
	var best *pending
	sessions := map[Agent]bool{}
	for _, p := range r.calls {
		sessions[p.a] = true
		if best == nil || p.id > best.id {
			best = p
		}
	}
	// A shared upstream's request or log line without a progress token
	// cannot be tied to one call: it goes to an agent only when a single
	// session has calls in flight, never to a guess among several.
	owner := r.c.Owner()
	if best != nil && (owner != nil || len(sessions) == 1) {
		return best.ctx, best.a, 0
	}
	if owner != nil {
		return context.Background(), owner, 0
	}
	if best != nil {
		r.c.Logger().Warn("shared upstream sent a message that cannot be tied to one agent session; not forwarded", "upstream", r.c.Upstream(), "sessions", len(sessions))
	}
	return nil, nil, len(sessions)
}

func (r *Relay) forEach(f func(Agent)) {
	if owner := r.c.Owner(); owner != nil {
		f(owner)
		return
	}
	for _, a := range r.c.Agents() {
		f(a)
	}
}

// ClientCaps mirrors the agent's capabilities upstream, so an upstream only
// asks for sampling, elicitation or roots if the agent can answer.
func (r *Relay) ClientCaps() *mcp.ClientCapabilities {
	if owner := r.c.Owner(); owner != nil {
		if ss := owner.Down(); ss != nil {
			if ip := ss.InitializeParams(); ip != nil && ip.Capabilities != nil {
				c := *ip.Capabilities
				return &c
			}
		}
	}
	return &mcp.ClientCapabilities{Sampling: &mcp.SamplingCapabilities{}, Elicitation: &mcp.ElicitationCapabilities{}}
}

// rootsChangedMarker is the one root the connection's own client holds:
// see RootsChanged.
const rootsChangedMarker = "cmcp-internal:///roots-changed"

// RootsChanged sends the upstream of client notifications/roots/list_changed,
// if the connection declared roots.listChanged (ClientCaps: the agent's
// own capabilities). go-sdk's client sends it when the client's roots
// change; those roots are never what the upstream is told (ServerRequests
// forwards roots/list to the agent), so one marker root is set again.
func RootsChanged(client *mcp.Client) {
	client.AddRoots(&mcp.Root{URI: rootsChangedMarker, Name: "cmcp: the agent's roots changed"})
}

// ListChanged tells the agents of the connection that the upstream's
// "prompts" or "resources" changed.
func (r *Relay) ListChanged(kind string) {
	r.forEach(func(a Agent) { a.ListChanged(kind) })
}

// Intercept forwards progress and logging notifications in wire order,
// before the response they precede reaches the caller. It also takes the
// notifications an upstream may send on a call's own response stream,
// which a raw call reads and go-sdk's client session never sees (an HTTP
// upstream's): list changes (tools: the pins are checked again) and
// resource updates go to the same handlers the client session uses.
func (r *Relay) Intercept(msg jsonrpc.Message) bool {
	req, ok := msg.(*jsonrpc.Request)
	if !ok || req.IsCall() {
		return false
	}
	switch req.Method {
	case "notifications/tools/list_changed":
		r.c.ToolsChanged()
		return true
	case "notifications/prompts/list_changed":
		r.ListChanged("prompts")
		return true
	case "notifications/resources/list_changed":
		r.ListChanged("resources")
		return true
	case "notifications/resources/updated":
		var p mcp.ResourceUpdatedNotificationParams
		if json.Unmarshal(req.Params, &p) == nil {
			r.ResourceUpdated(context.Background(), &mcp.ResourceUpdatedNotificationRequest{Params: &p})
		}
		return true
	case "notifications/progress":
		var p mcp.ProgressNotificationParams
		if json.Unmarshal(req.Params, &p) == nil {
			r.OnProgress(&p)
		}
		return true
	case "notifications/message":
		var p mcp.LoggingMessageParams
		if json.Unmarshal(req.Params, &p) == nil {
			r.OnLog(&p)
		}
		return true
	}
	return false
}

// OnProgress forwards a progress notification to the request it belongs
// to, with the agent's own progress token.
func (r *Relay) OnProgress(params *mcp.ProgressNotificationParams) {
	r.mu.Lock()
	p := r.tokens[fmt.Sprint(params.ProgressToken)]
	r.mu.Unlock()
	if p == nil {
		return // progress for a request that is over, or not ours
	}
	out := *params
	out.ProgressToken = p.token
	if sk := r.c.Stream(p.ctx); sk != nil {
		_ = sk.Notify("notifications/progress", &out)
		return
	}
	if ss := p.a.Down(); ss != nil {
		_ = ss.NotifyProgress(p.ctx, &out)
	}
}

// OnLog forwards a log message to the agent route picks.
func (r *Relay) OnLog(params *mcp.LoggingMessageParams) {
	ctx, a, _ := r.route(nil)
	if a == nil {
		return
	}
	if sk := r.c.Stream(ctx); sk != nil {
		if a.Logs(params.Level) {
			_ = sk.Notify("notifications/message", params)
		}
		return
	}
	if ss := a.Down(); ss != nil {
		_ = ss.Log(ctx, params)
	}
}

// ResourceUpdated passes notifications/resources/updated on to the
// connection's agents.
func (r *Relay) ResourceUpdated(ctx context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
	r.forEach(func(a Agent) { a.ResourceUpdated(req.Params) })
}

// ServerRequests forwards the upstream's requests to the agent verbatim:
// sampling, elicitation (without the client's own schema validation, which
// rejects valid SEP-1330 schemas) and roots.
func (r *Relay) ServerRequests(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if !forwardedToAgent(method) {
			return next(ctx, method, req)
		}
		res, err := r.toAgent(ctx, method, req.GetParams())
		if errors.Is(err, errNotForwarded) {
			return next(ctx, method, req)
		}
		return res, err
	}
}

// ServerRequest answers a request an upstream sent on a raw call's
// response stream (upstream.ConnectOptions.ServerRequest): the same
// forwarding as ServerRequests, with the params decoded as the MCP client
// session would decode them.
func (r *Relay) ServerRequest(ctx context.Context, req *jsonrpc.Request) (json.RawMessage, error) {
	var params mcp.Params
	switch req.Method {
	case "elicitation/create":
		params = &mcp.ElicitParams{}
	case "sampling/createMessage":
		params = &mcp.CreateMessageWithToolsParams{}
	case "roots/list":
		params = &mcp.ListRootsParams{}
	default:
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: fmt.Sprintf("method %q is not supported", req.Method)}
	}
	if len(req.Params) > 0 {
		if err := json.Unmarshal(req.Params, params); err != nil {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("%s: invalid params: %v", req.Method, err)}
		}
	}
	res, err := r.toAgent(ctx, req.Method, params)
	if err != nil {
		return nil, err
	}
	return json.Marshal(res)
}

func forwardedToAgent(method string) bool {
	switch method {
	case "elicitation/create", "sampling/createMessage", "roots/list":
		return true
	}
	return false
}

// errNotForwarded: toAgent has no way to forward these params.
var errNotForwarded = errors.New("not forwarded")

// toAgent forwards an upstream's sampling, elicitation or roots request to
// the agent the upstream is working for and returns its answer. A request
// that came on a raw call's own response stream (an HTTP upstream) goes on
// that call's stream; otherwise route picks the call. Either way it lives
// as long as the upstream's request (ctx), not as long as the call whose
// stream carried it: a shorter call that ends meanwhile does not fail it,
// the agent's answer arriving on its own.
func (r *Relay) toAgent(ctx context.Context, method string, params mcp.Params) (mcp.Result, error) {
	if sk := r.c.Stream(ctx); sk != nil {
		if res, err := sk.Forward(ctx, method, params); !errors.Is(err, httpfront.ErrStreamClosed) {
			return res, err
		}
	}
	dctx, a, busy := r.route(nil)
	if busy > 1 {
		return nil, faults.New(faults.NotRoutable, "%s from upstream %q: the upstream is shared (lifecycle: shared) and %d agent sessions have calls in flight on it; "+
			"a stdio upstream's request does not say which call it belongs to, so it was sent to none of them; "+
			"use lifecycle: per-session or an HTTP upstream for sampling, elicitation and roots", method, r.c.Upstream(), busy)
	}
	if a == nil || a.Down() == nil {
		return nil, faults.New(faults.UpstreamUnavailable, "%s from upstream %q: no agent session to forward it to", method, r.c.Upstream())
	}
	inputGone := func() error {
		return faults.New(faults.SessionEnded, "%s from upstream %q: the agent closed its input (EOF on stdin) and can answer no request; the session ends once its calls are answered", method, r.c.Upstream())
	}
	reqs := a.Requests()
	if reqs.HasEnded() {
		return nil, inputGone()
	}
	// dctx's values (the call's stream), ctx's end, or the end of the
	// agent's input before it answered (stdiofront.AgentRequests, stdio only).
	dctx, cancel := context.WithCancelCause(context.WithoutCancel(dctx))
	defer cancel(nil)
	defer context.AfterFunc(ctx, func() { cancel(nil) })()
	req := stdiofront.NewAgentRequest(cancel)
	defer reqs.Done(req)
	dctx = stdiofront.WithAgentRequest(dctx, req)
	if sk := r.c.Stream(dctx); sk != nil {
		// The call route picked may just have ended (an upstream child
		// cannot say which call a request belongs to): then the request
		// goes through go-sdk, on the session's own stream.
		if res, err := sk.Forward(dctx, method, params); !errors.Is(err, httpfront.ErrStreamClosed) {
			return res, err
		}
	}
	ss := a.Down()
	var res mcp.Result
	var err error
	switch p := params.(type) {
	case *mcp.ElicitParams:
		res, err = ss.Elicit(dctx, p)
	case *mcp.CreateMessageWithToolsParams:
		res, err = ss.CreateMessageWithTools(dctx, p)
	case *mcp.CreateMessageParams:
		res, err = ss.CreateMessage(dctx, p)
	case *mcp.ListRootsParams:
		res, err = ss.ListRoots(dctx, p)
	default:
		return nil, errNotForwarded
	}
	if err != nil && errors.Is(context.Cause(dctx), stdiofront.ErrInputEnded) {
		return nil, inputGone()
	}
	return res, err
}
