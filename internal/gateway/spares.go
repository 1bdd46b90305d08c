package gateway

import (
	"context"
	"fmt"
	"time"

	"github.com/confidential-mcp/cmcp/internal/spares"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// Warm spares (UpstreamOptions.WarmSpares): connections of a per-session
// upstream made ahead of demand, as the startup probe makes one: the child
// spawned and measured against its pin, the MCP handshake done, its tools
// listed and checked against the baseline, and each step recorded when it
// happens (spawn and connected records without a session). An agent
// session that needs the upstream takes a ready spare instead of waiting
// for a new connection: it is handed to that one session, recorded then
// (an upstream record "assigned" naming the session and the child's pid),
// and ends with it like any per-session connection (its disconnected and
// exit records name the session); it is never handed to another. A spare
// that ended while it waited, or whose command file or interpreter
// changed on disk since it was measured, is dropped, recorded, instead of
// handed out: the session then starts a new connection, which measures the
// files again and is refused if they no longer match the pin. The pool is
// refilled in the background, only while the HTTP front's open sessions
// and the spares together stay below its session bound
// (server.max_sessions; serve --stdio, one session per process, makes
// none), a spare's replacement once the spare's first call is answered
// (or spareRefillAfter after it was taken); DrainSpares (a reload) drops
// every spare, and
// Shutdown drops them before the log is sealed.
//
// A spare is initialised before its agent is known: it offers the
// upstream sampling and elicitation, as the probe does, and not the
// agent's own client capabilities (roots, say).

// startSpares starts the warm spares of the per-session upstreams that
// have them. Start calls it after the startup probes.
func (g *Gateway) startSpares() {
	g.slots.OnRelease(g.fillSpares)
	for _, name := range g.order {
		st := g.ups[name]
		if st.opts.WarmSpares <= 0 || st.opts.Shared {
			continue
		}
		st.spares = spares.New(st.opts.WarmSpares, spares.Funcs[*live]{
			Make: func(ctx context.Context) (*live, error) {
				return st.connect(ctx, nil)
			},
			Drop: func(lv *live, reason string) { lv.close(reason) },
			Unusable: func(lv *live) string {
				if err := lv.dead(); err != nil {
					return err.Error()
				}
				return lv.conn.Changed()
			},
			Reserve:     g.reserveSpare,
			Release:     func() { g.spareCount.Add(-1) },
			RefillAfter: spareRefillAfter,
		})
	}
}

// spareRefillAfter bounds how long the replacement of a warm spare handed
// out waits for the spare's first call to be answered. Spawning it at
// once made the fresh child's first answer (its code still cold) wait
// for the CPU the spawn took.
const spareRefillAfter = 100 * time.Millisecond

// reserveSpare takes room for one more spare: the HTTP front's open
// sessions and the spares of every upstream together stay below its
// session bound. Without the HTTP front there is none: serve --stdio
// serves one session per process, which a spare would not speed up.
func (g *Gateway) reserveSpare() bool {
	bound := g.spareBound.Load()
	for {
		n := g.spareCount.Load()
		open := int64(g.slots.Open())
		if open+n >= bound {
			return false
		}
		if g.spareCount.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// takeSpare hands a ready warm spare of st to session s, recorded, or
// returns nil when there is none.
func (st *upState) takeSpare(ctx context.Context, s *session) *live {
	if st.spares == nil {
		return nil
	}
	lv, ok := st.spares.Take()
	if !ok {
		return nil
	}
	lv.owner.Store(s)
	lv.conn.Assign(s.id)
	refill := st.spares.Fill
	lv.refill.Store(&refill)
	err := st.g.record(ctx, &record.Upstream{Name: st.name, Transport: st.transport(), Endpoint: lv.conn.Ref, EvidenceClass: lv.conn.Class,
		Session: s.id, Event: "assigned", Reason: "a warm spare, started and recorded before the session, now serves it alone"})
	if err != nil {
		lv.close(fmt.Sprintf("the warm spare's hand-over to session %s could not be recorded: %v", s.id, err))
		return nil
	}
	return lv
}

// DrainSpares drops every warm spare (and those being made), recording
// reason, and makes new ones: a reload (SIGHUP) calls it, so that no
// spare made before it is handed out after it.
func (g *Gateway) DrainSpares(reason string) {
	for _, name := range g.order {
		if st := g.ups[name]; st.spares != nil {
			st.spares.Drain(reason)
		}
	}
}

// fillSpares makes spares where they are missing and there is room.
func (g *Gateway) fillSpares() {
	for _, name := range g.order {
		if st := g.ups[name]; st.spares != nil {
			st.spares.Fill()
		}
	}
}

// closeSpares drops every warm spare for good (Shutdown).
func (g *Gateway) closeSpares(reason string) {
	for _, name := range g.order {
		if st := g.ups[name]; st.spares != nil {
			st.spares.Close(reason)
		}
	}
}

// SparesReady is the number of warm spares of upstream name ready to be
// handed out.
func (g *Gateway) SparesReady(name string) int {
	if st := g.ups[name]; st != nil && st.spares != nil {
		return st.spares.Ready()
	}
	return 0
}
