// Package gateway is the core of cmcp serve: the MCP front ends (Streamable
// HTTP and stdio) that agents talk to, their authentication and sessions,
// the catalog of upstream tools, the call pipeline (route, decide, record
// durably, forward, record the result) and faithful forwarding of
// everything else MCP carries between an agent and its upstreams. It takes
// plain options; internal/server builds it from the configuration.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/sync/singleflight"

	"github.com/confidential-mcp/cmcp/internal/catalog"
	"github.com/confidential-mcp/cmcp/internal/credential"
	"github.com/confidential-mcp/cmcp/internal/decide"
	"github.com/confidential-mcp/cmcp/internal/killswitch"
	"github.com/confidential-mcp/cmcp/internal/policy"
	"github.com/confidential-mcp/cmcp/internal/sessionbounds"
	"github.com/confidential-mcp/cmcp/internal/spares"
	"github.com/confidential-mcp/cmcp/internal/upstream"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// AuditLog is what the gateway needs from the audit log writer.
// *auditlog.Writer implements it.
type AuditLog interface {
	Append(ctx context.Context, rec record.Record) (auditlog.Receipt, error)
	Commit(payload []byte) record.Commitment
	// Checkpoint makes every record appended so far durable (and signs a
	// checkpoint over them).
	Checkpoint() error
}

// UpstreamOptions configures one upstream in the gateway.
type UpstreamOptions struct {
	Upstream upstream.Upstream
	// Namespaced exposes tools as "<upstream>__<tool>" (the default);
	// false is allowed for a single upstream only.
	Namespaced bool
	// Shared runs one connection (child) for all sessions instead of one
	// per session.
	Shared bool
	// ToolPins maps the upstream's tool names to definition digests. Nil:
	// the definitions seen on the first connection of this run are the
	// baseline (recorded as such), later connections are checked against it.
	ToolPins map[string]digest.Digest
	// DriftWarn flags drifted tools but keeps them (drift: warn); the
	// default refuses them.
	DriftWarn bool
	// Transport is recorded in upstream records ("stdio", "http").
	Transport string
	// Class is the evidence class the configuration promises (recorded
	// for calls refused before any connection was made).
	Class string
	// Credentials, for an HTTP upstream with a credential source, is the
	// broker that mints its credentials (also set in its HTTPOptions).
	Credentials *credential.Broker
	// WarmSpares is how many connections of a per-session upstream are
	// kept made ahead of demand, each handed to one session (spares.go);
	// 0: none.
	WarmSpares int
}

// Options configures a Gateway.
type Options struct {
	Name      string // implementation name shown to agents ("cmcp")
	Version   string
	Upstreams []UpstreamOptions
	Log       AuditLog
	Decider   Decider    // nil: AllowAll, or the policy engine when Policy is set
	Filter    ListFilter // nil: no filtering, or the policy engine when Policy is set
	// Policy is the Cedar engine that decides every call and filters
	// tools/list (action list_tools). Nil: no policy (mode "none").
	Policy  *policy.Engine
	Metrics Metrics // nil: no metrics (*metrics.Registry counts)
	Logger  *slog.Logger
	// CallTimeout bounds one forwarded tools/call (0: 5 minutes), and is
	// the HTTP front's default HTTPOptions.WriteStallTimeout.
	CallTimeout time.Duration
	// ConnectTimeout bounds starting an upstream and its MCP handshake
	// (0: 1 minute).
	ConnectTimeout time.Duration
	// Environ is the gateway's environment; children get only allowlisted
	// variables from it.
	Environ []string
	// ListRecheck is how often every session's tools/list is re-filtered,
	// so that an agent is sent list_changed when the time alone changes
	// what the policy lets it see (0: 30 seconds). Changes caused by a
	// session's own calls are found within toollist.RecheckDelay of the call.
	ListRecheck time.Duration
	// KillSwitchFile is where the engaged kill switch's state is kept
	// (killswitch.Switch; server.Serve puts it in the audit directory). Start engages
	// the switch if the file is there or cannot be read. "": the switch
	// lives in memory only.
	KillSwitchFile string
	// OnSessionEnd, if set, is called (in the session's closing goroutine;
	// keep it short) with the id of a session once its end is recorded,
	// e.g. to queue its receipt (server.Serve, audit.receipts).
	OnSessionEnd func(id string)
}

