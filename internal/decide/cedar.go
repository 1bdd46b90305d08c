package decide

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/faults"
	"github.com/confidential-mcp/cmcp/internal/policy"
)

// Cedar decides calls and filters tools/list with the Cedar engine (the
// gateway's Options.Policy): it is a Decider and a ListFilter.
type Cedar struct {
	Engine *policy.Engine
	Logger *slog.Logger
	// Tools returns, for one tools/list, what each exposed tool is to the
	// policy (read once per list: the catalog as it is then); ok is false
	// for a name that is not a catalog tool, which is never shown.
	Tools func() func(exposed string) (t Tool, ok bool)
}

// Tool is an exposed tool as the policy sees it.
type Tool struct {
	Upstream      string // the upstream's name
	Name          string // the upstream's own tool name
	EvidenceClass string // the upstream's evidence class
}

// hints converts MCP tool annotations to the policy's view (MCP defaults
// for what the tool does not declare). A tool whose definition is not known
// yet (its upstream could not be started so far) gets the defaults, which
// are the most cautious: not read-only, destructive, open world.
func hints(a *mcp.ToolAnnotations) policy.Annotations {
	h := policy.DefaultAnnotations
	if a == nil {
		return h
	}
	h.ReadOnly, h.Idempotent = a.ReadOnlyHint, a.IdempotentHint
	if a.DestructiveHint != nil {
		h.Destructive = *a.DestructiveHint
	}
	if a.OpenWorldHint != nil {
		h.OpenWorld = *a.OpenWorldHint
	}
	return h
}

// Decide implements Decider.
func (p *Cedar) Decide(ctx context.Context, r DecisionRequest) (Decision, error) {
	o := p.Engine.DecideCall(policy.Call{
		Agent: r.Principal, Groups: r.Session.Groups, Session: r.Session.ID, Tool: r.Tool, ToolName: r.UpstreamTool, Upstream: r.Upstream,
		EvidenceClass: r.EvidenceClass, Machine: r.Machine, Annotations: hints(r.Annotations), Arguments: r.Args,
	})
	d := Decision{Effect: o.Effect(), PolicyIDs: o.PolicyIDs, Mode: string(o.Mode), Bundle: o.Bundle, Reason: o.Reason, Input: o.Input()}
	if !o.Allow && o.Mode == policy.Advisory {
		// Advisory: the operator sees what enforcing would have refused;
		// the agent does not. Silent records it and says nothing.
		p.Logger.Warn("policy would deny this call (advisory mode: forwarded)", "agent", r.Principal, "session", r.Session.ID,
			"tool", r.Tool, "policies", strings.Join(o.PolicyIDs, ","), "reason", o.Reason)
	}
	return d, nil
}

// FilterTools implements ListFilter: an agent sees a tool only if
// list_tools permits it.
func (p *Cedar) FilterTools(ctx context.Context, principal string, s SessionInfo, tools []*mcp.Tool) []*mcp.Tool {
	lookup := p.Tools()
	out := tools[:0:0]
	for _, t := range tools {
		pt, ok := lookup(t.Name)
		if !ok {
			continue // not a catalog tool: never shown unchecked
		}
		c := policy.Call{Groups: s.Groups, Tool: t.Name, ToolName: pt.Name, Upstream: pt.Upstream, EvidenceClass: pt.EvidenceClass, Annotations: hints(t.Annotations)}
		if p.Engine.Visible(principal, s.ID, c) {
			out = append(out, t)
		}
	}
	return out
}

// DeniedFault is the JSON-RPC error of a call refused by the policy: its
// message and its data name the determining policies.
func DeniedFault(tool, principal string, d Decision) *jsonrpc.Error {
	return deniedFaultFor(fmt.Sprintf("tool %q", tool), principal, d)
}

// deniedFaultFor is DeniedFault for any request: what names it.
func deniedFaultFor(what, principal string, d Decision) *jsonrpc.Error {
	msg := fmt.Sprintf("denied by policy: %s for %q", what, principal)
	if d.Reason != "" {
		msg += ": " + d.Reason
	}
	f := faults.New(faults.Denied, "%s", msg)
	data := struct {
		PolicyIDs []string `json:"policy_ids"`
		Bundle    string   `json:"bundle,omitempty"`
	}{PolicyIDs: d.PolicyIDs, Bundle: ""}
	if data.PolicyIDs == nil {
		data.PolicyIDs = []string{}
	}
	if !d.Bundle.IsZero() {
		data.Bundle = d.Bundle.String()
	}
	f.Data, _ = json.Marshal(data)
	return f
}
