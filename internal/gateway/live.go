package gateway

import (
	"github.com/confidential-mcp/cmcp/internal/toolprobe"

	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/catalog"
	"github.com/confidential-mcp/cmcp/internal/front/httpfront"
	"github.com/confidential-mcp/cmcp/internal/front/stdiofront"
	"github.com/confidential-mcp/cmcp/internal/upstream"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

//lint:file-ignore SA1019 go-sdk deprecates MCP logging, sampling and roots (SEP-2577) with no replacement; the gateway still relays them while clients use them

// live is one connected upstream session: a per-session child (owner set)
// or the shared connection of an upstream (owner nil).
type live struct {
	st *upState
	// owner is the session of a per-session connection; nil for the
	// shared connection, a probe's, or a warm spare not yet handed out.
	owner  atomic.Pointer[session]
	conn   *upstream.Conn
	client *mcp.Client // conn's client, for notifyRootsChanged
	// ready is closed once conn is set and the first tool list applied:
	// a list_changed the upstream sends during the handshake waits for it.
	ready chan struct{}

	mu      sync.Mutex
	allowed map[string]bool // upstream tool names usable on this connection
	calls   map[uint64]*pending
	tokens  map[string]*pending
	closed  bool
	broken  error // a failure that makes the connection unusable
	// relisting: a re-list after list_changed is running; relistAgain:
	// another list_changed came meanwhile (see onToolsChanged).
	relisting, relistAgain bool
	// subs are a shared connection's resource subscriptions: the sessions
	// subscribed to each URI. The upstream sees one client, so it is
	// subscribed while any session is, and unsubscribed when the last one
	// unsubscribes or ends.
	subs map[string]map[*session]bool

	nextTok atomic.Uint64
	// refill, on a warm spare just handed out, makes its replacement:
	// called once its first call is answered (see spares.Funcs.RefillAfter).
	refill atomic.Pointer[func()]
}

// pending is a forwarded request whose server-to-client traffic (progress,
// logging, sampling, elicitation, roots) must reach the agent on the
// request's own stream.
type pending struct {
	id    uint64
	ctx   context.Context
	s     *session
	token any // the agent's progress token
	upTok string
}

// connect starts a new connection to the upstream for session s (nil for the
// catalog probe or the shared connection), checks its tools against the
// baseline and records what happened. Its outcome becomes the upstream's
// lastErr (the admin status), whoever called it.
func (st *upState) connect(ctx context.Context, s *session) (*live, error) {
	lv, err := st.dial(ctx, s)
	st.mu.Lock()
	st.lastErr = err
	st.mu.Unlock()
	if err != nil {
		st.reprobe()
	}
	return lv, err
}

// The background probe of an unavailable upstream waits reprobeFirst
// after the failure, then twice as long after each failed probe, up to
// reprobeMax.
const (
	reprobeFirst = time.Second
	reprobeMax   = 30 * time.Second
)

// reprobe makes sure the upstream, unavailable since its last connection
// failed, is tried again in the background until a connection succeeds
// (the probe's or a session's) or the gateway shuts down: without it
// /readyz and cmcp_upstream_up would stay "down" until an agent's call
// succeeded, which a readiness-gated load balancer never sends. One probe
// loop runs per upstream, with a bounded backoff (reprobeFirst doubling
// to reprobeMax). A probe of a per-session upstream is a connection
// without a session, as the startup probe's: a measured child, recorded
// (spawn, connected, disconnected, exit), stopped as soon as its tools are
// listed; a shared upstream's probe restarts its shared connection.
func (st *upState) reprobe() {
	g := st.g
	if g.closing.Load() || g.probeCtx.Err() != nil || st.perIdentity() {
		return // a per-identity upstream has no connection of its own to probe with
	}
	st.mu.Lock()
	if st.probing {
		st.mu.Unlock()
		return
	}
	st.probing = true
	st.mu.Unlock()
	g.probes.Add(1)
	go func() {
		defer g.probes.Done()
		delay := reprobeFirst
		t := time.NewTimer(delay)
		defer t.Stop()
		for {
			select {
			case <-g.probeCtx.Done():
				st.mu.Lock()
				st.probing = false
				st.mu.Unlock()
				return
			case <-t.C:
			}
			// Done once usable (a session's connection may have
			// succeeded meanwhile), under the lock that connect's failure
			// takes before calling reprobe: a failure after this check
			// starts a new loop.
			st.mu.Lock()
			if (st.loaded && st.lastErr == nil) || g.closing.Load() {
				st.probing = false
				st.mu.Unlock()
				return
			}
			st.mu.Unlock()
			if err := st.probe(g.probeCtx); err != nil {
				delay = min(2*delay, reprobeMax)
				g.logger.Warn("upstream still unavailable", "upstream", st.name, "next_probe", delay, "err", err)
				t.Reset(delay)
				continue
			}
			g.logger.Info("upstream available again", "upstream", st.name)
			t.Reset(0) // the check above ends the loop
		}
	}()
}

// probe connects to the upstream once, as the startup probe does, and
// makes it available if that works: the shared connection of a shared
// upstream stays; a per-session upstream's probe connection is closed.
func (st *upState) probe(ctx context.Context) error {
	if st.opts.Shared {
		// Waited for even when Shutdown cuts the probe: a connection
		// the probe starts ends with g.probeCtx (sharedConnect), one an
		// agent started is bounded by the connect timeout. Shutdown
		// closes the shared connection once probes are done.
		_, err := st.sharedConnect(context.WithoutCancel(ctx), true)
		return err
	}
	lv, err := st.connect(ctx, nil)
	if err != nil {
		return err
	}
	lv.close("readiness probe done")
	if !st.isLoaded() {
		st.markLoaded()
	}
	return nil
}

func (st *upState) dial(ctx context.Context, s *session) (*live, error) {
	g := st.g
	lv := &live{st: st, calls: map[uint64]*pending{}, tokens: map[string]*pending{}, ready: make(chan struct{})}
	if !st.opts.Shared {
		lv.owner.Store(s)
	}
	sessID := ""
	if s != nil {
		sessID = s.id
	}
	client := mcp.NewClient(&mcp.Implementation{Name: g.opts.Name, Version: g.opts.Version}, &mcp.ClientOptions{
		Capabilities: lv.clientCaps(),
		// Notifications that reach the client session (an HTTP upstream's
		// standalone stream); intercept takes those read beside it.
		ResourceUpdatedHandler: lv.onResourceUpdated,
		ToolListChangedHandler: lv.onToolsChanged,
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			lv.onProgress(req.Params)
		},
		LoggingMessageHandler: func(_ context.Context, req *mcp.LoggingMessageRequest) {
			lv.onLog(req.Params)
		},
		PromptListChangedHandler: func(context.Context, *mcp.PromptListChangedRequest) {
			lv.forEachSession(func(s *session) { s.notifyListChanged("prompts") })
		},
		ResourceListChangedHandler: func(context.Context, *mcp.ResourceListChangedRequest) {
			lv.forEachSession(func(s *session) { s.notifyListChanged("resources") })
		},
	})
	client.AddReceivingMiddleware(lv.serverRequests)
	cctx := upstream.WithSession(ctx, sessID)
	conn, err := toolprobe.ConnectWithin(cctx, g.opts.ConnectTimeout, func(ctx context.Context) (*upstream.Conn, error) {
		return st.opts.Upstream.Connect(ctx, client, upstream.ConnectOptions{Intercept: lv.intercept, ServerRequest: lv.serverRequest, Identity: st.identityFor(s)})
	})
	if err != nil && errors.Is(err, toolprobe.ErrConnectTimeout) {
		err = fmt.Errorf("upstream %q did not complete the MCP handshake within %s: %w", st.name, g.opts.ConnectTimeout, err)
	}
	if m := g.opts.Metrics; m != nil {
		m.UpstreamHealth(st.name, err == nil)
	}
	if err != nil {
		g.record(ctx, &auditlog.Upstream{Name: st.name, Transport: st.transport(), EvidenceClass: st.expectedClass(), Session: sessID, Event: "failed", Reason: err.Error()})
		return nil, err
	}
	lv.conn, lv.client = conn, client
	init := conn.Session.InitializeResult()
	// tools/list is part of starting: bounded like the handshake.
	tools, err := toolprobe.ListTools(ctx, conn.Session, g.opts.ConnectTimeout)
	if err != nil {
		conn.Close()
		err = fmt.Errorf("upstream %q: %w", st.name, err)
		g.record(ctx, &auditlog.Upstream{Name: st.name, Transport: st.transport(), EvidenceClass: conn.Class, Session: sessID, Event: "failed", Reason: err.Error()})
		return nil, err
	}
	up := &auditlog.Upstream{Name: st.name, Transport: st.transport(), Endpoint: conn.Ref, EvidenceClass: conn.Class, Tools: int64(len(tools)), Session: sessID, Event: "connected"}
	if init != nil && init.ServerInfo != nil {
		up.ServerName, up.ServerVersion = init.ServerInfo.Name, init.ServerInfo.Version
	}
	if err := g.record(ctx, up); err != nil {
		conn.Close()
		return nil, fmt.Errorf("upstream %q: the connection could not be recorded in the audit log: %w", st.name, err)
	}
	lv.applyTools(ctx, tools, init, sessID)
	close(lv.ready)
	g.lives.Add(1) // until close has recorded the disconnection
	return lv, nil
}

