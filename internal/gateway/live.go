package gateway

import (
	"github.com/confidential-mcp/cmcp/internal/toagent"
	"github.com/confidential-mcp/cmcp/internal/toolprobe"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"

	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/catalog"
	"github.com/confidential-mcp/cmcp/internal/upstream"
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

	// rl relays what the upstream sends the agents on its own initiative
	// (internal/toagent: progress, logging, sampling, elicitation, roots,
	// list changes) and tracks the requests forwarded on conn.
	rl *toagent.Relay

	mu      sync.Mutex
	allowed map[string]bool // upstream tool names usable on this connection
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

	// refill, on a warm spare just handed out, makes its replacement:
	// called once its first call is answered (see spares.Funcs.RefillAfter).
	refill atomic.Pointer[func()]
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
	lv := &live{st: st, ready: make(chan struct{})}
	lv.rl = toagent.New(liveConn{lv})
	if !st.opts.Shared {
		lv.owner.Store(s)
	}
	sessID := ""
	if s != nil {
		sessID = s.id
	}
	client := mcp.NewClient(&mcp.Implementation{Name: g.opts.Name, Version: g.opts.Version}, &mcp.ClientOptions{
		Capabilities: lv.rl.ClientCaps(),
		// Notifications that reach the client session (an HTTP upstream's
		// standalone stream); Intercept takes those read beside it.
		ResourceUpdatedHandler: lv.rl.ResourceUpdated,
		ToolListChangedHandler: lv.onToolsChanged,
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			lv.rl.OnProgress(req.Params)
		},
		LoggingMessageHandler: func(_ context.Context, req *mcp.LoggingMessageRequest) {
			lv.rl.OnLog(req.Params)
		},
		PromptListChangedHandler: func(context.Context, *mcp.PromptListChangedRequest) {
			lv.rl.ListChanged("prompts")
		},
		ResourceListChangedHandler: func(context.Context, *mcp.ResourceListChangedRequest) {
			lv.rl.ListChanged("resources")
		},
	})
	client.AddReceivingMiddleware(lv.rl.ServerRequests)
	cctx := upstream.WithSession(ctx, sessID)
	conn, err := toolprobe.ConnectWithin(cctx, g.opts.ConnectTimeout, func(ctx context.Context) (*upstream.Conn, error) {
		return st.opts.Upstream.Connect(ctx, client, upstream.ConnectOptions{Intercept: lv.rl.Intercept, ServerRequest: lv.rl.ServerRequest, Identity: st.identityFor(s)})
	})
	if err != nil && errors.Is(err, toolprobe.ErrConnectTimeout) {
		err = fmt.Errorf("upstream %q did not complete the MCP handshake within %s: %w", st.name, g.opts.ConnectTimeout, err)
	}
	if m := g.opts.Metrics; m != nil {
		m.UpstreamHealth(st.name, err == nil)
	}
	if err != nil {
		g.record(ctx, &record.Upstream{Name: st.name, Transport: st.transport(), EvidenceClass: st.expectedClass(), Session: sessID, Event: "failed", Reason: err.Error()})
		return nil, err
	}
	lv.conn, lv.client = conn, client
	init := conn.Session.InitializeResult()
	// tools/list is part of starting: bounded like the handshake.
	tools, err := toolprobe.ListTools(ctx, conn.Session, g.opts.ConnectTimeout)
	if err != nil {
		conn.Close()
		err = fmt.Errorf("upstream %q: %w", st.name, err)
		g.record(ctx, &record.Upstream{Name: st.name, Transport: st.transport(), EvidenceClass: conn.Class, Session: sessID, Event: "failed", Reason: err.Error()})
		return nil, err
	}
	up := &record.Upstream{Name: st.name, Transport: st.transport(), Endpoint: conn.Ref, EvidenceClass: conn.Class, Tools: int64(len(tools)), Session: sessID, Event: "connected"}
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
	lv.st.g.record(context.Background(), &record.Upstream{Name: lv.st.name, Transport: lv.st.transport(), EvidenceClass: lv.conn.Class, Session: sessID, Event: "disconnected", Reason: reason})
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

// track registers a request forwarded for s (see toagent.Relay.Track).
func (lv *live) track(ctx context.Context, s *session, agentToken any) (upTok any, release func()) {
	return lv.rl.Track(ctx, agentOf(s), agentToken)
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
		g.record(context.Background(), &record.Upstream{Name: st.name, Transport: st.transport(), EvidenceClass: lv.conn.Class, Session: sessID, Event: "failed", Reason: err.Error()})
		return
	}
	lv.applyTools(context.Background(), tools, nil, sessID)
	if owner == nil {
		g.rebuildCatalog()
	} else {
		owner.syncTools()
	}
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
