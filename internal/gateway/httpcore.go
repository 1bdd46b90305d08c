package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/callwire"
	"github.com/confidential-mcp/cmcp/internal/credential"
	"github.com/confidential-mcp/cmcp/internal/front/httpfront"
	"github.com/confidential-mcp/cmcp/internal/oauth"
	"github.com/confidential-mcp/cmcp/internal/rpcwire"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// The core's side of the Streamable HTTP front (internal/front/httpfront):
// the front reaches the gateway only through httpCore and httpSession.

// HTTPCore is the gateway as the HTTP front uses it:
// httpfront.New(g.HTTPCore(), options) is the agent-facing MCP endpoint.
func (g *Gateway) HTTPCore() httpfront.Core { return httpCore{g} }

type httpCore struct{ g *Gateway }

func (c httpCore) Implementation() *mcp.Implementation {
	return &mcp.Implementation{Name: c.g.opts.Name, Version: c.g.opts.Version}
}

func (c httpCore) Logger() *slog.Logger           { return c.g.logger }
func (c httpCore) CallTimeout() time.Duration     { return c.g.opts.CallTimeout }
func (c httpCore) Draining() bool                 { return c.g.closing.Load() }
func (c httpCore) ProtocolVersions() []string     { return frontVersions() }
func (c httpCore) ReapIdle(timeout time.Duration) { c.g.reapIdle(timeout) }

func (c httpCore) SessionBound(maxSessions int) {
	c.g.spareBound.Store(int64(maxSessions)) // warm spares count in it (spares.go)
	c.g.fillSpares()
}

func (c httpCore) TakeSlot(who string, maxSessions, maxPerAgent int) (func(), string, int) {
	return c.g.slots.Take(who, maxSessions, maxPerAgent)
}

func (c httpCore) SessionRefused(limit string) {
	if m := c.g.opts.Metrics; m != nil {
		m.SessionRefused(limit)
	}
}

func (c httpCore) OpenSession(who string, tok digest.Digest, release func()) httpfront.Session {
	s := c.g.newSession(who, "http")
	s.http.token, s.http.releaseSlot = tok, release
	return httpSession{s}
}

func (c httpCore) Session(id string) httpfront.Session {
	if s := c.g.sessionByID(id); s != nil {
		return httpSession{s}
	}
	return nil
}

// reapIdle ends HTTP sessions that had no POST in progress for longer than
// timeout (go-sdk's rule: a standalone GET stream does not keep a session
// alive), stopping their children.
func (g *Gateway) reapIdle(timeout time.Duration) {
	t := time.NewTicker(min(max(timeout/4, 10*time.Millisecond), 30*time.Second))
	defer t.Stop()
	for range t.C {
		if g.closing.Load() {
			return
		}
		cutoff := time.Now().Add(-timeout).UnixNano()
		for _, s := range g.sessionList() {
			if s.front == "http" && s.http.posts.Load() == 0 && s.http.lastPost.Load() < cutoff {
				go s.end(endedFor(fmt.Sprintf("idle for longer than the session timeout (%s)", timeout)))
			}
		}
	}
}

// httpSession is one session of the HTTP front.
type httpSession struct{ s *session }

func (h httpSession) Server() *mcp.Server                { return h.s.srv }
func (h httpSession) Principal() string                  { return h.s.principal }
func (h httpSession) Initialized() bool                  { return h.s.downSession() != nil }
func (h httpSession) Context() context.Context           { return h.s.ctx }
func (h httpSession) Pending() *rpcwire.Pending          { return &h.s.serverReqs }
func (h httpSession) StreamOpenedWith(tok digest.Digest) { h.s.streamOpenedWith(tok) }
func (h httpSession) Passed(req *jsonrpc.Request)        { h.s.recordUndecodableCall(req) }
func (h httpSession) BadID(body []byte, why string)      { h.s.recordBadIDCall(body, why) }
func (h httpSession) CancelCall(params json.RawMessage) bool {
	return h.s.fast.cancel(params)
}

func (h httpSession) AuthedWith(id *oauth.Identity, token credential.Secret) {
	h.s.authedWith(id, token)
}

func (h httpSession) Ambiguous(req *jsonrpc.Request, body []byte) (jsonrpc.ID, *jsonrpc.Error, bool) {
	return h.s.refuseAmbiguousCall(req, body)
}

func (h httpSession) PostBegan() func() {
	h.s.http.posts.Add(1)
	return func() {
		h.s.http.lastPost.Store(time.Now().UnixNano())
		h.s.http.posts.Add(-1)
	}
}

func (h httpSession) Delete() func() {
	h.s.cutAndAnswer(endedFor(whyDeleted))
	return func() { h.s.end(endedFor(whyDeleted)) }
}

// Call is the fast path of a tools/call the HTTP front took: it runs the
// call through the pipeline with st as the call's stream (the messages an
// upstream sends while working on it go there: sinkFrom), then answers it.
func (h httpSession) Call(m *jsonrpc.Request, st *httpfront.Stream) bool {
	s := h.s
	call, ok := callwire.Decode(m.Params)
	call.ID = m.ID
	if !ok {
		s.recordUndecodableCall(m)
		return false
	}
	s.g.fastPath.Add(1)
	s.g.inflight.Add(1) // until the response is written (shutdown waits)
	defer s.g.inflight.Done()
	s.answering.Add(1) // the session's end too, for a call it cut
	defer s.answering.Done()
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	if !s.fast.add(m.ID, cancel) {
		st.Refuse(http.StatusBadRequest, m.ID, &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: fmt.Sprintf("duplicate in-flight request ID %v", m.ID.Raw())})
		return true
	}
	// Out of the in-flight table before the answer is written, not
	// when the handler returns: an agent that has read the answer may
	// send its next request with this id at once, on another
	// connection (TestReusedIDIsNotInFlight).
	done := sync.OnceFunc(func() { s.fast.remove(m.ID) })
	defer done()
	defer st.Close()
	var appendResult func(undelivered string)
	res, err := s.relay(context.WithValue(ctx, sinkKey{}, st), call, &appendResult)
	done()
	if appendResult != nil {
		// After the response is written, and without holding up the
		// handler's return: the connection reads the agent's next
		// request only then, and in group durability the append
		// waits for the disk. The record says if the answer could
		// not be delivered (the agent did not read it).
		defer func() { why := st.Undelivered(); go appendResult(why) }()
	}
	if ctx.Err() != nil && sessionEndOf(ctx) == nil {
		// Cancelled by the agent: no JSON-RPC response, and the HTTP
		// response ends empty. A call its session's end cut is
		// answered below: err says why.
		st.Cancelled()
		return true
	}
	_ = st.Respond(encodeResponse(m.ID, res, err))
	return true
}
