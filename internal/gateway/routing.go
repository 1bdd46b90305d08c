package gateway

// Routing of everything but tools/call: resources (list, templates, read,
// subscribe), prompts (list, get) and completions go to the upstream that
// owns the name or URI, through the session's connection to it
// (forward), bounded by the call timeout and cut by the session's end.
// The tools' routing is the call pipeline's (pipeline.go); whether an
// agent may see or use a resource or prompt is access.go's.

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/yosida95/uritemplate/v3"

	"github.com/confidential-mcp/cmcp/internal/catalog"
	"github.com/confidential-mcp/cmcp/internal/policy"
	"github.com/confidential-mcp/cmcp/internal/upstream"
)

// upstreamsWith lists the upstreams whose capabilities include what has().
func (s *session) upstreamsWith(has func(*mcp.ServerCapabilities) bool) []string {
	var out []string
	for _, name := range s.g.order {
		if s.upstreamHas(name, has) {
			out = append(out, name)
		}
	}
	return out
}

// upstreamHas reports whether upstream name's capabilities include what
// has().
func (s *session) upstreamHas(name string, has func(*mcp.ServerCapabilities) bool) bool {
	st := s.g.ups[name]
	if st == nil {
		return false
	}
	st.mu.Lock()
	init := st.init
	st.mu.Unlock()
	return init != nil && init.Capabilities != nil && has(init.Capabilities)
}

func hasResources(c *mcp.ServerCapabilities) bool   { return c.Resources != nil }
func hasPrompts(c *mcp.ServerCapabilities) bool     { return c.Prompts != nil }
func hasSubscribe(c *mcp.ServerCapabilities) bool   { return c.Resources != nil && c.Resources.Subscribe }
func hasCompletions(c *mcp.ServerCapabilities) bool { return c.Completions != nil }

// single reports the only upstream when there is exactly one, so that list
// requests (and their cursors) pass through unchanged.
func (s *session) single(names []string) (string, bool) {
	if len(names) == 1 && len(s.g.order) == 1 {
		return names[0], true
	}
	return "", false
}

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

func withMeta(m mcp.Meta, tok any) mcp.Meta {
	if m == nil && tok == nil {
		return nil
	}
	out := mcp.Meta{}
	for k, v := range m {
		out[k] = v
	}
	if tok != nil {
		out["progressToken"] = tok
	}
	return out
}

func (s *session) listResources(ctx context.Context, req *mcp.ListResourcesRequest) (*mcp.ListResourcesResult, error) {
	ups := s.upstreamsWith(hasResources)
	if name, ok := s.single(ups); ok {
		return forward(s, ctx, name, nil, func(ctx context.Context, lv *live, _ any) (*mcp.ListResourcesResult, error) {
			r, err := lv.conn.Session.ListResources(ctx, req.Params)
			if err == nil {
				s.noteOwners(name, r.Resources)
				r.Resources = accessVisible(s, policy.ActionReadResource, name, r.Resources, resourceURI)
			}
			return r, err
		})
	}
	out := &mcp.ListResourcesResult{Resources: []*mcp.Resource{}}
	for _, name := range ups {
		rs, err := forward(s, ctx, name, nil, func(ctx context.Context, lv *live, _ any) ([]*mcp.Resource, error) {
			var all []*mcp.Resource
			for r, err := range lv.conn.Session.Resources(ctx, nil) {
				if err != nil {
					return nil, err
				}
				all = append(all, r)
			}
			return all, nil
		})
		if err != nil {
			return nil, err
		}
		s.noteOwners(name, rs)
		out.Resources = append(out.Resources, accessVisible(s, policy.ActionReadResource, name, rs, resourceURI)...)
	}
	return out, nil
}

func (s *session) noteOwners(name string, rs []*mcp.Resource) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range rs {
		if _, taken := s.resOwner[r.URI]; !taken {
			s.resOwner[r.URI] = name
		}
	}
}