// readyWait bounds how long a list_changed sent during the handshake waits
// for the connection to be ready; a connection that fails is never ready.
const readyWait = 2 * time.Minute

// applyTools checks tools against the upstream's baseline, records drift and
// sets what this connection may call. On the first connection without pins
// the tools become the baseline.
func (lv *live) applyTools(ctx context.Context, tools []*mcp.Tool, init *mcp.InitializeResult, sessID string) {
	st, g := lv.st, lv.st.g
	st.mu.Lock()
	baseline := st.baseline
	first := baseline == nil
	st.mu.Unlock()
	refuse := !st.opts.DriftWarn
	var accepted []*mcp.Tool
	var digests map[string]digest.Digest
	var drift []catalog.DriftEvent
	if first {
		accepted, digests, drift = catalog.Check(st.name, tools, nil, false)
		// Without pins the first definitions seen are the baseline; only
		// invalid tools are drift.
		kept := drift[:0]
		for _, d := range drift {
			if d.Kind == catalog.DriftInvalid {
				kept = append(kept, d)
			}
		}
		drift = kept
		st.mu.Lock()
		if st.baseline == nil {
			st.baseline = digests
		}
		st.mu.Unlock()
	} else {
		accepted, _, drift = catalog.Check(st.name, tools, baseline, refuse)
	}
	for _, d := range drift {
		action := "flagged"
		if refuse || d.Kind == catalog.DriftInvalid {
			action = "refused"
		}
		g.recordDrift(ctx, d, action, sessID)
	}
	allowed := map[string]bool{}
	for _, t := range accepted {
		allowed[t.Name] = true
	}
	lv.mu.Lock()
	lv.allowed = allowed
	lv.mu.Unlock()
	st.mu.Lock()
	st.class = lv.conn.Class
	if init != nil {
		st.init = init
	}
	if !st.loaded || lv.owner.Load() == nil {
		// The probe (or the shared connection) defines what is exposed:
		// approved tools only.
		st.tools = accepted
	}
	st.mu.Unlock()
}