// Gateway is a running cmcp gateway.
type Gateway struct {
	opts    Options
	log     AuditLog
	decider Decider
	logger  *slog.Logger

	ups   map[string]*upState
	order []string

	rebuildMu sync.Mutex // serialises rebuildCatalog

	mu      sync.Mutex
	catalog *catalog.Catalog
	caps    *mcp.ServerCapabilities
	// instructions are the upstreams' server instructions, passed on.
	instructions string
	sessions     map[*session]struct{}
	byID         map[string]*session
	slots        sessionbounds.Slots // the HTTP front's open sessions, against its bounds

	ks       *killswitch.Switch // the kill switch
	closing  atomic.Bool
	inflight counter      // tools/call requests in the pipeline
	fastPath atomic.Int64 // tools/call requests a front answered itself (fastpath.go)
	results  counter      // result records being appended
	// ending: sessions whose end is under way (their children stopping,
	// their records not yet written); lives: upstream connections made
	// and not yet closed. Shutdown waits for both before the log is
	// sealed.
	ending counter
	lives  counter
	nextID atomic.Uint64

	// probeCtx ends when Shutdown begins: the background probes of
	// unavailable upstreams (reprobe) stop, and Shutdown waits for them
	// (probes) before it closes the upstreams.
	probeCtx  context.Context
	probeStop context.CancelFunc
	probes    counter

	// spareCount is the warm spares of every upstream made, being made or
	// ready; spareBound the HTTP front's session bound they count in (0:
	// none). See spares.go.
	spareCount, spareBound atomic.Int64
}

// upState is the gateway's view of one upstream.
type upState struct {
	g    *Gateway
	opts UpstreamOptions
	name string

	mu       sync.Mutex
	baseline map[string]digest.Digest // approved definitions (pins or first seen)
	tools    []*mcp.Tool              // the approved tools, upstream names
	init     *mcp.InitializeResult
	class    string // evidence class of the last connection
	lastErr  error  // why the upstream is unavailable, if it is
	loaded   bool
	probing  bool // a background probe runs (reprobe)

	sf     singleflight.Group
	shared *live // the shared connection, when Shared
	// spares are the warm spares of a per-session upstream (nil: none).
	spares *spares.Pool[*live]
}

// New builds a gateway. It does not connect to any upstream: Start does.
func New(opts Options) (*Gateway, error) {
	if opts.Log == nil {
		return nil, errors.New("gateway: an audit log is required: calls are never run unrecorded")
	}
	if opts.Name == "" {
		opts.Name = "cmcp"
	}
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = 5 * time.Minute
	}
	if opts.ConnectTimeout <= 0 {
		opts.ConnectTimeout = time.Minute
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	g := &Gateway{opts: opts, log: opts.Log, decider: opts.Decider, logger: opts.Logger,
		ups: map[string]*upState{}, catalog: catalog.New(), sessions: map[*session]struct{}{}, byID: map[string]*session{}}
	g.ks = &killswitch.Switch{File: func() string { return g.opts.KillSwitchFile }, Log: killLog{g}, Logger: opts.Logger}
	g.probeCtx, g.probeStop = context.WithCancel(context.Background())
	if opts.Policy != nil {
		pd := &decide.Cedar{Engine: opts.Policy, Logger: g.logger, Tools: g.policyTools}
		if g.decider == nil {
			g.decider = pd
		}
		if g.opts.Filter == nil {
			g.opts.Filter = pd
		}
	}
	if g.decider == nil {
		g.decider = AllowAll{}
	}
	if g.opts.Filter != nil {
		every := opts.ListRecheck
		if every <= 0 {
			every = 30 * time.Second
		}
		go g.watchLists(every)
	}
	for _, u := range opts.Upstreams {
		name := u.Upstream.Name()
		if err := catalog.CheckUpstreamName(name); err != nil {
			return nil, err
		}
		if _, dup := g.ups[name]; dup {
			return nil, fmt.Errorf("upstream %q is configured twice", name)
		}
		if !u.Namespaced && len(opts.Upstreams) > 1 {
			return nil, fmt.Errorf("upstream %q: namespace: false is only allowed with a single upstream", name)
		}
		st := &upState{g: g, opts: u, name: name}
		if u.ToolPins != nil {
			st.baseline = u.ToolPins
		}
		g.ups[name] = st
		g.order = append(g.order, name)
	}
	return g, nil
}