func (s *session) listTemplates(ctx context.Context, req *mcp.ListResourceTemplatesRequest) (*mcp.ListResourceTemplatesResult, error) {
	ups := s.upstreamsWith(hasResources)
	if name, ok := s.single(ups); ok {
		return forward(s, ctx, name, nil, func(ctx context.Context, lv *live, _ any) (*mcp.ListResourceTemplatesResult, error) {
			r, err := lv.conn.Session.ListResourceTemplates(ctx, req.Params)
			if err == nil {
				s.noteTemplates(name, r.ResourceTemplates)
				r.ResourceTemplates = accessVisible(s, policy.ActionReadResource, name, r.ResourceTemplates, templateURI)
			}
			return r, err
		})
	}
	out := &mcp.ListResourceTemplatesResult{ResourceTemplates: []*mcp.ResourceTemplate{}}
	for _, name := range ups {
		ts, err := forward(s, ctx, name, nil, func(ctx context.Context, lv *live, _ any) ([]*mcp.ResourceTemplate, error) {
			var all []*mcp.ResourceTemplate
			for t, err := range lv.conn.Session.ResourceTemplates(ctx, nil) {
				if err != nil {
					return nil, err
				}
				all = append(all, t)
			}
			return all, nil
		})
		if err != nil {
			return nil, err
		}
		s.noteTemplates(name, ts)
		out.ResourceTemplates = append(out.ResourceTemplates, accessVisible(s, policy.ActionReadResource, name, ts, templateURI)...)
	}
	return out, nil
}

// ownedTemplate is a resource template an upstream listed.
type ownedTemplate struct {
	raw string
	re  *regexp.Regexp // nil if it does not parse: then it matches only itself
}

// noteTemplates remembers the resource templates upstream name listed.
func (s *session) noteTemplates(name string, ts []*mcp.ResourceTemplate) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range ts {
		if slices.ContainsFunc(s.tmpls[name], func(o ownedTemplate) bool { return o.raw == t.URITemplate }) {
			continue
		}
		o := ownedTemplate{raw: t.URITemplate}
		// RFC 6570 matching as go-sdk's servers do it (the same library).
		if ut, err := uritemplate.New(t.URITemplate); err == nil {
			o.re = ut.Regexp()
		}
		s.tmpls[name] = append(s.tmpls[name], o)
	}
}

// maxLearnedOwners bounds what reads and subscriptions add to a session's
// owners (resources/list adds what the upstreams list, counted too): past
// it, reads still work, asking as if the owner were unknown.
const maxLearnedOwners = 10000

// noteOwner remembers that upstream name answered a read of uri or took a
// subscription to it.
func (s *session) noteOwner(uri, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.resOwner[uri]; !ok && len(s.resOwner) < maxLearnedOwners {
		s.resOwner[uri] = name
	}
}

// resourceRoute returns the upstreams that may serve uri (a resource URI,
// or a URI template for completion/complete), in the order to ask them,
// and whether the session knows them to serve it:
//
//   - the upstream that owns uri (see resOwner), alone;
//   - else the upstreams that listed uri as a template, or a template
//     that matches it, in configuration order;
//   - else (known false) every upstream with resources.
//
// A template that matches makes its upstream the one asked even when
// another upstream might also have the URI: the session was told whose it
// is, and an unlisted resource of another upstream is reached by listing
// resources first.
func (s *session) resourceRoute(uri string) (names []string, known bool) {
	ups := s.upstreamsWith(hasResources)
	s.mu.Lock()
	defer s.mu.Unlock()
	if owner, ok := s.resOwner[uri]; ok && slices.Contains(ups, owner) {
		return []string{owner}, true
	}
	for _, name := range ups {
		if slices.ContainsFunc(s.tmpls[name], func(t ownedTemplate) bool {
			return t.raw == uri || t.re != nil && t.re.MatchString(uri)
		}) {
			names = append(names, name)
		}
	}
	if len(names) > 0 {
		return names, true
	}
	return ups, false
}

// resourceOwner picks the one upstream a request about uri (method:
// completion/complete, resources/subscribe or unsubscribe) goes to: the one
// resourceRoute knows to serve it, or the only upstream with resources. It
// never guesses among several (a subscription or a completion sent to the
// wrong upstream tells it another's URI and answers wrongly); the agent is
// told how the gateway can learn. The upstream must offer the method (has).
func (s *session) resourceOwner(method, uri string, has func(*mcp.ServerCapabilities) bool) (string, error) {
	names, known := s.resourceRoute(uri)
	switch {
	case len(names) == 0:
		return "", fault(CodeResourceNotFound, "resource %q not found: no upstream serves resources", uri)
	case len(names) > 1 && known:
		return "", fault(jsonrpc.CodeInvalidParams, "%s: the resource templates of upstreams %s all match %q; read the resource first (resources/read), so the gateway learns which upstream serves it", method, strings.Join(names, ", "), uri)
	case len(names) > 1:
		return "", fault(jsonrpc.CodeInvalidParams, "%s: no upstream is known to serve %q; list the resources (resources/list) or resource templates (resources/templates/list), or read the resource (resources/read), first, so the gateway learns which upstream serves it", method, uri)
	}
	if !s.upstreamHas(names[0], has) {
		return "", fault(jsonrpc.CodeInvalidParams, "%s: upstream %q, which serves %q, does not support it", method, names[0], uri)
	}
	return names[0], nil
}

