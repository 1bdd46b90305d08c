package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/credential"
	"github.com/confidential-mcp/cmcp/internal/front/stdiofront"
	"github.com/confidential-mcp/cmcp/internal/oauth"
	"github.com/confidential-mcp/cmcp/internal/route"
	"github.com/confidential-mcp/cmcp/internal/rpcwire"
	"github.com/confidential-mcp/cmcp/internal/toagent"
	"github.com/confidential-mcp/cmcp/internal/toollist"
	"github.com/confidential-mcp/cmcp/internal/upstream"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

//lint:file-ignore SA1019 go-sdk deprecates MCP logging, sampling and roots (SEP-2577) with no replacement; the gateway still relays them while clients use them

// streamOpenedWith notes the token a GET stream of the session was opened
// with (a client rotating tokens uses a few: the list stays short).
func (s *session) streamOpenedWith(tok digest.Digest) {
	if tok.IsZero() {
		return
	}
	s.http.streamMu.Lock()
	defer s.http.streamMu.Unlock()
	if !slices.ContainsFunc(s.http.streamTokens, tok.Equal) {
		s.http.streamTokens = append(s.http.streamTokens, tok)
	}
}

// tokensInForce reports whether every bearer token that opened the session
// or one of its GET streams still maps to its identity in nowOf.
func (s *session) tokensInForce(nowOf map[digest.Digest]string) bool {
	if !s.http.token.IsZero() && nowOf[s.http.token] != s.principal {
		return false
	}
	s.http.streamMu.Lock()
	defer s.http.streamMu.Unlock()
	for _, t := range s.http.streamTokens {
		if nowOf[t] != s.principal {
			return false
		}
	}
	return true
}

// credGroups are the groups the session's credential names.
func (s *session) credGroups() []string {
	if a := s.auth.Load(); a != nil {
		return a.Groups
	}
	return nil
}

// authedWith notes the OAuth identity of a request of the session (same
// principal, checked by the front) and its verified access token: a token
// not seen on the session before (a refreshed one) is recorded as a
// session "token" event, and its groups and raw token (the subject token
// of a token_exchange upstream credential) are the session's from now on.
func (s *session) authedWith(id *oauth.Identity, token credential.Secret) {
	if id == nil {
		return
	}
	s.authToken.Store(&token)
	prev := s.auth.Swap(id)
	if prev == nil || prev.JTI == id.JTI && prev.Issuer == id.Issuer {
		return
	}
	s.mu.Lock()
	sid, started := s.id, s.started
	s.mu.Unlock()
	if started {
		s.g.record(context.Background(), &record.Session{ID: sid, Event: "token", Agent: s.principal, Front: s.front, Issuer: id.Issuer, TokenID: id.JTI, Groups: id.Groups})
	}
}