// Start connects once to every upstream to learn its tools, checks them
// against their pins and builds the catalog. An upstream that cannot be
// started (digest mismatch, exit at start) stays in the configuration as
// unavailable: calls to it are refused with the reason, and each call tries
// again (re-measured). Per-session upstreams are stopped after this probe;
// a shared one is kept.
func (g *Gateway) Start(ctx context.Context) error {
	g.ks.Restore(ctx)
	g.recordPolicyLoaded(ctx)
	for _, name := range g.order {
		st := g.ups[name]
		if st.perIdentity() {
			g.logger.Info("upstream connects on each identity's first call (its credential is minted per identity)", "upstream", name, "source", st.opts.Credentials.Source())
			continue
		}
		if err := st.load(ctx); err != nil {
			g.logger.Warn("upstream unavailable", "upstream", name, "err", err)
		}
	}
	g.rebuildCatalog()
	g.startSpares()
	return nil
}

// waitShared runs fn once for all concurrent callers with the same key
// (singleflight), but each caller waits only as long as its own ctx: an
// agent that gives up leaves the attempt running for the others (fn must
// not depend on any one caller's ctx, and must itself be bounded).
func waitShared(ctx context.Context, sf *singleflight.Group, key string, fn func() (any, error)) (any, error) {
	select {
	case r := <-sf.DoChan(key, fn):
		return r.Val, r.Err
	case <-ctx.Done():
		return nil, fmt.Errorf("gave up waiting for the upstream to start: %w", context.Cause(ctx))
	}
}

// load connects to the upstream (unless already loaded) and approves its
// tools. Concurrent callers share one attempt.
// LoadUpstream loads upstream name's tools now if they are not loaded
// yet (a tunnel upstream, once its first machine registered).
func (g *Gateway) LoadUpstream(ctx context.Context, name string) error {
	st := g.ups[name]
	if st == nil {
		return fmt.Errorf("no upstream %q", name)
	}
	return st.load(ctx)
}

func (st *upState) load(ctx context.Context) error {
	st.mu.Lock()
	loaded := st.loaded
	st.mu.Unlock()
	if loaded {
		return nil
	}
	_, err := waitShared(ctx, &st.sf, "load", func() (any, error) {
		st.mu.Lock()
		if st.loaded {
			st.mu.Unlock()
			return nil, nil
		}
		st.mu.Unlock()
		// Shared by every caller: not ended by the first caller's ctx
		// (the connection is bounded by ConnectTimeout).
		lv, err := st.connect(context.WithoutCancel(ctx), nil)
		if err != nil {
			return nil, err
		}
		st.mu.Lock()
		st.loaded = true
		if st.opts.Shared {
			st.shared = lv
		}
		st.mu.Unlock()
		if !st.opts.Shared {
			lv.close("catalog probe done")
		}
		return nil, nil
	})
	if err == nil {
		st.g.rebuildCatalog()
	}
	return err
}

// rebuildCatalog recomputes the exposed tools and the capabilities from the
// loaded upstreams and updates every session's visible tools. Rebuilds are
// serialised (rebuildMu), reading the upstreams and storing the result as
// one step: of two at once (a shared reconnect and a re-list), the one
// that read the upstreams last stores last, so an older snapshot never
// replaces a newer one.
func (g *Gateway) rebuildCatalog() {
	g.rebuildMu.Lock()
	cat, offer := catalog.New(), catalog.NewOffer(len(g.order))
	for _, name := range g.order {
		st := g.ups[name]
		st.mu.Lock()
		tools, baseline, init := st.tools, st.baseline, st.init
		st.mu.Unlock()
		// A name that tools of two upstreams map to is exposed for
		// neither (Catalog.Add): neither this order nor which upstream
		// came up first decides which tool a name means.
		refused := cat.Add(name, st.opts.Namespaced, tools, baseline)
		for _, d := range refused {
			g.recordDrift(context.Background(), d, "refused", "")
		}
		offer.Add(name, init)
	}
	g.mu.Lock()
	g.catalog, g.caps, g.instructions = cat, offer.Capabilities(), offer.Instructions()
	sessions := make([]*session, 0, len(g.sessions))
	for s := range g.sessions {
		sessions = append(sessions, s)
	}
	g.mu.Unlock()
	g.rebuildMu.Unlock()
	for _, s := range sessions {
		s.syncTools()
	}
}

