package gateway

// One bounded request to an upstream on a session's connection to it
// (forward): bounded by the call timeout, cut by the session's end, its
// failures turned into what the agent sees. Routing of everything but
// tools/call (resources, prompts, completions) is internal/route's,
// which reaches the session through routecore.go; the tools' routing is
// the call pipeline's (pipeline.go); whether an agent may see or use a
// resource or prompt is access.go's.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/confidential-mcp/cmcp/internal/upstream"
)

// forward runs f against upstream name's live connection with the request's
// progress token mapped, and returns upstream errors as the upstream sent
// them.
//
// f gets a context that ends with the request's, at the call timeout, or
// when the session ends: a hung upstream holds up neither the agent nor
// the session's end (and so the gateway's shutdown).
func forward[R any](s *session, ctx context.Context, name string, tok any, f func(ctx context.Context, lv *live, upTok any) (R, error)) (R, error) {
	var zero R
	ctx, cancel := s.bound(ctx, s.g.opts.CallTimeout)
	defer cancel()
	lv, err := s.upstreamFor(ctx, name)
	if err != nil {
		if se := sessionEndOf(ctx); se != nil {
			return zero, se.fault()
		}
		if cf := s.credentialFault(err); cf != nil {
			return zero, cf
		}
		return zero, fault(CodeUpstreamUnavailable, "%v", err)
	}
	upTok, release := lv.track(ctx, s, tok)
	defer release()
	r, err := f(ctx, lv, upTok)
	if err != nil {
		if se := sessionEndOf(ctx); se != nil {
			return zero, se.fault()
		}
		if errors.Is(context.Cause(ctx), errCallTimeout) {
			return zero, fault(CodeUpstreamTimeout, "upstream %q did not answer within %s (call_timeout); the request was cancelled upstream", name, s.g.opts.CallTimeout)
		}
		return zero, s.upstreamError(lv, err)
	}
	return r, nil
}

var errCallTimeout = errors.New("call timeout")

// bound returns ctx ended also after d (cause errCallTimeout) and when the
// session ends.
func (s *session) bound(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancelT := context.WithTimeoutCause(ctx, d, errCallTimeout)
	ctx, cancel := s.withSession(ctx)
	return ctx, func() {
		cancel()
		cancelT()
	}
}

// withSession returns ctx ended also when the session ends, with the
// session's cause (a *sessionEnd), for a request go-sdk answers: until
// cancel is called the session's end waits for it (see answering).
func (s *session) withSession(ctx context.Context) (context.Context, context.CancelFunc) {
	s.answering.Add(1)
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(s.ctx, func() {
		s.sdkCut.Store(true)
		cancel(context.Cause(s.ctx))
	})
	return ctx, func() {
		stop()
		cancel(nil)
		s.answering.Done()
	}
}

// upstreamError turns an error from an upstream call into what the agent
// sees: the upstream's own JSON-RPC error as sent, or a gateway fault that
// says why the upstream failed.
func (s *session) upstreamError(lv *live, err error) error {
	if we := upstreamAnswer(err); we != nil {
		return we
	}
	if f := lv.dead(); f != nil {
		s.drop(lv)
		return fault(CodeUpstreamFailed, "%v", f)
	}
	// An answer only this call gets wrong: the connection stays (a
	// shared child's other calls are not this one's to end).
	var bad *upstream.BadAnswerError
	if errors.As(err, &bad) {
		return fault(CodeUpstreamFailed, "%v", bad)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fault(CodeUpstreamFailed, "upstream %q: %v", lv.st.name, err)
	}
	// Anything else (a transport failure, an unknown HTTP session) means
	// this connection cannot be trusted to work again: the next use
	// connects anew.
	if prefix := fmt.Sprintf("upstream %q: ", lv.st.name); !strings.HasPrefix(err.Error(), prefix) {
		err = fmt.Errorf("%s%w", prefix, err)
	}
	lv.markBroken(err)
	s.drop(lv)
	return fault(CodeUpstreamFailed, "%v; the next call reconnects", err)
}

// upstreamAnswer returns the JSON-RPC error response the upstream answered
// with, if err is one, and nil for any other failure.
//
// go-sdk's client reports some failures of its own transport as a
// *jsonrpc.Error too: its ErrRejected (-32005 "rejected by transport";
// an HTTP request that failed, or got 429 or a 5xx) is one, and it marks
// the failure as the caller's to handle, not the connection's. It is not
// the upstream's answer, so it is not passed on as one. A non-2xx HTTP
// response whose body is a JSON-RPC error comes as that error wrapped
// before ErrRejected: errors.As finds the upstream's error first.
func upstreamAnswer(err error) *jsonrpc.Error {
	var we *jsonrpc.Error
	if !errors.As(err, &we) || we.Code == codeRejectedByTransport && we.Message == "rejected by transport" {
		return nil
	}
	return we
}

// codeRejectedByTransport is the code of go-sdk's ErrRejected
// (internal/jsonrpc2/wire.go).
const codeRejectedByTransport = -32005

// drop forgets a dead connection so the next use respawns it.
func (s *session) drop(lv *live) {
	if lv.owner.Load() == nil {
		return
	}
	s.mu.Lock()
	if s.lives[lv.st.name] == lv {
		delete(s.lives, lv.st.name)
	}
	s.mu.Unlock()
	go lv.close("connection failed")
}
