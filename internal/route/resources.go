package route

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/yosida95/uritemplate/v3"

	"github.com/confidential-mcp/cmcp/internal/catalog"
	"github.com/confidential-mcp/cmcp/internal/faults"
	"github.com/confidential-mcp/cmcp/internal/policy"
)

// Router routes one agent session's resource, prompt and completion
// requests. It remembers which upstream serves which resource URI.
type Router struct {
	s Session

	mu sync.Mutex
	// resOwner maps a resource URI to the upstream that serves it: the
	// first upstream that listed it (resources/list), answered a read
	// of it or took a subscription to it. tmpls are the resource templates
	// each upstream listed (resources/templates/list). See resourceRoute.
	resOwner map[string]string
	tmpls    map[string][]ownedTemplate
}

// New returns the router of session s.
func New(s Session) *Router {
	return &Router{s: s, resOwner: map[string]string{}, tmpls: map[string][]ownedTemplate{}}
}

// upstreamsWith lists the upstreams whose capabilities include what has().
func (rt *Router) upstreamsWith(has func(*mcp.ServerCapabilities) bool) []string {
	var out []string
	for _, name := range rt.s.Upstreams() {
		if rt.s.Has(name, has) {
			out = append(out, name)
		}
	}
	return out
}

func hasResources(c *mcp.ServerCapabilities) bool   { return c.Resources != nil }
func hasPrompts(c *mcp.ServerCapabilities) bool     { return c.Prompts != nil }
func hasSubscribe(c *mcp.ServerCapabilities) bool   { return c.Resources != nil && c.Resources.Subscribe }
func hasCompletions(c *mcp.ServerCapabilities) bool { return c.Completions != nil }

