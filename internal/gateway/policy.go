package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/machines"
	"github.com/confidential-mcp/cmcp/internal/policy"
	"github.com/confidential-mcp/cmcp/internal/upstream"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// policyDecider decides calls and filters tools/list with the Cedar engine
// (Options.Policy).
type policyDecider struct {
	g   *Gateway
	eng *policy.Engine
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
func (p *policyDecider) Decide(ctx context.Context, r DecisionRequest) (Decision, error) {
	o := p.eng.DecideCall(policy.Call{
		Agent: r.Principal, Groups: r.Session.Groups, Session: r.Session.ID, Tool: r.Tool, ToolName: r.UpstreamTool, Upstream: r.Upstream,
		EvidenceClass: r.EvidenceClass, Machine: r.Machine, Annotations: hints(r.Annotations), Arguments: r.Args,
	})
	d := Decision{Effect: o.Effect(), PolicyIDs: o.PolicyIDs, Mode: string(o.Mode), Bundle: o.Bundle, Reason: o.Reason, Input: o.Input()}
	if !o.Allow && o.Mode == policy.Advisory {
		// Advisory: the operator sees what enforcing would have refused;
		// the agent does not. Silent records it and says nothing.
		p.g.logger.Warn("policy would deny this call (advisory mode: forwarded)", "agent", r.Principal, "session", r.Session.ID,
			"tool", r.Tool, "policies", strings.Join(o.PolicyIDs, ","), "reason", o.Reason)
	}
	return d, nil
}

// FilterTools implements ListFilter: an agent sees a tool only if
// list_tools permits it.
func (p *policyDecider) FilterTools(ctx context.Context, principal string, s SessionInfo, tools []*mcp.Tool) []*mcp.Tool {
	cat := p.g.Catalog()
	out := tools[:0:0]
	for _, t := range tools {
		if st, _ := p.g.listMachinesOf(t.Name); st != nil {
			c := policy.Call{Groups: s.Groups, Tool: t.Name, ToolName: machines.Tool, Upstream: st.name, EvidenceClass: upstream.ClassTunnel, Annotations: hints(t.Annotations)}
			if p.eng.Visible(principal, s.ID, c) {
				out = append(out, t)
			}
			continue
		}
		e, ok := cat.Lookup(t.Name)
		if !ok {
			continue // not a catalog tool: never shown unchecked
		}
		class := ""
		if st := p.g.ups[e.Upstream]; st != nil {
			class = st.expectedClass()
		}
		c := policy.Call{Groups: s.Groups, Tool: t.Name, ToolName: e.Name, Upstream: e.Upstream, EvidenceClass: class, Annotations: hints(t.Annotations)}
		if p.eng.Visible(principal, s.ID, c) {
			out = append(out, t)
		}
	}
	return out
}

// deniedFault is the JSON-RPC error of a call refused by the policy: its
// message and its data name the determining policies.
func deniedFault(tool, principal string, d Decision) *jsonrpc.Error {
	return deniedFaultFor(fmt.Sprintf("tool %q", tool), principal, d)
}

// deniedFaultFor is deniedFault for any request: what names it.
func deniedFaultFor(what, principal string, d Decision) *jsonrpc.Error {
	msg := fmt.Sprintf("denied by policy: %s for %q", what, principal)
	if d.Reason != "" {
		msg += ": " + d.Reason
	}
	f := fault(CodeDenied, "%s", msg)
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

// PolicyEngine is the policy engine in force, or nil.
func (g *Gateway) PolicyEngine() *policy.Engine { return g.opts.Policy }

// recordPolicyLoaded writes the policy record of the bundle in force at start.
func (g *Gateway) recordPolicyLoaded(ctx context.Context) {
	eng := g.opts.Policy
	if eng == nil {
		return
	}
	b := eng.Bundle()
	g.record(ctx, &auditlog.Policy{Event: "loaded", Bundle: b.Digest(), Mode: string(eng.Mode()), Path: b.Dir(), Policies: int64(len(b.PolicyIDs()))})
}

// ReloadPolicy replaces the policy bundle (SIGHUP): only if the bundle in
// dir loads, validates and, when expect is set, matches it. The switch is
// recorded with both digests; a refused reload is recorded with the reason
// and the old bundle stays in force.
func (g *Gateway) ReloadPolicy(ctx context.Context, dir string, expect digest.Digest, mode policy.Mode, groups map[string][]string) error {
	eng := g.opts.Policy
	if eng == nil {
		return fmt.Errorf("no policy is configured: a policy section can only be added with a restart (the genesis record names the policy)")
	}
	sw, err := eng.Reload(ctx, dir, expect, mode, groups)
	if err != nil {
		g.record(ctx, &auditlog.Policy{Event: "rejected", Previous: sw.Old, Mode: string(sw.Mode), Path: dir, Reason: err.Error()})
		g.logger.Error("policy reload refused; the old bundle stays in force", "bundle", sw.Old.String(), "err", err)
		return err
	}
	if rerr := g.record(ctx, &auditlog.Policy{Event: "reloaded", Bundle: sw.New, Previous: sw.Old, Mode: string(sw.Mode), Path: dir, Policies: int64(sw.Policies)}); rerr != nil {
		return fmt.Errorf("policy bundle %s is in force but its switch could not be recorded: %w", sw.New, rerr)
	}
	g.logger.Info("policy reloaded", "from", sw.Old.String(), "to", sw.New.String(), "mode", string(sw.Mode), "policies", sw.Policies)
	// The new bundle may show each agent other lists (list_tools,
	// read_resource, get_prompt): tell every connected agent to list its
	// tools, resources and prompts again.
	g.mu.Lock()
	caps := g.caps
	g.mu.Unlock()
	sessions := g.sessionList()
	for _, s := range sessions {
		s.notifyToolsChanged()
		if caps != nil && caps.Resources != nil && caps.Resources.ListChanged {
			s.notifyListChanged("resources")
		}
		if caps != nil && caps.Prompts != nil && caps.Prompts.ListChanged {
			s.notifyListChanged("prompts")
		}
	}
	return nil
}

// RejectPolicyReload records and logs a refused policy reload.
func (g *Gateway) RejectPolicyReload(ctx context.Context, err error) error {
	eng := g.opts.Policy
	g.record(ctx, &auditlog.Policy{Event: "rejected", Previous: eng.Bundle().Digest(), Mode: string(eng.Mode()), Reason: err.Error()})
	g.logger.Error("policy reload refused; the old bundle stays in force", "bundle", eng.Bundle().Digest().String(), "err", err)
	return err
}