// readResource asks the upstreams resourceRoute names for uri.
//
// One upstream asked (the owner, the only upstream whose template
// matches, the only upstream with resources): its answer, error or not,
// reaches the agent as it sent it.
//
// Several asked, in order, until one has the resource: an answer of
// -32002 (MCP's resource-not-found code before SEP-2164) or -32602 (the
// code since, and go-sdk's since v1.7; also "invalid params", which an
// upstream may well say of a URI in another's scheme) means "not mine",
// and the next is asked. Any other error is that upstream's answer and
// ends the search: it is the agent's, as sent. An upstream that cannot be
// reached or fails (-32062, -32067) is skipped too, but if none has the
// resource that failure is the answer (the resource may be its). If every
// upstream said "not mine", the answer is the gateway's -32002 fault,
// which quotes each answer: an upstream's -32602 about bad params is not
// lost.
func (s *session) readResource(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	uri := req.Params.URI
	read := func(name string) (*mcp.ReadResourceResult, error) {
		return forward(s, ctx, name, req.Params.GetProgressToken(), func(ctx context.Context, lv *live, tok any) (*mcp.ReadResourceResult, error) {
			p := *req.Params
			p.Meta = withMeta(p.Meta, tok)
			return lv.conn.Session.ReadResource(ctx, &p)
		})
	}
	names, known := s.resourceRoute(uri)
	if len(names) == 0 {
		return nil, fault(CodeResourceNotFound, "resource %q not found: no upstream serves resources", uri)
	}
	// Every upstream that may be asked is decided (and recorded) first:
	// those the policy refuses are not asked.
	names, err := s.gateAccess(ctx, resourceAccess("resources/read", uri), names)
	if err != nil {
		return nil, err
	}
	switch len(names) {
	case 1:
		r, err := read(names[0])
		if err == nil && !known {
			s.noteOwner(uri, names[0])
		}
		return r, err
	}
	var failed error
	var answers []string
	for _, name := range names {
		r, err := read(name)
		if err == nil {
			s.noteOwner(uri, name)
			return r, nil
		}
		var we *jsonrpc.Error
		if !errors.As(err, &we) {
			return nil, err
		}
		switch we.Code {
		case CodeResourceNotFound, jsonrpc.CodeInvalidParams:
			answers = append(answers, fmt.Sprintf("%s: %d %s", name, we.Code, we.Message))
		case CodeUpstreamUnavailable, CodeUpstreamFailed:
			if failed == nil {
				failed = err
			}
		default:
			return nil, err
		}
	}
	if failed != nil {
		return nil, failed
	}
	return nil, fault(CodeResourceNotFound, "resource %q not found in any upstream (%s)", uri, strings.Join(answers, "; "))
}

func (s *session) subscribe(ctx context.Context, req *mcp.SubscribeRequest) error {
	up, err := s.resourceOwner("resources/subscribe", req.Params.URI, hasSubscribe)
	if err != nil {
		return err
	}
	if _, err := s.gateAccess(ctx, resourceAccess("resources/subscribe", req.Params.URI), []string{up}); err != nil {
		return err
	}
	_, err = forward(s, ctx, up, nil, func(ctx context.Context, lv *live, _ any) (struct{}, error) {
		if lv.owner.Load() == nil && !lv.subscribe(s, req.Params.URI) {
			return struct{}{}, nil // a shared upstream already subscribed for another session
		}
		err := lv.conn.Session.Subscribe(ctx, req.Params)
		if err != nil && lv.owner.Load() == nil {
			lv.unsubscribe(s, req.Params.URI)
		}
		return struct{}{}, err
	})
	if err == nil {
		s.noteOwner(req.Params.URI, up) // unsubscribe goes there too
	}
	return err
}

func (s *session) unsubscribe(ctx context.Context, req *mcp.UnsubscribeRequest) error {
	up, err := s.resourceOwner("resources/unsubscribe", req.Params.URI, hasSubscribe)
	if err != nil {
		return err
	}
	_, err = forward(s, ctx, up, nil, func(ctx context.Context, lv *live, _ any) (struct{}, error) {
		if lv.owner.Load() == nil && len(lv.unsubscribe(s, req.Params.URI)) == 0 {
			return struct{}{}, nil // other sessions are still subscribed
		}
		return struct{}{}, lv.conn.Session.Unsubscribe(ctx, req.Params)
	})
	return err
}

