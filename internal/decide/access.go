package decide

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/confidential-mcp/cmcp/internal/faults"
	"github.com/confidential-mcp/cmcp/internal/policy"
	"github.com/confidential-mcp/cmcp/internal/route"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// Gate decides and records one session's requests for resources, prompts
// and completions (route.Session's Gate and Visible), as the call pipeline
// does a tools/call.
type Gate struct {
	Policy  *policy.Engine // nil: no policy, every access allowed (mode none)
	Core    GateCore
	Session GateSession
}

// GateCore is what the gate needs of the gateway.
type GateCore interface {
	// Class is upstream up's evidence class ("" if not known yet); known
	// is false when there is no such upstream.
	Class(up string) (class string, known bool)
	// Commit is the audit log's commitment to a payload.
	Commit(payload []byte) record.Commitment
	// Record appends rec, even if ctx ends meanwhile; a failure is
	// logged and returned.
	Record(ctx context.Context, rec record.Record) error
	// Closing reports whether the gateway shuts down.
	Closing() bool
	// Killed reports whether the kill switch is engaged.
	Killed() bool
	// AppendForwarded appends rec unless the kill switch is engaged
	// (killed: nothing appended), checked and appended under the
	// switch's read lock: no forwarded record follows kill_switch_on.
	AppendForwarded(ctx context.Context, rec record.Record) (killed bool, err error)
	// Decided counts one policy decision (metrics).
	Decided(decision, mode string)
	Logger() *slog.Logger
}

// GateSession is the session whose request is decided.
type GateSession interface {
	ID() string
	Principal() string
	Groups() []string // the groups its credential names
	// Warn tells the agent, on the request's own stream, that the policy
	// denies what is forwarded anyway (advisory mode).
	Warn(ctx context.Context, msg string, d Decision, data map[string]any)
}

// Access decides the access a for each upstream of ups (those the
// request may be sent to, in order), records each decision in an access
// record made durable before anything is forwarded, and returns the
// upstreams the request may be sent to. When the policy refuses every one
// (a deny in enforcing mode) it returns the denial; a record that cannot
// be written refuses the request. No upstream (ups empty) is no decision.
func (gt Gate) Access(ctx context.Context, a route.Access, ups []string) ([]string, error) {
	var out []string
	var denied error
	for _, name := range ups {
		err := gt.decide(ctx, a, name)
		var we *jsonrpc.Error
		switch {
		case err == nil:
			out = append(out, name)
		case errors.As(err, &we) && we.Code == faults.Denied:
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

// decide decides and records a's access to one upstream, as relay
// does a call: the kill switch refuses it (-32064) before the policy is
// asked, enforcing refuses a deny, advisory forwards it and warns the
// agent and the operator, silent forwards it and says nothing; without a
// policy every access is allowed and recorded with mode none.
func (gt Gate) decide(ctx context.Context, a route.Access, name string) error {
	g, s := gt.Core, gt.Session
	class, known := g.Class(name)
	if !known {
		return faults.New(faults.UpstreamUnavailable, "no upstream %q", name)
	}
	rec := &record.Access{Session: s.ID(), Agent: s.Principal(), Method: a.Method, Action: string(a.Action), Upstream: name,
		EvidenceClass: class, Prompt: a.Prompt, Decision: record.DecisionAllow, PolicyMode: ModeNone}
	if a.Action == policy.ActionReadResource {
		// The URI is a payload (it may name a file): committed, never in clear.
		rec.URI = g.Commit([]byte(a.URI))
	}
	if len(a.Args) > 0 {
		rec.Args = g.Commit(a.Args)
	}
	refuse := func(err *jsonrpc.Error) error {
		rec.Outcome, rec.Reason = record.OutcomeRefused, err.Message
		if aerr := g.Record(ctx, rec); aerr != nil {
			return faults.New(faults.AuditUnavailable, "the audit log cannot record requests (%v): every request is refused until an operator fixes it", aerr)
		}
		return err
	}
	if g.Closing() {
		return refuse(faults.New(faults.ShuttingDown, "the gateway is shutting down; reconnect and retry"))
	}
	if g.Killed() {
		// Refused before the policy is asked, as a call is: decision deny,
		// mode none.
		rec.Decision = record.DecisionDeny
		return refuse(killSwitchAccessFault())
	}
	if eng := gt.Policy; eng != nil {
		o := eng.DecideAccess(policy.Access{Action: a.Action, Agent: s.Principal(), Groups: s.Groups(), Session: s.ID(), Upstream: name,
			EvidenceClass: rec.EvidenceClass, URI: a.URI, Prompt: a.Prompt})
		rec.Decision, rec.PolicyIDs, rec.PolicyMode, rec.PolicyBundle, rec.PolicyInput = o.Effect(), o.PolicyIDs, string(o.Mode), o.Bundle, o.AccessInput()
		dec := Decision{Effect: o.Effect(), PolicyIDs: o.PolicyIDs, Mode: string(o.Mode), Bundle: o.Bundle, Reason: o.Reason}
		g.Decided(rec.Decision, rec.PolicyMode)
		if dec.Refuses() {
			return refuse(deniedFaultFor(a.What(name), s.Principal(), dec))
		}
		if !o.Allow && o.Mode == policy.Advisory {
			g.Logger().Warn("policy would deny this request (advisory mode: forwarded)", "agent", s.Principal(), "session", s.ID(),
				"method", a.Method, "upstream", name, "prompt", a.Prompt, "policies", fmt.Sprint(o.PolicyIDs), "reason", o.Reason)
			s.Warn(ctx, fmt.Sprintf("policy denies %s for %q; the request is forwarded because the policy is in advisory mode", a.What(name), s.Principal()), dec,
				map[string]any{"method": a.Method, "upstream": name})
		}
	}
	// The forwarded record is never written after kill_switch_on, as a
	// call's (see the gateway's SetKillSwitch): the switch is checked
	// again, and the record appended, under its read lock
	// (GateCore.AppendForwarded).
	rec.Outcome = record.OutcomeForwarded
	killed, err := g.AppendForwarded(ctx, rec)
	if killed {
		return refuse(killSwitchAccessFault())
	}
	if err != nil {
		g.Logger().Error("audit append failed; request refused", "method", a.Method, "upstream", name, "err", err)
		return faults.New(faults.AuditUnavailable, "the audit log cannot record requests (%v): the request was not forwarded; every request is refused until an operator fixes it", err)
	}
	return nil
}

// killSwitchAccessFault refuses an access while the kill switch is
// engaged: no data flows through the gateway until it is cleared.
func killSwitchAccessFault() *jsonrpc.Error {
	return faults.New(faults.KillSwitch, "the kill switch is engaged: an operator has stopped all tool calls and reads of resources and prompts; retry when it is cleared")
}

// Visible reports which of one upstream's list entries (resources/list,
// resources/templates/list, prompts/list) the agent may see, by the
// read_resource or get_prompt decision, as tools/list is by list_tools.
// keys are the entries' URIs (or URI templates) or prompt names. When the
// bundle does not read them, one decision covers the upstream's whole
// list. nil means every entry.
func (gt Gate) Visible(action policy.Action, upstream string, keys []string) []bool {
	eng, s := gt.Policy, gt.Session
	if eng == nil || len(keys) == 0 {
		return nil
	}
	class, _ := gt.Core.Class(upstream)
	a := policy.Access{Action: action, Agent: s.Principal(), Groups: s.Groups(), Session: s.ID(), Upstream: upstream, EvidenceClass: class}
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