// allows reports whether the upstream tool may be called on this connection.
func (lv *live) allows(tool string) bool {
	lv.mu.Lock()
	defer lv.mu.Unlock()
	return lv.allowed[tool]
}

func (lv *live) close(reason string) {
	lv.mu.Lock()
	if lv.closed {
		lv.mu.Unlock()
		return
	}
	lv.closed = true
	lv.mu.Unlock()
	defer lv.st.g.lives.Done()
	lv.conn.Close() // a child's exit is recorded before this returns
	sessID := ""
	if owner := lv.owner.Load(); owner != nil {
		sessID = owner.id
	}
	lv.st.g.record(context.Background(), &auditlog.Upstream{Name: lv.st.name, Transport: lv.st.transport(), EvidenceClass: lv.conn.Class, Session: sessID, Event: "disconnected", Reason: reason})
}

// markBroken makes dead report err from now on.
func (lv *live) markBroken(err error) {
	lv.mu.Lock()
	if lv.broken == nil {
		lv.broken = err
	}
	lv.mu.Unlock()
}

// dead reports why the connection is unusable, or nil.
func (lv *live) dead() error {
	lv.mu.Lock()
	closed, broken := lv.closed, lv.broken
	lv.mu.Unlock()
	if f := lv.conn.Fault(); f != nil {
		return f
	}
	if broken != nil {
		return broken
	}
	if closed {
		return fmt.Errorf("upstream %q connection closed", lv.st.name)
	}
	return nil
}