// Catalog returns the current catalog.
func (g *Gateway) Catalog() *catalog.Catalog {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.catalog
}

// CatalogDigest is the digest of the exposed tools and their pins.
func (g *Gateway) CatalogDigest() digest.Digest { return g.Catalog().Digest() }

// SetKillSwitch engages or clears the kill switch (killswitch.Switch.Set):
// while it is on, every tools/call, and every resources/read,
// resources/subscribe, prompts/get and completion/complete (decide.Gate),
// is refused (and recorded). No call or access record written after
// kill_switch_on in the log says "forwarded": relay and the access gate
// check the switch and append their forwarded record under its read lock.
func (g *Gateway) SetKillSwitch(ctx context.Context, on bool, actor, reason string) error {
	return g.ks.Set(ctx, on, actor, reason)
}

// KillSwitch reports whether the kill switch is engaged.
func (g *Gateway) KillSwitch() bool { return g.ks.Engaged() }

// Sessions returns the number of live agent sessions.
func (g *Gateway) Sessions() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.sessions)
}

// UpstreamStatus is the health of one upstream.
type UpstreamStatus struct {
	Name          string
	Available     bool
	EvidenceClass string
	Transport     string // stdio, http, tunnel
	Tools         int
	Error         string
}

// Upstreams reports the status of every upstream, by name.
func (g *Gateway) Upstreams() []UpstreamStatus {
	var out []UpstreamStatus
	for _, name := range g.order {
		st := g.ups[name]
		st.mu.Lock()
		s := UpstreamStatus{Name: name, Available: st.loaded && st.lastErr == nil, EvidenceClass: st.class, Transport: st.transport(), Tools: len(st.tools)}
		if st.lastErr != nil {
			s.Error = st.lastErr.Error()
		}
		st.mu.Unlock()
		out = append(out, s)
	}
	return out
}

// sessionList is a snapshot of the live agent sessions.
func (g *Gateway) sessionList() []*session {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]*session, 0, len(g.sessions))
	for s := range g.sessions {
		out = append(out, s)
	}
	return out
}

// ShutdownLinger is how long a drain waits after the calls it drained,
// before the sessions end.
const ShutdownLinger = 200 * time.Millisecond

// drain refuses new calls (-32068) and waits until the calls in flight are
// done, or ctx ends; it reports whether they are done. After calls it
// drained it lingers: their answers are written, but an agent reads them
// on their own connections (and a call go-sdk answers leaves the pipeline
// just before go-sdk writes the answer), while ending the sessions closes
// their notification streams, which a client may see first and fail the
// call it was about to be answered.
func (g *Gateway) drain(ctx context.Context) bool {
	g.closing.Store(true)
	drained := g.inflight.n.Load() > 0
	g.inflight.wait(ctx)
	if ctx.Err() != nil {
		return g.inflight.n.Load() == 0
	}
	if drained {
		select {
		case <-time.After(ShutdownLinger):
		case <-ctx.Done():
		}
	}
	return true
}

// liveCloseWait bounds how long Shutdown waits for upstream connections
// that something else is closing (a session already ending, a connection
// dropped after a failure) once it has closed every one it can reach.
const liveCloseWait = 30 * time.Second