// session is one agent session and its own MCP server. Its fields are in
// groups by owner; each lock guards one named group, and a field outside
// the groups a lock guards is set before the session is shared, or is an
// atomic, or is safe for concurrent use by itself:
//
//   - mu guards the upstream group (the session's upstream connections);
//   - httpState.streamMu guards streamTokens (the HTTP front's group);
//   - fastCalls.mu guards the fast path's in-flight calls.
//
// The gateway's g.mu guards g.byID, where bind publishes the session.
type session struct {
	// Set when the session is made, never changed.
	g         *Gateway
	principal string
	front     string // "http" or "stdio": which of http and stdio is used
	srv       *mcp.Server
	// rt routes resource, prompt and completion requests (internal/route,
	// under its own lock: it remembers which upstream serves a URI).
	rt *route.Router
	// ctx ends when the session ends, its cause a *sessionEnd saying why;
	// fast-path calls run under it.
	ctx    context.Context
	cancel context.CancelCauseFunc

	// The agent's side. down is go-sdk's server session once initialised;
	// id is written once, in bind, under mu and before down is stored:
	// read it under mu until down is set (authedWith), freely after.
	down atomic.Pointer[mcp.ServerSession]
	id   string
	// auth is the OAuth access token's verified identity of the latest
	// request of the session (nil: no OAuth token identified it): its
	// issuer and jti are recorded, its groups are Group parents.
	auth atomic.Pointer[oauth.Identity]
	// authToken is the raw access token auth was verified from (the
	// latest one): only ever the subject token of a token_exchange
	// upstream credential, never logged, recorded or sent to an upstream.
	authToken atomic.Pointer[credential.Secret]

	// The upstream group, guarded by mu.
	mu       sync.Mutex
	lives    map[string]*live
	logLevel mcp.LoggingLevel
	started  bool
	ended    bool // no new upstream connections

	// tools are the tools registered with srv, kept in step with the
	// newest catalog (internal/toollist, under its own locks).
	tools *toollist.List
	dummy atomic.Uint64

	// Requests in flight, in both directions, and the end that waits for
	// them (each of these is safe for concurrent use).
	endOnce sync.Once
	fast    fastCalls // tools/call requests a front answers itself
	// answering counts the session's requests that its end cuts, until
	// they are answered: the fast-path calls until their answer is
	// written, the requests go-sdk answers (withSession) until their
	// handler returns. The end waits for them before it closes the
	// agent's connection; sdkCut says it cut one of go-sdk's, which go-sdk
	// answers only just after its handler returns.
	answering  counter
	sdkCut     atomic.Bool
	serverReqs rpcwire.Pending // requests to the agent on fast-call streams

	http  httpState  // the HTTP front's group (zero for stdio)
	stdio stdioState // the stdio front's group (zero for HTTP)
}

// httpState is what an HTTP session holds for the HTTP front
// (internal/front/httpfront, through httpcore.go). streamMu guards
// streamTokens; the rest is set before the session is shared, or atomic.
type httpState struct {
	// token is the digest of the bearer token that opened the session
	// (zero for one a client certificate or development mode identified):
	// a SIGHUP that no longer maps it to principal ends the session.
	token digest.Digest
	// streamTokens are the digests of the bearer tokens that opened the
	// session's GET streams: a stream lives on after its request was
	// authenticated, so a SIGHUP that no longer maps one of them to
	// principal ends the session too.
	streamMu     sync.Mutex
	streamTokens []digest.Digest
	// POSTs in progress and when the last one ended (unix nanoseconds),
	// for the idle timeout.
	posts    atomic.Int32
	lastPost atomic.Int64
	// releaseSlot gives back the session's place under the session
	// bounds (sessionlimit.go) when it ends.
	releaseSlot func()
}

// stdioState is what a stdio session holds for the stdio front
// (internal/front/stdiofront); both are safe for concurrent use.
type stdioState struct {
	// unanswered are the requests the agent sent that are not answered
	// yet, whichever path answers them: the end waits for those read
	// before it, including the ones go-sdk has not dispatched yet.
	unanswered stdiofront.Unanswered
	// agentReqs are the requests sent to the agent (sampling,
	// elicitation, roots) that it has not answered, until its input ends.
	agentReqs stdiofront.AgentRequests
}

// newSession builds the MCP server for one agent session. Nothing is
// spawned until the session uses an upstream.
func (g *Gateway) newSession(principal, front string) *session {
	s := &session{g: g, principal: principal, front: front, lives: map[string]*live{}}
	s.rt = route.New(routeSession{s})
	s.ctx, s.cancel = context.WithCancelCause(context.Background())
	s.serverReqs.Prefix = serverReqPrefix
	s.http.lastPost.Store(time.Now().UnixNano())
	g.mu.Lock()
	caps, instructions := g.caps, g.instructions
	g.mu.Unlock()
	opts := &mcp.ServerOptions{
		Capabilities: caps,
		Instructions: instructions,
		Logger:       g.logger,
		// Sessions are stateful: the sessionless 2026-07-28 protocol is not
		// offered, so modern clients fall back to initialize.
		SupportedProtocolVersions: slices.Clone(frontVersions()),
		RootsListChangedHandler:   s.rootsChanged,
	}
	if caps.Completions != nil {
		opts.CompletionHandler = s.rt.Complete
	}
	if caps.Resources != nil && caps.Resources.Subscribe {
		opts.SubscribeHandler = s.rt.Subscribe
		opts.UnsubscribeHandler = s.rt.Unsubscribe
	}
	s.srv = mcp.NewServer(&mcp.Implementation{Name: g.opts.Name, Version: g.opts.Version}, opts)
	s.srv.AddReceivingMiddleware(s.middleware)
	s.tools = toollist.New(s.srv, s.toolHandler, listSession{s}, g.logger, g.opts.Filter != nil)
	s.syncTools()
	return s
}