// track registers a forwarded request and returns the progress token to
// send upstream (nil if the agent sent none) and a release function.
func (lv *live) track(ctx context.Context, s *session, agentToken any) (upTok any, release func()) {
	p := &pending{id: lv.nextTok.Add(1), ctx: ctx, s: s, token: agentToken}
	lv.mu.Lock()
	lv.calls[p.id] = p
	if agentToken != nil {
		p.upTok = fmt.Sprintf("cmcp-%d", p.id)
		lv.tokens[p.upTok] = p
	}
	lv.mu.Unlock()
	release = func() {
		lv.mu.Lock()
		delete(lv.calls, p.id)
		if p.upTok != "" {
			delete(lv.tokens, p.upTok)
		}
		lv.mu.Unlock()
	}
	if p.upTok == "" {
		return nil, release
	}
	return p.upTok, release
}

// route picks where a server-to-client message goes: the request it belongs
// to (by progress token), else any in-flight request of this connection,
// else the owning session outside any request. It finds none (nil) when a
// shared connection has calls of several sessions in flight: busy is their
// number then.
func (lv *live) route(tok any) (ctx context.Context, s *session, busy int) {
	lv.mu.Lock()
	defer lv.mu.Unlock()
	if t, ok := tok.(string); ok {
		if p, ok := lv.tokens[t]; ok {
			return p.ctx, p.s, 0
		}
	}
	var best *pending
	sessions := map[*session]bool{}
	for _, p := range lv.calls {
		sessions[p.s] = true
		if best == nil || p.id > best.id {
			best = p
		}
	}
	// A shared upstream's request or log line without a progress token
	// cannot be tied to one call: it goes to an agent only when a single
	// session has calls in flight, never to a guess among several.
	owner := lv.owner.Load()
	if best != nil && (owner != nil || len(sessions) == 1) {
		return best.ctx, best.s, 0
	}
	if owner != nil {
		return context.Background(), owner, 0
	}
	if best != nil {
		lv.st.g.logger.Warn("shared upstream sent a message that cannot be tied to one agent session; not forwarded", "upstream", lv.st.name, "sessions", len(sessions))
	}
	return nil, nil, len(sessions)
}

func (lv *live) forEachSession(f func(*session)) {
	if owner := lv.owner.Load(); owner != nil {
		f(owner)
		return
	}
	g := lv.st.g
	ss := g.sessionList()
	for _, s := range ss {
		f(s)
	}
}

// clientCaps mirrors the agent's capabilities upstream, so an upstream only
// asks for sampling, elicitation or roots if the agent can answer.
func (lv *live) clientCaps() *mcp.ClientCapabilities {
	if lv.owner.Load() != nil {
		if ss := lv.owner.Load().downSession(); ss != nil {
			if ip := ss.InitializeParams(); ip != nil && ip.Capabilities != nil {
				c := *ip.Capabilities
				return &c
			}
		}
	}
	return &mcp.ClientCapabilities{Sampling: &mcp.SamplingCapabilities{}, Elicitation: &mcp.ElicitationCapabilities{}}
}

// rootsChangedMarker is the one root the connection's own client holds:
// see notifyRootsChanged.
const rootsChangedMarker = "cmcp-internal:///roots-changed"

// notifyRootsChanged sends the upstream notifications/roots/list_changed,
// if the connection declared roots.listChanged (clientCaps: the agent's
// own capabilities). go-sdk's client sends it when the client's roots
// change; those roots are never what the upstream is told (serverRequests
// forwards roots/list to the agent), so one marker root is set again.
func (lv *live) notifyRootsChanged() {
	lv.client.AddRoots(&mcp.Root{URI: rootsChangedMarker, Name: "cmcp: the agent's roots changed"})
}

// intercept forwards progress and logging notifications in wire order,
// before the response they precede reaches the caller. It also takes the
// notifications an upstream may send on a call's own response stream,
// which a raw call reads and go-sdk's client session never sees (an HTTP
// upstream's): list changes (tools: the pins are checked again) and
// resource updates go to the same handlers the client session uses.
func (lv *live) intercept(msg jsonrpc.Message) bool {
	req, ok := msg.(*jsonrpc.Request)
	if !ok || req.IsCall() {
		return false
	}
	switch req.Method {
	case "notifications/tools/list_changed":
		lv.onToolsChanged(context.Background(), nil)
		return true
	case "notifications/prompts/list_changed":
		lv.forEachSession(func(s *session) { s.notifyListChanged("prompts") })
		return true
	case "notifications/resources/list_changed":
		lv.forEachSession(func(s *session) { s.notifyListChanged("resources") })
		return true
	case "notifications/resources/updated":
		var p mcp.ResourceUpdatedNotificationParams
		if json.Unmarshal(req.Params, &p) == nil {
			lv.onResourceUpdated(context.Background(), &mcp.ResourceUpdatedNotificationRequest{Params: &p})
		}
		return true
	case "notifications/progress":
		var p mcp.ProgressNotificationParams
		if json.Unmarshal(req.Params, &p) == nil {
			lv.onProgress(&p)
		}
		return true
	case "notifications/message":
		var p mcp.LoggingMessageParams
		if json.Unmarshal(req.Params, &p) == nil {
			lv.onLog(&p)
		}
		return true
	}
	return false
}

