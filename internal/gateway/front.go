package gateway

import (
	"context"
	"errors"
	"io"

	"github.com/confidential-mcp/cmcp/internal/front/httpfront"
	"github.com/confidential-mcp/cmcp/internal/front/stdiofront"
)

func (g *Gateway) sessionByID(id string) *session {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.byID[id]
}

// ServeStdio serves one agent session over in and out (cmcp serve --stdio:
// the agent spawned cmcp). It returns when the agent has closed its end
// (in ended) and every request it sent is answered, or when ctx ends,
// after the session's children are stopped.
func (g *Gateway) ServeStdio(ctx context.Context, in io.ReadCloser, out io.WriteCloser, identity string) error {
	return g.serveStdio(ctx, in, out, identity, nil)
}

// serveStdio is ServeStdio; inputEnded, if set, is called once in ends,
// while the requests read are still being answered (server.Serve bounds that
// by server.shutdown_grace).
func (g *Gateway) serveStdio(ctx context.Context, in io.ReadCloser, out io.WriteCloser, identity string, inputEnded func()) error {
	if identity == "" {
		identity = httpfront.AnonymousIdentity
	}
	s := g.newSession(identity, "stdio")
	err := s.srv.Run(ctx, &stdiofront.Transport{In: in, Out: out, Fast: s.stdioFast, Passed: s.recordUndecodableCall, BadID: s.recordBadIDCall,
		Ambiguous: s.refuseAmbiguousCall, Unanswered: &s.stdio.unanswered, InputEnded: inputEnded, AgentReqs: &s.stdio.agentReqs})
	s.end(endedFor("the agent closed the stdio connection"))
	if err != nil && (errors.Is(err, io.EOF) || errors.Is(err, context.Canceled)) {
		return nil
	}
	return err
}