func (s *session) downSession() *mcp.ServerSession { return s.down.Load() }

// rootsChanged passes the agent's notifications/roots/list_changed on to
// the session's own upstream connections, so that an upstream that keeps
// the roots asks for them again (its roots/list reaches this agent).
// Connections started later ask afresh anyway. A shared connection is not
// told: it serves several agents, so it declares no roots capability (its
// capabilities are not one agent's, see toagent.Relay.ClientCaps), and a notification
// for a capability it did not declare would break the protocol; a shared
// upstream that asked for roots all the same would get those of whichever
// agent its request was routed to, and this agent's change says nothing
// about that.
func (s *session) rootsChanged(context.Context, *mcp.RootsListChangedRequest) {
	s.mu.Lock()
	lives := make([]*live, 0, len(s.lives))
	for _, lv := range s.lives {
		lives = append(lives, lv)
	}
	s.mu.Unlock()
	for _, lv := range lives {
		go toagent.RootsChanged(lv.client) // an upstream slow to read holds up nothing
	}
}

func (s *session) info() SessionInfo {
	si := SessionInfo{ID: s.id, Front: s.front, Groups: s.credGroups()}
	if ss := s.downSession(); ss != nil {
		if ip := ss.InitializeParams(); ip != nil && ip.ClientInfo != nil {
			si.ClientName, si.ClientVersion = ip.ClientInfo.Name, ip.ClientInfo.Version
		}
	}
	return si
}

// bind attaches the downstream session after initialize, records the session
// start and arranges for its end.
func (s *session) bind(ss *mcp.ServerSession, params *mcp.InitializeParams) {
	s.mu.Lock()
	if s.started {
		s.mu.Unlock()
		return
	}
	s.started = true
	s.id = ss.ID()
	if s.id == "" {
		s.id = fmt.Sprintf("%s-%d", s.front, s.g.nextID.Add(1))
	}
	s.mu.Unlock()
	s.down.Store(ss)
	rec := &record.Session{ID: s.id, Event: "start", Agent: s.principal, Front: s.front}
	if a := s.auth.Load(); a != nil {
		rec.Issuer, rec.TokenID, rec.Groups = a.Issuer, a.JTI, a.Groups
	}
	if params != nil {
		rec.Protocol = params.ProtocolVersion
		if params.ClientInfo != nil {
			rec.ClientName, rec.ClientVersion = params.ClientInfo.Name, params.ClientInfo.Version
		}
	}
	s.g.record(context.Background(), rec)
	s.g.mu.Lock()
	s.g.sessions[s] = struct{}{}
	s.g.byID[s.id] = s
	s.g.mu.Unlock()
	go func() {
		_ = ss.Wait()
		// go-sdk closes an HTTP session only on the agent's DELETE (the
		// gateway's own ends come through end, which closes it last); a
		// stdio one when the agent closes its end.
		why := whyDeleted
		if s.front != "http" {
			why = "the agent closed the stdio connection"
		}
		s.end(endedFor(why))
	}()
}

// bindLazily binds the session on its first request if initialize did not.
func (s *session) bindLazily(req mcp.Request) {
	if s.downSession() != nil {
		return
	}
	if ss, ok := req.GetSession().(*mcp.ServerSession); ok {
		s.bind(ss, ss.InitializeParams())
	}
}

