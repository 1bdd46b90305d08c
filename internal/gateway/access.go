package gateway

import (
	"context"
	"errors"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/confidential-mcp/cmcp/internal/policy"
	"github.com/confidential-mcp/cmcp/internal/route"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
)

// gateAccess decides the access a for each upstream of ups (those the
// request may be sent to, in order), records each decision in an access
// record made durable before anything is forwarded, and returns the
// upstreams the request may be sent to. When the policy refuses every one
// (a deny in enforcing mode) it returns the denial; a record that cannot
// be written refuses the request. No upstream (ups empty) is no decision.
func (s *session) gateAccess(ctx context.Context, a route.Access, ups []string) ([]string, error) {
	var out []string
	var denied error
	for _, name := range ups {
		err := s.decideAccess(ctx, a, name)
		var we *jsonrpc.Error
		switch {
		case err == nil:
			out = append(out, name)
		case errors.As(err, &we) && we.Code == CodeDenied:
			if denied == nil {
				denied = err
			}
		default:
			return nil, err
		}
	}
	if len(out) == 0 && denied != nil {
		return nil, denied
	}
	return out, nil
}

// decideAccess decides and records a's access to one upstream, as relay
// does a call: the kill switch refuses it (-32064) before the policy is
// asked, enforcing refuses a deny, advisory forwards it and warns the
// agent and the operator, silent forwards it and says nothing; without a
// policy every access is allowed and recorded with mode none.
func (s *session) decideAccess(ctx context.Context, a route.Access, name string) error {
	g := s.g
	st := g.ups[name]
	if st == nil {
		return fault(CodeUpstreamUnavailable, "no upstream %q", name)
	}
	rec := &auditlog.Access{Session: s.id, Agent: s.principal, Method: a.Method, Action: string(a.Action), Upstream: name,
		EvidenceClass: st.expectedClass(), Prompt: a.Prompt, Decision: auditlog.DecisionAllow, PolicyMode: ModeNone}
	if a.Action == policy.ActionReadResource {
		// The URI is a payload (it may name a file): committed, never in clear.
		rec.URI = g.log.Commit([]byte(a.URI))
	}
	if len(a.Args) > 0 {
		rec.Args = g.log.Commit(a.Args)
	}
	refuse := func(err *jsonrpc.Error) error {
		rec.Outcome, rec.Reason = auditlog.OutcomeRefused, err.Message
		if aerr := g.record(ctx, rec); aerr != nil {
			return fault(CodeAuditUnavailable, "the audit log cannot record requests (%v): every request is refused until an operator fixes it", aerr)
		}
		return err
	}
	if g.closing.Load() {
		return refuse(fault(CodeShuttingDown, "the gateway is shutting down; reconnect and retry"))
	}
	if g.killed.Load() {
		// Refused before the policy is asked, as a call is: decision deny,
		// mode none.
		rec.Decision = auditlog.DecisionDeny
		return refuse(killSwitchAccessFault())
	}
	if eng := g.opts.Policy; eng != nil {
		o := eng.DecideAccess(policy.Access{Action: a.Action, Agent: s.principal, Groups: s.credGroups(), Session: s.id, Upstream: name,
			EvidenceClass: rec.EvidenceClass, URI: a.URI, Prompt: a.Prompt})
		rec.Decision, rec.PolicyIDs, rec.PolicyMode, rec.PolicyBundle, rec.PolicyInput = o.Effect(), o.PolicyIDs, string(o.Mode), o.Bundle, o.AccessInput()
		dec := Decision{Effect: o.Effect(), PolicyIDs: o.PolicyIDs, Mode: string(o.Mode), Bundle: o.Bundle, Reason: o.Reason}
		if g.opts.Metrics != nil {
			g.opts.Metrics.Decision(rec.Decision, rec.PolicyMode)
		}
		if dec.Refuses() {
			return refuse(deniedFaultFor(a.What(name), s.principal, dec))
		}
		if !o.Allow && o.Mode == policy.Advisory {
			g.logger.Warn("policy would deny this request (advisory mode: forwarded)", "agent", s.principal, "session", s.id,
				"method", a.Method, "upstream", name, "prompt", a.Prompt, "policies", fmt.Sprint(o.PolicyIDs), "reason", o.Reason)
			s.warnAgent(ctx, fmt.Sprintf("policy denies %s for %q; the request is forwarded because the policy is in advisory mode", a.What(name), s.principal), dec,
				map[string]any{"method": a.Method, "upstream": name})
		}
	}
	// The forwarded record is never written after kill_switch_on, as a
	// call's (see SetKillSwitch): the switch is checked again, and the
	// record appended, under killMu's read lock.
	g.killMu.RLock()
	if g.killed.Load() {
		g.killMu.RUnlock()
		return refuse(killSwitchAccessFault())
	}
	rec.Outcome = auditlog.OutcomeForwarded
	_, err := g.log.Append(context.WithoutCancel(ctx), rec)
	g.killMu.RUnlock()
	if err != nil {
		g.logger.Error("audit append failed; request refused", "method", a.Method, "upstream", name, "err", err)
		return fault(CodeAuditUnavailable, "the audit log cannot record requests (%v): the request was not forwarded; every request is refused until an operator fixes it", err)
	}
	return nil
}

// killSwitchAccessFault refuses an access while the kill switch is
// engaged: no data flows through the gateway until it is cleared.
func killSwitchAccessFault() *jsonrpc.Error {
	return fault(CodeKillSwitch, "the kill switch is engaged: an operator has stopped all tool calls and reads of resources and prompts; retry when it is cleared")
}

// accessVisible reports which of one upstream's list entries (resources/list,
// resources/templates/list, prompts/list) the agent may see, by the
// read_resource or get_prompt decision, as tools/list is by list_tools.
// keys are the entries' URIs (or URI templates) or prompt names. When the
// bundle does not read them, one decision covers the upstream's whole
// list. nil means every entry.
func (s *session) accessVisible(action policy.Action, upstream string, keys []string) []bool {
	eng := s.g.opts.Policy
	if eng == nil || len(keys) == 0 {
		return nil
	}
	class := ""
	if st := s.g.ups[upstream]; st != nil {
		class = st.expectedClass()
	}
	a := policy.Access{Action: action, Agent: s.principal, Groups: s.credGroups(), Session: s.id, Upstream: upstream, EvidenceClass: class}
	perItem := action == policy.ActionReadResource && eng.ReadsURI() || action == policy.ActionGetPrompt && eng.ReadsPrompt()
	keep := make([]bool, len(keys))
	if !perItem {
		if eng.AccessVisible(a) {
			return nil
		}
		return keep
	}
	for i, k := range keys {
		if action == policy.ActionReadResource {
			a.URI = k
		} else {
			a.Prompt = k
		}
		keep[i] = eng.AccessVisible(a)
	}
	return keep
}