func (lv *live) onProgress(params *mcp.ProgressNotificationParams) {
	lv.mu.Lock()
	p := lv.tokens[fmt.Sprint(params.ProgressToken)]
	lv.mu.Unlock()
	if p == nil {
		return // progress for a request that is over, or not ours
	}
	out := *params
	out.ProgressToken = p.token
	if sk := sinkFrom(p.ctx); sk != nil {
		_ = sk.Notify("notifications/progress", &out)
		return
	}
	if ss := p.s.downSession(); ss != nil {
		_ = ss.NotifyProgress(p.ctx, &out)
	}
}

func (lv *live) onLog(params *mcp.LoggingMessageParams) {
	ctx, s, _ := lv.route(nil)
	if s == nil {
		return
	}
	if sk := sinkFrom(ctx); sk != nil {
		if s.logs(params.Level) {
			_ = sk.Notify("notifications/message", params)
		}
		return
	}
	if ss := s.downSession(); ss != nil {
		_ = ss.Log(ctx, params)
	}
}

func (lv *live) onResourceUpdated(ctx context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
	lv.forEachSession(func(s *session) { _ = s.srv.ResourceUpdated(context.Background(), req.Params) })
}

// onToolsChanged re-lists the upstream's tools and checks them again. It
// returns at once (it is called from the connection's read loop, which
// must go on to read the answers). Notifications that arrive while a
// re-list runs are coalesced into one more re-list after it: one
// goroutine per connection, however often the upstream says its tools
// changed.
func (lv *live) onToolsChanged(ctx context.Context, _ *mcp.ToolListChangedRequest) {
	lv.mu.Lock()
	if lv.relisting {
		lv.relistAgain = true
		lv.mu.Unlock()
		return
	}
	lv.relisting = true
	lv.mu.Unlock()
	go func() {
		select {
		case <-lv.ready:
		case <-time.After(readyWait):
			lv.mu.Lock()
			lv.relisting, lv.relistAgain = false, false
			lv.mu.Unlock()
			return
		}
		for {
			lv.relist()
			lv.mu.Lock()
			again := lv.relistAgain && !lv.closed
			lv.relistAgain = false
			lv.relisting = again
			lv.mu.Unlock()
			if !again {
				return
			}
		}
	}()
}

// relist lists the tools again after list_changed (bounded like the
// listing at start) and applies them. If that fails, what the upstream
// now defines is unknown: the connection is marked broken, so that no
// tool is called on it any more (fail closed; the next use connects anew,
// and that listing is checked against the pins), and the failure is
// recorded.
func (lv *live) relist() {
	st, g := lv.st, lv.st.g
	owner := lv.owner.Load()
	sessID := ""
	if owner != nil {
		sessID = owner.id
	}
	tools, err := toolprobe.ListTools(context.Background(), lv.conn.Session, g.opts.ConnectTimeout)
	if err != nil {
		lv.mu.Lock()
		closed := lv.closed
		lv.mu.Unlock()
		if closed {
			return // closed by the gateway: nothing will be called on it
		}
		err = fmt.Errorf("upstream %q: after notifications/tools/list_changed: %w; its tools are refused on this connection, the next use reconnects", st.name, err)
		lv.markBroken(err)
		g.logger.Warn("re-list tools after list_changed failed", "upstream", st.name, "session", sessID, "err", err)
		g.record(context.Background(), &auditlog.Upstream{Name: st.name, Transport: st.transport(), EvidenceClass: lv.conn.Class, Session: sessID, Event: "failed", Reason: err.Error()})
		return
	}
	lv.applyTools(context.Background(), tools, nil, sessID)
	if owner == nil {
		g.rebuildCatalog()
	} else {
		owner.syncTools()
	}
}