// frontVersions are the protocol versions offered to agents: go-sdk's, up
// to the version the gateway speaks to its upstreams.
var frontVersions = sync.OnceValue(func() []string {
	var out []string
	for _, v := range mcp.SupportedProtocolVersions() {
		if v <= upstream.ProtocolVersion {
			out = append(out, v)
		}
	}
	return out
})

// sessionEnd is why a session ended: the cause of its context, so that a
// call the end cuts is told apart from one its agent cancelled. A cut call
// is answered (the agent's connection is still open) with code, and its
// result record says why.
type sessionEnd struct {
	code int64
	why  string // the session end record's reason
}

func (e *sessionEnd) Error() string { return "the session ended: " + e.why }

// whyDeleted is the reason of an HTTP session the agent ended.
const whyDeleted = "the agent ended the session (HTTP DELETE)"

// endShutdown ends the sessions at the gateway's shutdown.
var endShutdown = &sessionEnd{code: CodeShuttingDown, why: "gateway shutdown"}

// endedFor is a session end for another reason than the shutdown.
func endedFor(why string) *sessionEnd { return &sessionEnd{code: CodeSessionEnded, why: why} }

// fault is the agent's answer to a call the end cut.
func (e *sessionEnd) fault() *jsonrpc.Error {
	if e.code == CodeShuttingDown {
		return fault(CodeShuttingDown, "the gateway is shutting down and cut this call, still running when its drain ended (server.shutdown_grace): it was cancelled upstream, where it may have taken effect; reconnect and retry")
	}
	return fault(int(e.code), "the session ended while this call ran (%s): it was cancelled upstream, where it may have taken effect; open a new session to retry", e.why)
}

// sessionEndOf returns the session end that ended ctx, or nil if ctx has
// not ended or ended otherwise (the agent cancelled the call, a timeout).
func sessionEndOf(ctx context.Context) *sessionEnd {
	var e *sessionEnd
	if ctx.Err() != nil && errors.As(context.Cause(ctx), &e) {
		return e
	}
	return nil
}

// cutAnswerWait bounds how long a session's end waits for the answers to
// the fast-path calls it cut (an agent that stops reading its stdio could
// hold one up) before it closes the agent's connection.
const cutAnswerWait = 5 * time.Second

// cutAnswerLinger is how long a session's end waits, once the handlers of
// the go-sdk requests it cut have returned, for go-sdk to write their
// answers (it does so just after, and drops them once the session closes).
const cutAnswerLinger = 100 * time.Millisecond

// cut ends the session's context with e, cutting its calls, if it has not
// ended: end does it too; Shutdown does it to every session first, so that
// no call fails on a shared upstream closed before its own session ended.
func (s *session) cut(e *sessionEnd) { s.cancel(e) }

// cutAndAnswer cuts the session's calls with e and waits until the ones
// it cut are answered on the agent's connection, which must still be
// open: go-sdk's Close waits for its handlers but drops the answers they
// give after it began, so this waits for them, and lingers for go-sdk to
// write its answers.
//
// On stdio it also waits for the answers to the requests the agent sent
// before the end, whichever path answers them, including those go-sdk had
// not dispatched yet when the calls were cut (it answers them once it
// does; during a shutdown a call is refused -32068). The transport sees
// each answer written, so stdio needs no linger.
func (s *session) cutAndAnswer(e *sessionEnd) {
	s.cut(e)
	wctx, cancel := context.WithTimeout(context.Background(), cutAnswerWait)
	s.answering.wait(wctx)
	left := s.stdio.unanswered.Wait(wctx.Done())
	cancel()
	if n := s.answering.n.Load(); n > 0 || left > 0 {
		s.g.logger.Warn("session ended with requests whose answers could not be written in time", "session", s.id, "requests", max(n, int64(left)), "waited", cutAnswerWait)
	} else if s.sdkCut.Load() && s.front != "stdio" {
		time.Sleep(cutAnswerLinger)
	}
}