// Shutdown stops accepting calls, waits for in-flight calls until ctx ends,
// then closes every session and stops every upstream. The calls still
// running then are cut: cancelled upstream, answered -32068 on the agent's
// connection before it closes, and recorded as cancelled by the shutdown;
// the gateway log warns how many. That is the drain working as configured,
// not an error. It returns once the records of all that (session ends,
// disconnections, child exits, results) are written: the caller seals the
// log next, and a record appended after the seal would be lost.
func (g *Gateway) Shutdown(ctx context.Context) error {
	g.probeStop() // no upstream is probed again; one under way is cut
	g.closeSpares("gateway shutdown")
	if !g.drain(ctx) {
		g.logger.Warn("shutdown: the drain ended with calls still in flight; cutting them (cancelled upstream, answered -32068, recorded)", "calls", g.inflight.n.Load())
	}
	sessions := g.sessionList()
	// Every session's calls are cut before anything closes: a call on a
	// shared upstream would otherwise fail as the upstream's failure.
	for _, s := range sessions {
		s.cut(endShutdown)
	}
	// A probe still connecting finishes (cut by probeStop; one waiting
	// for an agent's shared connection is bounded by the connect
	// timeout) before the shared connections are closed: one it made is
	// closed below, and its records are written before the seal. The
	// wait ends with ctx: the probes were cut when Shutdown began.
	pctx, pcancel := context.WithTimeout(ctx, liveCloseWait)
	if g.probes.wait(pctx); g.probes.n.Load() > 0 {
		g.logger.Warn("shutdown: upstream probes still connecting; their records may be missing from the sealed log", "probes", g.probes.n.Load())
	}
	pcancel()
	var wg sync.WaitGroup
	for _, s := range sessions {
		wg.Add(1)
		go func() { defer wg.Done(); s.end(endShutdown) }()
	}
	for _, name := range g.order {
		st := g.ups[name]
		st.mu.Lock()
		lv := st.shared
		st.shared = nil
		st.mu.Unlock()
		if lv != nil {
			wg.Add(1)
			go func() { defer wg.Done(); lv.close("gateway shutdown") }()
		}
	}
	wg.Wait()
	// Sessions that were ending already (their agent left just before)
	// are no longer listed: they finish here, as do connections closed in
	// the background.
	g.ending.Wait()
	lctx, cancel := context.WithTimeout(context.Background(), liveCloseWait)
	defer cancel()
	if g.lives.wait(lctx); g.lives.n.Load() > 0 {
		g.logger.Warn("shutdown: upstream connections still closing; their records may be missing from the sealed log", "connections", g.lives.n.Load(), "waited", liveCloseWait)
	}
	g.results.wait(context.Background())
	return nil
}

func (g *Gateway) recordDrift(ctx context.Context, d catalog.DriftEvent, action, session string) {
	change := d.Kind
	if change == catalog.DriftAdded {
		change = "new"
	}
	rec := &record.Drift{Upstream: d.Upstream, Tool: d.Tool, Change: change, Pin: d.Pinned, Observed: d.Got, Action: action, Session: session}
	if _, err := g.log.Append(context.WithoutCancel(ctx), rec); err != nil {
		g.logger.Error("record drift", "err", err)
	}
	g.logger.Warn("tool drift", "upstream", d.Upstream, "tool", d.Tool, "action", action, "detail", d.String())
}

// record appends rec. It is written even if ctx ends meanwhile: a record
// is never lost because the agent cancelled or the session ended (Append
// gives up on a cancelled ctx before the record is queued).
func (g *Gateway) record(ctx context.Context, rec record.Record) error {
	_, err := g.log.Append(context.WithoutCancel(ctx), rec)
	if err != nil {
		g.logger.Error("audit append failed", "kind", rec.Kind(), "err", err)
	}
	return err
}

// counter counts work in flight. Unlike a WaitGroup it may be incremented
// while someone waits for zero (calls keep arriving during a drain).
type counter struct{ n atomic.Int64 }

func (c *counter) Add(d int64) { c.n.Add(d) }
func (c *counter) Done()       { c.n.Add(-1) }

// wait returns when the count is zero or ctx ends.
func (c *counter) wait(ctx context.Context) {
	for c.n.Load() > 0 && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
}

// Wait is wait without a deadline.
func (c *counter) Wait() { c.wait(context.Background()) }
