// Package route routes an agent session's requests other than tools/call
// to the upstreams: resources (list, templates, read, subscribe), prompts
// (list, get) and completions go to the upstream that owns the name or URI.
// It reaches the session only through Session: the upstreams and their
// capabilities, one bounded request to an upstream (Forward), and the
// policy's decisions on what the agent may see and read (Visible, Gate).
// The tools' routing is the gateway's call pipeline.
package route

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/policy"
)

// Session is what the router needs of the agent session it routes for.
type Session interface {
	// Upstreams lists the configured upstreams in configuration order.
	Upstreams() []string
	// Has reports whether upstream up's capabilities include what has()
	// wants (false for an unknown upstream or one not yet initialized).
	Has(up string, has func(*mcp.ServerCapabilities) bool) bool
	// Known reports whether up is a configured upstream.
	Known(up string) bool
	// Namespaced reports whether up's names carry its prefix.
	Namespaced(up string) bool
	// Forward runs f against the session's connection to upstream up, with
	// the request's progress token tok mapped to upTok, bounded by the call
	// timeout and cut by the session's end, and returns the upstream's
	// errors as the upstream sent them (others as gateway faults).
	Forward(ctx context.Context, up string, tok any, f func(ctx context.Context, c Conn, upTok any) error) error
	// Visible reports which of upstream up's list entries (URIs, URI
	// templates or prompt names, by action) the agent may see; nil means
	// all of them.
	Visible(action policy.Action, up string, keys []string) []bool
	// Gate decides and records the access a for each upstream of ups, in
	// order, and returns those it may be sent to (see the gateway's
	// gateAccess).
	Gate(ctx context.Context, a Access, ups []string) ([]string, error)
}

// Conn is one connection to an upstream, as Forward hands it out.
type Conn interface {
	// Client is the MCP client session to the upstream.
	Client() *mcp.ClientSession
	// Shared reports whether other agent sessions use the connection too.
	Shared() bool
	// Subscribe notes this session's subscription to uri on a shared
	// connection and reports whether it is the first one.
	Subscribe(uri string) (first bool)
	// Unsubscribe removes it and reports whether it was the last one.
	Unsubscribe(uri string) (last bool)
}

// Access is one request that reads an upstream's resources or prompts:
// resources/read, resources/subscribe and completion/complete on a
// ref/resource (policy action read_resource), prompts/get and
// completion/complete on a ref/prompt (get_prompt). resources/unsubscribe
// is not one: it only stops data.
type Access struct {
	Method  string
	Action  policy.Action
	URI     string          // read_resource
	Prompt  string          // get_prompt: the name at the upstream
	Exposed string          // get_prompt: the name the agent used
	Args    json.RawMessage // committed in the record: prompt arguments, a completion's argument and context
}

func resourceAccess(method, uri string) Access {
	return Access{Method: method, Action: policy.ActionReadResource, URI: uri}
}

func promptAccess(method, exposed, prompt string) Access {
	return Access{Method: method, Action: policy.ActionGetPrompt, Exposed: exposed, Prompt: prompt}
}

// What names the access in messages (never the URI: the record's reason
// holds the message, and the URI is a payload).
func (a Access) What(upstream string) string {
	if a.Action == policy.ActionGetPrompt {
		return fmt.Sprintf("prompt %q (%s)", a.Exposed, a.Method)
	}
	return fmt.Sprintf("reading a resource of upstream %q (%s)", upstream, a.Method)
}

// promptArgs is what an access record commits to for prompts/get: the
// arguments as the gateway re-encodes them (members sorted), or nothing.
func promptArgs(args map[string]string) json.RawMessage {
	if len(args) == 0 {
		return nil
	}
	b, _ := json.Marshal(args)
	return b
}

// completionArgs is what an access record commits to for
// completion/complete: its argument and its context.
func completionArgs(p *mcp.CompleteParams) json.RawMessage {
	b, _ := json.Marshal(struct {
		Argument mcp.CompleteParamsArgument `json:"argument"`
		Context  *mcp.CompleteContext       `json:"context,omitempty"`
	}{p.Argument, p.Context})
	return b
}

// visible filters one upstream's list entries (resources/list,
// resources/templates/list, prompts/list) by the read_resource or
// get_prompt decision, as tools/list is by list_tools. key gives an
// entry's URI (or URI template) or prompt name.
func visible[T any](s Session, action policy.Action, upstream string, items []T, key func(T) string) []T {
	if len(items) == 0 {
		return items
	}
	keys := make([]string, len(items))
	for i, it := range items {
		keys[i] = key(it)
	}
	keep := s.Visible(action, upstream, keys)
	if keep == nil {
		return items
	}
	out := items[:0:0]
	for i, it := range items {
		if keep[i] {
			out = append(out, it)
		}
	}
	return out
}

func resourceURI(r *mcp.Resource) string         { return r.URI }
func templateURI(t *mcp.ResourceTemplate) string { return t.URITemplate }
func promptName(p *mcp.Prompt) string            { return p.Name }

// forward runs f through s.Forward and returns its result.
func forward[R any](s Session, ctx context.Context, up string, tok any, f func(ctx context.Context, c Conn, upTok any) (R, error)) (R, error) {
	var r R
	err := s.Forward(ctx, up, tok, func(ctx context.Context, c Conn, upTok any) error {
		var err error
		r, err = f(ctx, c, upTok)
		return err
	})
	if err != nil {
		var zero R
		return zero, err
	}
	return r, nil
}