// end cuts the session's calls (answering them, see sessionEnd), stops its
// children and records the end with e's reason.
func (s *session) end(e *sessionEnd) {
	s.endOnce.Do(func() {
		s.g.ending.Add(1) // before it leaves g.sessions: Shutdown waits for it
		defer s.g.ending.Done()
		if s.http.releaseSlot != nil {
			defer s.http.releaseSlot()
		}
		s.cutAndAnswer(e)
		reason := e.why
		if first := sessionEndOf(s.ctx); first != nil {
			reason = first.why // cut before (Shutdown, DELETE): the cause its calls were answered with
		}
		s.serverReqs.Fail(errors.New("the agent session ended"))
		s.g.mu.Lock()
		delete(s.g.sessions, s)
		if s.g.byID[s.id] == s {
			delete(s.g.byID, s.id)
		}
		s.g.mu.Unlock()
		if ss := s.downSession(); ss != nil {
			_ = ss.Close()
		}
		s.mu.Lock()
		lives := s.lives
		s.lives = map[string]*live{}
		s.ended = true
		id := s.id
		s.mu.Unlock()
		// Its subscriptions on shared upstreams: the last subscriber of a
		// URI ends the upstream's subscription.
		for _, st := range s.g.ups {
			st.mu.Lock()
			shared := st.shared
			st.mu.Unlock()
			if shared == nil {
				continue
			}
			for _, uri := range shared.unsubscribe(s, "") {
				go func() {
					ctx, cancel := context.WithTimeout(context.Background(), s.g.opts.CallTimeout)
					defer cancel()
					_ = shared.conn.Session.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: uri})
				}()
			}
		}
		var wg sync.WaitGroup
		for _, lv := range lives {
			if lv.owner.Load() == s {
				wg.Add(1)
				go func() { defer wg.Done(); lv.close("session ended") }()
			}
		}
		wg.Wait()
		if id != "" {
			s.g.record(context.Background(), &record.Session{ID: id, Event: "end", Agent: s.principal, Front: s.front, Reason: reason})
			if eng := s.g.opts.Policy; eng != nil {
				eng.EndSession(id)
			}
			if f := s.g.opts.OnSessionEnd; f != nil {
				f(id)
			}
		}
	})
}

// upstreamFor returns the session's live connection to upstream name,
// starting it on first use. Concurrent first uses start one connection.
func (s *session) upstreamFor(ctx context.Context, name string) (*live, error) {
	st, ok := s.g.ups[name]
	if !ok {
		return nil, fmt.Errorf("no upstream %q", name)
	}
	if st.opts.Shared {
		upstream.Waiting(ctx) // it may have to start
		return st.sharedLive(ctx)
	}
	s.mu.Lock()
	lv := s.lives[name]
	s.mu.Unlock()
	if lv != nil && lv.dead() == nil {
		return lv, nil
	}
	upstream.Waiting(ctx) // it has to start
	if lv != nil {
		s.mu.Lock()
		if s.lives[name] == lv {
			delete(s.lives, name)
		}
		s.mu.Unlock()
		go lv.close(lv.dead().Error())
	}
	v, err := waitShared(ctx, &st.sf, "session:"+s.sessKey(), func() (any, error) {
		s.mu.Lock()
		if lv := s.lives[name]; lv != nil {
			s.mu.Unlock()
			return lv, nil
		}
		s.mu.Unlock()
		lv := st.takeSpare(context.WithoutCancel(ctx), s)
		if lv == nil {
			var err error
			if lv, err = st.connect(context.WithoutCancel(ctx), s); err != nil {
				return nil, err
			}
		}
		s.mu.Lock()
		if s.ended {
			s.mu.Unlock()
			lv.close("session ended while the upstream started")
			return nil, fmt.Errorf("the session ended")
		}
		s.lives[name] = lv
		level := s.logLevel
		s.mu.Unlock()
		if level != "" {
			lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.g.opts.ConnectTimeout)
			_ = lv.conn.Session.SetLoggingLevel(lctx, &mcp.SetLoggingLevelParams{Level: level})
			cancel()
		}
		s.syncTools()
		return lv, nil
	})
	if err != nil {
		return nil, err
	}
	if !st.isLoaded() {
		st.markLoaded()
	}
	return v.(*live), nil
}