func (s *session) listPrompts(ctx context.Context, req *mcp.ListPromptsRequest) (*mcp.ListPromptsResult, error) {
	ups := s.upstreamsWith(hasPrompts)
	if name, ok := s.single(ups); ok && !s.g.ups[name].opts.Namespaced {
		return forward(s, ctx, name, nil, func(ctx context.Context, lv *live, _ any) (*mcp.ListPromptsResult, error) {
			r, err := lv.conn.Session.ListPrompts(ctx, req.Params)
			if err == nil {
				r.Prompts = accessVisible(s, policy.ActionGetPrompt, name, r.Prompts, promptName)
			}
			return r, err
		})
	}
	out := &mcp.ListPromptsResult{Prompts: []*mcp.Prompt{}}
	for _, name := range ups {
		ps, err := forward(s, ctx, name, nil, func(ctx context.Context, lv *live, _ any) ([]*mcp.Prompt, error) {
			var all []*mcp.Prompt
			for p, err := range lv.conn.Session.Prompts(ctx, nil) {
				if err != nil {
					return nil, err
				}
				all = append(all, p)
			}
			return all, nil
		})
		if err != nil {
			return nil, err
		}
		for _, p := range accessVisible(s, policy.ActionGetPrompt, name, ps, promptName) {
			cp := *p
			if s.g.ups[name].opts.Namespaced {
				cp.Name = name + catalog.Separator + p.Name
			}
			out.Prompts = append(out.Prompts, &cp)
		}
	}
	return out, nil
}

// promptUpstream splits an exposed prompt name.
func (s *session) promptUpstream(name string) (up, prompt string, err error) {
	if len(s.g.order) == 1 && !s.g.ups[s.g.order[0]].opts.Namespaced {
		return s.g.order[0], name, nil
	}
	up, prompt, ok := catalog.SplitExposed(name)
	if !ok || s.g.ups[up] == nil {
		return "", "", &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("cmcp: unknown prompt %q; call prompts/list to see the prompts this gateway exposes", name)}
	}
	return up, prompt, nil
}

func (s *session) getPrompt(ctx context.Context, req *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
	up, prompt, err := s.promptUpstream(req.Params.Name)
	if err != nil {
		return nil, err
	}
	a := promptAccess("prompts/get", req.Params.Name, prompt)
	a.args = promptArgs(req.Params.Arguments)
	if _, err := s.gateAccess(ctx, a, []string{up}); err != nil {
		return nil, err
	}
	return forward(s, ctx, up, req.Params.GetProgressToken(), func(ctx context.Context, lv *live, tok any) (*mcp.GetPromptResult, error) {
		p := *req.Params
		p.Name = prompt
		p.Meta = withMeta(p.Meta, tok)
		return lv.conn.Session.GetPrompt(ctx, &p)
	})
}

func (s *session) complete(ctx context.Context, req *mcp.CompleteRequest) (*mcp.CompleteResult, error) {
	p := *req.Params
	var up string
	var a access
	if p.Ref != nil && p.Ref.Type == "ref/prompt" {
		u, prompt, err := s.promptUpstream(p.Ref.Name)
		if err != nil {
			return nil, err
		}
		if !s.upstreamHas(u, hasCompletions) {
			return nil, fault(jsonrpc.CodeInvalidParams, "completion/complete: upstream %q, whose prompt %q it is, does not support it", u, p.Ref.Name)
		}
		a = promptAccess("completion/complete", p.Ref.Name, prompt)
		ref := *p.Ref
		ref.Name = prompt
		p.Ref, up = &ref, u
	} else if p.Ref != nil {
		u, err := s.resourceOwner("completion/complete", p.Ref.URI, hasCompletions)
		if err != nil {
			return nil, err
		}
		up = u
		a = resourceAccess("completion/complete", p.Ref.URI)
	} else {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "cmcp: completion/complete needs a ref"}
	}
	a.args = completionArgs(&p)
	if _, err := s.gateAccess(ctx, a, []string{up}); err != nil {
		return nil, err
	}
	return forward(s, ctx, up, nil, func(ctx context.Context, lv *live, _ any) (*mcp.CompleteResult, error) {
		return lv.conn.Session.Complete(ctx, &p)
	})
}