// single reports the only upstream when there is exactly one, so that list
// requests (and their cursors) pass through unchanged.
func (rt *Router) single(names []string) (string, bool) {
	if len(names) == 1 && len(rt.s.Upstreams()) == 1 {
		return names[0], true
	}
	return "", false
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

func (rt *Router) ListResources(ctx context.Context, req *mcp.ListResourcesRequest) (*mcp.ListResourcesResult, error) {
	ups := rt.upstreamsWith(hasResources)
	if name, ok := rt.single(ups); ok {
		return forward(rt.s, ctx, name, nil, func(ctx context.Context, c Conn, _ any) (*mcp.ListResourcesResult, error) {
			r, err := c.Client().ListResources(ctx, req.Params)
			if err == nil {
				rt.noteOwners(name, r.Resources)
				r.Resources = visible(rt.s, policy.ActionReadResource, name, r.Resources, resourceURI)
			}
			return r, err
		})
	}
	out := &mcp.ListResourcesResult{Resources: []*mcp.Resource{}}
	for _, name := range ups {
		rs, err := forward(rt.s, ctx, name, nil, func(ctx context.Context, c Conn, _ any) ([]*mcp.Resource, error) {
			var all []*mcp.Resource
			for r, err := range c.Client().Resources(ctx, nil) {
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
		rt.noteOwners(name, rs)
		out.Resources = append(out.Resources, visible(rt.s, policy.ActionReadResource, name, rs, resourceURI)...)
	}
	return out, nil
}

func (rt *Router) noteOwners(name string, rs []*mcp.Resource) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for _, r := range rs {
		if _, taken := rt.resOwner[r.URI]; !taken {
			rt.resOwner[r.URI] = name
		}
	}
}

func (rt *Router) ListTemplates(ctx context.Context, req *mcp.ListResourceTemplatesRequest) (*mcp.ListResourceTemplatesResult, error) {
	ups := rt.upstreamsWith(hasResources)
	if name, ok := rt.single(ups); ok {
		return forward(rt.s, ctx, name, nil, func(ctx context.Context, c Conn, _ any) (*mcp.ListResourceTemplatesResult, error) {
			r, err := c.Client().ListResourceTemplates(ctx, req.Params)
			if err == nil {
				rt.noteTemplates(name, r.ResourceTemplates)
				r.ResourceTemplates = visible(rt.s, policy.ActionReadResource, name, r.ResourceTemplates, templateURI)
			}
			return r, err
		})
	}
	out := &mcp.ListResourceTemplatesResult{ResourceTemplates: []*mcp.ResourceTemplate{}}
	for _, name := range ups {
		ts, err := forward(rt.s, ctx, name, nil, func(ctx context.Context, c Conn, _ any) ([]*mcp.ResourceTemplate, error) {
			var all []*mcp.ResourceTemplate
			for t, err := range c.Client().ResourceTemplates(ctx, nil) {
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
		rt.noteTemplates(name, ts)
		out.ResourceTemplates = append(out.ResourceTemplates, visible(rt.s, policy.ActionReadResource, name, ts, templateURI)...)
	}
	return out, nil
}

// ownedTemplate is a resource template an upstream listed.
type ownedTemplate struct {
	raw string
	re  *regexp.Regexp // nil if it does not parse: then it matches only itself
}

// noteTemplates remembers the resource templates upstream name listed.
func (rt *Router) noteTemplates(name string, ts []*mcp.ResourceTemplate) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for _, t := range ts {
		if slices.ContainsFunc(rt.tmpls[name], func(o ownedTemplate) bool { return o.raw == t.URITemplate }) {
			continue
		}
		o := ownedTemplate{raw: t.URITemplate}
		// RFC 6570 matching as go-sdk's servers do it (the same library).
		if ut, err := uritemplate.New(t.URITemplate); err == nil {
			o.re = ut.Regexp()
		}
		rt.tmpls[name] = append(rt.tmpls[name], o)
	}
}

// maxLearnedOwners bounds what reads and subscriptions add to a session's
// owners (resources/list adds what the upstreams list, counted too): past
// it, reads still work, asking as if the owner were unknown.
const maxLearnedOwners = 10000

// noteOwner remembers that upstream name answered a read of uri or took a
// subscription to it.
func (rt *Router) noteOwner(uri, name string) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if _, ok := rt.resOwner[uri]; !ok && len(rt.resOwner) < maxLearnedOwners {
		rt.resOwner[uri] = name
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
func (rt *Router) resourceRoute(uri string) (names []string, known bool) {
	ups := rt.upstreamsWith(hasResources)
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if owner, ok := rt.resOwner[uri]; ok && slices.Contains(ups, owner) {
		return []string{owner}, true
	}
	for _, name := range ups {
		if slices.ContainsFunc(rt.tmpls[name], func(t ownedTemplate) bool {
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
func (rt *Router) resourceOwner(method, uri string, has func(*mcp.ServerCapabilities) bool) (string, error) {
	names, known := rt.resourceRoute(uri)
	switch {
	case len(names) == 0:
		return "", faults.New(faults.ResourceNotFound, "resource %q not found: no upstream serves resources", uri)
	case len(names) > 1 && known:
		return "", faults.New(jsonrpc.CodeInvalidParams, "%s: the resource templates of upstreams %s all match %q; read the resource first (resources/read), so the gateway learns which upstream serves it", method, strings.Join(names, ", "), uri)
	case len(names) > 1:
		return "", faults.New(jsonrpc.CodeInvalidParams, "%s: no upstream is known to serve %q; list the resources (resources/list) or resource templates (resources/templates/list), or read the resource (resources/read), first, so the gateway learns which upstream serves it", method, uri)
	}
	if !rt.s.Has(names[0], has) {
		return "", faults.New(jsonrpc.CodeInvalidParams, "%s: upstream %q, which serves %q, does not support it", method, names[0], uri)
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
func (rt *Router) ReadResource(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	uri := req.Params.URI
	read := func(name string) (*mcp.ReadResourceResult, error) {
		return forward(rt.s, ctx, name, req.Params.GetProgressToken(), func(ctx context.Context, c Conn, tok any) (*mcp.ReadResourceResult, error) {
			p := *req.Params
			p.Meta = withMeta(p.Meta, tok)
			return c.Client().ReadResource(ctx, &p)
		})
	}
	names, known := rt.resourceRoute(uri)
	if len(names) == 0 {
		return nil, faults.New(faults.ResourceNotFound, "resource %q not found: no upstream serves resources", uri)
	}
	// Every upstream that may be asked is decided (and recorded) first:
	// those the policy refuses are not asked.
	names, err := rt.s.Gate(ctx, resourceAccess("resources/read", uri), names)
	if err != nil {
		return nil, err
	}
	switch len(names) {
	case 1:
		r, err := read(names[0])
		if err == nil && !known {
			rt.noteOwner(uri, names[0])
		}
		return r, err
	}
	var failed error
	var answers []string
	for _, name := range names {
		r, err := read(name)
		if err == nil {
			rt.noteOwner(uri, name)
			return r, nil
		}
		var we *jsonrpc.Error
		if !errors.As(err, &we) {
			return nil, err
		}
		switch we.Code {
		case faults.ResourceNotFound, jsonrpc.CodeInvalidParams:
			answers = append(answers, fmt.Sprintf("%s: %d %s", name, we.Code, we.Message))
		case faults.UpstreamUnavailable, faults.UpstreamFailed:
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
	return nil, faults.New(faults.ResourceNotFound, "resource %q not found in any upstream (%s)", uri, strings.Join(answers, "; "))
}

func (rt *Router) Subscribe(ctx context.Context, req *mcp.SubscribeRequest) error {
	up, err := rt.resourceOwner("resources/subscribe", req.Params.URI, hasSubscribe)
	if err != nil {
		return err
	}
	if _, err := rt.s.Gate(ctx, resourceAccess("resources/subscribe", req.Params.URI), []string{up}); err != nil {
		return err
	}
	_, err = forward(rt.s, ctx, up, nil, func(ctx context.Context, c Conn, _ any) (struct{}, error) {
		if c.Shared() && !c.Subscribe(req.Params.URI) {
			return struct{}{}, nil // a shared upstream already subscribed for another session
		}
		err := c.Client().Subscribe(ctx, req.Params)
		if err != nil && c.Shared() {
			c.Unsubscribe(req.Params.URI)
		}
		return struct{}{}, err
	})
	if err == nil {
		rt.noteOwner(req.Params.URI, up) // unsubscribe goes there too
	}
	return err
}

func (rt *Router) Unsubscribe(ctx context.Context, req *mcp.UnsubscribeRequest) error {
	up, err := rt.resourceOwner("resources/unsubscribe", req.Params.URI, hasSubscribe)
	if err != nil {
		return err
	}
	_, err = forward(rt.s, ctx, up, nil, func(ctx context.Context, c Conn, _ any) (struct{}, error) {
		if c.Shared() && !c.Unsubscribe(req.Params.URI) {
			return struct{}{}, nil // other sessions are still subscribed
		}
		return struct{}{}, c.Client().Unsubscribe(ctx, req.Params)
	})
	return err
}

func (rt *Router) ListPrompts(ctx context.Context, req *mcp.ListPromptsRequest) (*mcp.ListPromptsResult, error) {
	ups := rt.upstreamsWith(hasPrompts)
	if name, ok := rt.single(ups); ok && !rt.s.Namespaced(name) {
		return forward(rt.s, ctx, name, nil, func(ctx context.Context, c Conn, _ any) (*mcp.ListPromptsResult, error) {
			r, err := c.Client().ListPrompts(ctx, req.Params)
			if err == nil {
				r.Prompts = visible(rt.s, policy.ActionGetPrompt, name, r.Prompts, promptName)
			}
			return r, err
		})
	}
	out := &mcp.ListPromptsResult{Prompts: []*mcp.Prompt{}}
	for _, name := range ups {
		ps, err := forward(rt.s, ctx, name, nil, func(ctx context.Context, c Conn, _ any) ([]*mcp.Prompt, error) {
			var all []*mcp.Prompt
			for p, err := range c.Client().Prompts(ctx, nil) {
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
		for _, p := range visible(rt.s, policy.ActionGetPrompt, name, ps, promptName) {
			cp := *p
			if rt.s.Namespaced(name) {
				cp.Name = name + catalog.Separator + p.Name
			}
			out.Prompts = append(out.Prompts, &cp)
		}
	}
	return out, nil
}

// promptUpstream splits an exposed prompt name.
func (rt *Router) promptUpstream(name string) (up, prompt string, err error) {
	if ups := rt.s.Upstreams(); len(ups) == 1 && !rt.s.Namespaced(ups[0]) {
		return ups[0], name, nil
	}
	up, prompt, ok := catalog.SplitExposed(name)
	if !ok || !rt.s.Known(up) {
		return "", "", &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("cmcp: unknown prompt %q; call prompts/list to see the prompts this gateway exposes", name)}
	}
	return up, prompt, nil
}

func (rt *Router) GetPrompt(ctx context.Context, req *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
	up, prompt, err := rt.promptUpstream(req.Params.Name)
	if err != nil {
		return nil, err
	}
	a := promptAccess("prompts/get", req.Params.Name, prompt)
	a.Args = promptArgs(req.Params.Arguments)
	if _, err := rt.s.Gate(ctx, a, []string{up}); err != nil {
		return nil, err
	}
	return forward(rt.s, ctx, up, req.Params.GetProgressToken(), func(ctx context.Context, c Conn, tok any) (*mcp.GetPromptResult, error) {
		p := *req.Params
		p.Name = prompt
		p.Meta = withMeta(p.Meta, tok)
		return c.Client().GetPrompt(ctx, &p)
	})
}

func (rt *Router) Complete(ctx context.Context, req *mcp.CompleteRequest) (*mcp.CompleteResult, error) {
	p := *req.Params
	var up string
	var a Access
	if p.Ref != nil && p.Ref.Type == "ref/prompt" {
		u, prompt, err := rt.promptUpstream(p.Ref.Name)
		if err != nil {
			return nil, err
		}
		if !rt.s.Has(u, hasCompletions) {
			return nil, faults.New(jsonrpc.CodeInvalidParams, "completion/complete: upstream %q, whose prompt %q it is, does not support it", u, p.Ref.Name)
		}
		a = promptAccess("completion/complete", p.Ref.Name, prompt)
		ref := *p.Ref
		ref.Name = prompt
		p.Ref, up = &ref, u
	} else if p.Ref != nil {
		u, err := rt.resourceOwner("completion/complete", p.Ref.URI, hasCompletions)
		if err != nil {
			return nil, err
		}
		up = u
		a = resourceAccess("completion/complete", p.Ref.URI)
	} else {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "cmcp: completion/complete needs a ref"}
	}
	a.Args = completionArgs(&p)
	if _, err := rt.s.Gate(ctx, a, []string{up}); err != nil {
		return nil, err
	}
	return forward(rt.s, ctx, up, nil, func(ctx context.Context, c Conn, _ any) (*mcp.CompleteResult, error) {
		return c.Client().Complete(ctx, &p)
	})
}