func (s *session) sessKey() string { return fmt.Sprintf("%p", s) }

func (st *upState) isLoaded() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.loaded
}

func (st *upState) markLoaded() {
	st.mu.Lock()
	st.loaded = true
	st.mu.Unlock()
	st.g.rebuildCatalog()
}

// sharedLive returns the upstream's shared connection, (re)starting it.
func (st *upState) sharedLive(ctx context.Context) (*live, error) {
	return st.sharedConnect(ctx, false)
}

// sharedConnect is sharedLive; for the background probe (probe set), a
// connection it starts is cut when the probes stop (Shutdown), as a
// per-session upstream's probe is, rather than left to the connect
// timeout: its records (the child's exit, the failure) are then written
// before the seal. An agent's connection, shared by whoever waits for
// it, is not cut by anyone's context.
func (st *upState) sharedConnect(ctx context.Context, probe bool) (*live, error) {
	st.mu.Lock()
	lv := st.shared
	st.mu.Unlock()
	if lv != nil && lv.dead() == nil {
		return lv, nil
	}
	v, err := waitShared(ctx, &st.sf, "shared", func() (any, error) {
		st.mu.Lock()
		cur := st.shared
		st.mu.Unlock()
		if cur != nil && cur.dead() == nil {
			return cur, nil
		}
		if cur != nil {
			go cur.close(cur.dead().Error())
		}
		cctx := context.WithoutCancel(ctx)
		stop := func() bool { return true }
		if probe {
			// Not cancelled once connected unless the probes had
			// already stopped: the connection lives on in its context.
			var cancel context.CancelFunc
			cctx, cancel = context.WithCancel(cctx)
			stop = context.AfterFunc(st.g.probeCtx, cancel)
		}
		lv, err := st.connect(cctx, nil)
		stop()
		st.mu.Lock()
		st.shared = lv // nil on error
		st.loaded = st.loaded || err == nil
		st.mu.Unlock()
		if err == nil {
			// The new connection's listing (checked against the pins)
			// is what the upstream exposes now, also on a reconnect
			// (after a connection failed, or a re-list after
			// list_changed did).
			st.g.rebuildCatalog()
		}
		if err == nil {
			lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), st.g.opts.ConnectTimeout)
			st.g.applySharedLevel(lctx, lv)
			cancel()
		}
		return lv, err
	})
	if err != nil {
		return nil, err
	}
	return v.(*live), nil
}

// syncTools makes the session's registered tools match the newest catalog
// (toollist.List.Sync).
func (s *session) syncTools() { s.tools.Sync() }

// notifyToolsChanged tells the agent to list its tools again
// (toollist.List.NotifyChanged).
func (s *session) notifyToolsChanged() { s.tools.NotifyChanged() }

