package gateway

import (
	"context"
	"io"
	"log/slog"

	"github.com/confidential-mcp/cmcp/pkg/auditlog"
)

// What the server assembly (internal/server) drives a running gateway
// with, besides New, Start, Shutdown and the fronts.

// Record appends rec to the audit log; it is written even if ctx ends
// meanwhile. A failure is logged and returned.
func (g *Gateway) Record(ctx context.Context, rec auditlog.Record) error { return g.record(ctx, rec) }

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
