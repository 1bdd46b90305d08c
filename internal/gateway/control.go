package gateway

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"

	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// What the server assembly (internal/server) drives a running gateway
// with, besides New, Start, Shutdown and the fronts.

// Record appends rec to the audit log; it is written even if ctx ends
// meanwhile. A failure is logged and returned.
func (g *Gateway) Record(ctx context.Context, rec record.Record) error { return g.record(ctx, rec) }

// Logger is the gateway log (Options.Logger).
func (g *Gateway) Logger() *slog.Logger { return g.logger }

// BeginDrain refuses new calls from now on (answered -32068, recorded);
// Shutdown then waits for the calls in flight and cuts what is left.
func (g *Gateway) BeginDrain() { g.closing.Store(true) }

// Draining reports whether the gateway refuses new calls (BeginDrain or
// Shutdown ran).
func (g *Gateway) Draining() bool { return g.closing.Load() }

// ServeStdioNotify is ServeStdio; inputEnded, if set, is called once in
// ends, while the requests read are still being answered (the server
// bounds that by server.shutdown_grace).
func (g *Gateway) ServeStdioNotify(ctx context.Context, in io.ReadCloser, out io.WriteCloser, identity string, inputEnded func()) error {
	return g.serveStdio(ctx, in, out, identity, inputEnded)
}

// FastPathCalls counts the tools/call requests a front answered itself,
// without go-sdk (fastpath.go).
func (g *Gateway) FastPathCalls() int64 { return g.fastPath.Load() }

// UpstreamsReady is the upstreams' part of the gateway's readiness
// (/readyz): an error naming the first upstream and why it is unavailable
// when none is available; nil when one is, or there are none. A tunnel
// upstream waits for machines to dial in to this gateway: it never makes
// the gateway unready (its machines could not reach an unready one behind
// a load balancer).
func (g *Gateway) UpstreamsReady() error {
	ups := slices.DeleteFunc(g.Upstreams(), func(u UpstreamStatus) bool { return u.Transport == "tunnel" })
	if len(ups) > 0 && !slices.ContainsFunc(ups, func(u UpstreamStatus) bool { return u.Available }) {
		return fmt.Errorf("no upstream is available (%s: %s)", ups[0].Name, ups[0].Error)
	}
	return nil
}

// UpstreamsUp reports, by name, whether each upstream is available now
// (cmcp_upstream_up).
func (g *Gateway) UpstreamsUp() map[string]bool {
	up := map[string]bool{}
	for _, u := range g.Upstreams() {
		up[u.Name] = u.Available
	}
	return up
}