// toolHandler is reached only if the middleware did not take the call.
func (s *session) toolHandler(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	res, err := s.callTool(ctx, req)
	if err != nil {
		return nil, err
	}
	var r mcp.CallToolResult
	if err := json.Unmarshal(res.(*rawResult).raw, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// notifyListChanged makes the SDK send notifications/<kind>/list_changed to
// this session's agent (prompts and resources are forwarded, not registered,
// so a registration change is made and undone).
func (s *session) notifyListChanged(kind string) {
	n := fmt.Sprintf("cmcp-list-changed-%d", s.dummy.Add(1))
	switch kind {
	case "prompts":
		s.srv.AddPrompt(&mcp.Prompt{Name: n}, func(context.Context, *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
			return nil, errors.New("gone")
		})
		s.srv.RemovePrompts(n)
	case "resources":
		uri := "cmcp-internal:///" + n
		s.srv.AddResource(&mcp.Resource{Name: n, URI: uri}, func(context.Context, *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
			return nil, errors.New("gone")
		})
		s.srv.RemoveResources(uri)
	}
}

// middleware is the session's request pipeline.
func (s *session) middleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		switch method {
		case "initialize":
			res, err := next(ctx, method, req)
			if err == nil {
				if ss, ok := req.GetSession().(*mcp.ServerSession); ok {
					ip, _ := req.GetParams().(*mcp.InitializeParams)
					s.bind(ss, ip)
				}
			}
			return res, err
		case "tools/call":
			s.bindLazily(req)
			return s.callTool(ctx, req.(*mcp.CallToolRequest))
		case "tools/list":
			res, err := next(ctx, method, req)
			if err != nil || s.g.opts.Filter == nil {
				return res, err
			}
			lr := res.(*mcp.ListToolsResult)
			lr.Tools = s.g.opts.Filter.FilterTools(ctx, s.principal, s.info(), lr.Tools)
			p, _ := req.GetParams().(*mcp.ListToolsParams)
			s.tools.Listed(lr.Tools, lr.NextCursor == "" && (p == nil || p.Cursor == ""))
			return lr, nil
		case "logging/setLevel":
			if p, ok := req.GetParams().(*mcp.SetLoggingLevelParams); ok {
				s.setLevel(ctx, p)
			}
			return next(ctx, method, req)
		case "resources/list":
			return s.rt.ListResources(ctx, req.(*mcp.ListResourcesRequest))
		case "resources/templates/list":
			return s.rt.ListTemplates(ctx, req.(*mcp.ListResourceTemplatesRequest))
		case "resources/read":
			s.bindLazily(req)
			return s.rt.ReadResource(ctx, req.(*mcp.ReadResourceRequest))
		case "prompts/list":
			return s.rt.ListPrompts(ctx, req.(*mcp.ListPromptsRequest))
		case "prompts/get":
			s.bindLazily(req)
			return s.rt.GetPrompt(ctx, req.(*mcp.GetPromptRequest))
		case "resources/subscribe", "completion/complete":
			s.bindLazily(req) // decided and recorded under the session's id
		}
		return next(ctx, method, req)
	}
}

func (s *session) setLevel(ctx context.Context, p *mcp.SetLoggingLevelParams) {
	s.mu.Lock()
	s.logLevel = p.Level
	lives := make([]*live, 0, len(s.lives))
	for _, lv := range s.lives {
		lives = append(lives, lv)
	}
	s.mu.Unlock()
	for _, lv := range lives {
		if lv.conn.Session.InitializeResult().Capabilities.Logging != nil {
			_ = lv.conn.Session.SetLoggingLevel(ctx, p)
		}
	}
	// A shared upstream serves every session: it logs at the most verbose
	// level any of them asked for (each session's own level still filters
	// what reaches it).
	for _, st := range s.g.ups {
		st.mu.Lock()
		shared := st.shared
		st.mu.Unlock()
		if shared != nil {
			s.g.applySharedLevel(ctx, shared)
		}
	}
}

// applySharedLevel sets a shared upstream's logging level to the most
// verbose one any session asked for, if any did.
func (g *Gateway) applySharedLevel(ctx context.Context, lv *live) {
	if lv.conn.Session.InitializeResult().Capabilities.Logging == nil {
		return
	}
	best := mcp.LoggingLevel("")
	for _, s := range g.sessionList() {
		s.mu.Lock()
		l := s.logLevel
		s.mu.Unlock()
		if l != "" && (best == "" || logLevels[l] < logLevels[best]) {
			best = l
		}
	}
	if best != "" {
		_ = lv.conn.Session.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: best})
	}
}

// watchLists re-checks every session's tool list every interval, for
// policies whose list_tools decisions depend on the time.
func (g *Gateway) watchLists(every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for range t.C {
		if g.closing.Load() {
			return
		}
		ss := g.sessionList()
		for _, s := range ss {
			s.tools.Recheck()
		}
	}
}