// serverRequests forwards the upstream's requests to the agent verbatim:
// sampling, elicitation (without the client's own schema validation, which
// rejects valid SEP-1330 schemas) and roots.
func (lv *live) serverRequests(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if !forwardedToAgent(method) {
			return next(ctx, method, req)
		}
		res, err := lv.toAgent(ctx, method, req.GetParams())
		if errors.Is(err, errNotForwarded) {
			return next(ctx, method, req)
		}
		return res, err
	}
}

// serverRequest answers a request an upstream sent on a raw call's
// response stream (upstream.ConnectOptions.ServerRequest): the same
// forwarding as serverRequests, with the params decoded as the MCP client
// session would decode them.
func (lv *live) serverRequest(ctx context.Context, req *jsonrpc.Request) (json.RawMessage, error) {
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
	res, err := lv.toAgent(ctx, req.Method, params)
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
func (lv *live) toAgent(ctx context.Context, method string, params mcp.Params) (mcp.Result, error) {
	if sk := sinkFrom(ctx); sk != nil {
		if res, err := sk.Forward(ctx, method, params); !errors.Is(err, httpfront.ErrStreamClosed) {
			return res, err
		}
	}
	dctx, s, busy := lv.route(nil)
	if busy > 1 {
		return nil, fault(CodeNotRoutable, "%s from upstream %q: the upstream is shared (lifecycle: shared) and %d agent sessions have calls in flight on it; "+
			"a stdio upstream's request does not say which call it belongs to, so it was sent to none of them; "+
			"use lifecycle: per-session or an HTTP upstream for sampling, elicitation and roots", method, lv.st.name, busy)
	}
	if s == nil || s.downSession() == nil {
		return nil, fault(CodeUpstreamUnavailable, "%s from upstream %q: no agent session to forward it to", method, lv.st.name)
	}
	inputGone := func() error {
		return fault(CodeSessionEnded, "%s from upstream %q: the agent closed its input (EOF on stdin) and can answer no request; the session ends once its calls are answered", method, lv.st.name)
	}
	if s.stdio.agentReqs.HasEnded() {
		return nil, inputGone()
	}
	// dctx's values (the call's stream), ctx's end, or the end of the
	// agent's input before it answered (stdiofront.AgentRequests, stdio only).
	dctx, cancel := context.WithCancelCause(context.WithoutCancel(dctx))
	defer cancel(nil)
	defer context.AfterFunc(ctx, func() { cancel(nil) })()
	req := stdiofront.NewAgentRequest(cancel)
	defer s.stdio.agentReqs.Done(req)
	dctx = stdiofront.WithAgentRequest(dctx, req)
	if sk := sinkFrom(dctx); sk != nil {
		// The call route picked may just have ended (an upstream child
		// cannot say which call a request belongs to): then the request
		// goes through go-sdk, on the session's own stream.
		if res, err := sk.Forward(dctx, method, params); !errors.Is(err, httpfront.ErrStreamClosed) {
			return res, err
		}
	}
	ss := s.downSession()
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

func (st *upState) transport() string {
	if st.opts.Transport != "" {
		return st.opts.Transport
	}
	return "stdio"
}

func (st *upState) expectedClass() string {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.class != "" {
		return st.class
	}
	return st.opts.Class
}

// subscribe records s's subscription to uri on a shared connection and
// reports whether the upstream must be subscribed (s is the first).
func (lv *live) subscribe(s *session, uri string) (first bool) {
	lv.mu.Lock()
	defer lv.mu.Unlock()
	if lv.subs == nil {
		lv.subs = map[string]map[*session]bool{}
	}
	set := lv.subs[uri]
	if set == nil {
		set = map[*session]bool{}
		lv.subs[uri] = set
	}
	first = len(set) == 0
	set[s] = true
	return first
}

// unsubscribe removes s's subscription to uri (all of s's when uri is "")
// on a shared connection and returns the URIs no session is subscribed to
// any more, whose upstream subscription must end.
func (lv *live) unsubscribe(s *session, uri string) (last []string) {
	lv.mu.Lock()
	defer lv.mu.Unlock()
	for u, set := range lv.subs {
		if (uri == "" || u == uri) && set[s] {
			delete(set, s)
			if len(set) == 0 {
				delete(lv.subs, u)
				last = append(last, u)
			}
		}
	}
	return last
}
