package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/callwire"
	"github.com/confidential-mcp/cmcp/internal/catalog"
	"github.com/confidential-mcp/cmcp/internal/decide"
	"github.com/confidential-mcp/cmcp/internal/machines"
	"github.com/confidential-mcp/cmcp/internal/rpcwire"
	"github.com/confidential-mcp/cmcp/internal/upstream"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// toolCall is one tools/call as the agent sent it (callwire.Call).
type toolCall = callwire.Call

// rawResult is a tools/call result forwarded to the agent as the exact
// bytes the upstream sent.
type rawResult struct {
	mcp.ResultBase
	raw json.RawMessage
}

func (r *rawResult) MarshalJSON() ([]byte, error) { return r.raw, nil }

// callTool is the go-sdk front's entry to the call pipeline.
func (s *session) callTool(ctx context.Context, req *mcp.CallToolRequest) (mcp.Result, error) {
	p := req.Params
	// Ends with the session too, as the fast paths' calls do: the session's
	// end waits for its handlers.
	ctx, cancel := s.withSession(ctx)
	defer cancel()
	call := toolCall{Name: p.Name, Args: p.Arguments, Progress: p.GetProgressToken()}
	if p.Meta != nil {
		// go-sdk has decoded it already (numbers as float64): its bytes
		// are gone, this is the best that can be sent.
		m, err := json.Marshal(p.Meta)
		if err != nil {
			return nil, fault(jsonrpc.CodeInvalidParams, "tools/call _meta cannot be encoded: %v", err)
		}
		call.Meta = m
	}
	raw, err := s.relay(ctx, call, nil)
	if err != nil {
		return nil, err
	}
	return &rawResult{raw: raw}, nil
}

// relay is the call pipeline: route the exposed name to an upstream tool,
// check the kill switch, decide, reach the upstream, make the call record
// durable, forward, and record the result. Every tools/call produces
// exactly one call record; every forwarded call exactly one result record.
// The result is the upstream's exact bytes; errors are the upstream's
// JSON-RPC error as it sent it, a gateway fault, or ctx's error. If after
// is not nil and the call was forwarded, *after is set to the append of
// the result record, which the caller must call once it has answered,
// with why the answer could not be delivered ("" if it was).
func (s *session) relay(ctx context.Context, params toolCall, after *func(undelivered string)) (json.RawMessage, error) {
	g := s.g
	g.inflight.Add(1)
	defer g.inflight.Done()
	c, fwd, out, err := s.admitCall(ctx, params, after)
	if fwd == nil {
		return out, err
	}
	res, sent, cctx, callErr := c.forward(fwd.lv, fwd.toolName)
	return c.finish(fwd, res, sent, cctx, callErr, after)
}

// relayThen is relay whose end runs done, with the answer and the append
// of the result record (nil if there is none; see relay's after), instead
// of returning: for a call forwarded on a stdio child's connection, in the
// child's read loop once the answer is read (or in the goroutine of the
// call's end: its cancellation, its timeout, the connection's failure),
// so that no goroutine waits for the upstream; otherwise before relayThen
// returns. The call record is durable before the call is forwarded, as in
// relay.
func (s *session) relayThen(ctx context.Context, params toolCall, done func(out json.RawMessage, err error, after func(undelivered string))) {
	g := s.g
	g.inflight.Add(1)
	var after func(undelivered string)
	c, fwd, out, err := s.admitCall(ctx, params, &after)
	if fwd == nil {
		g.inflight.Done()
		done(out, err, after)
		return
	}
	c.forwardThen(fwd.lv, fwd.toolName, func(res json.RawMessage, sent bool, cctx context.Context, callErr error) {
		out, err := c.finish(fwd, res, sent, cctx, callErr, &after)
		g.inflight.Done()
		done(out, err, after)
	})
}

// forwarding is an admitted call on its way upstream: its record's
// receipt, its upstream and connection.
type forwarding struct {
	rcpt     auditlog.Receipt
	st       *upState
	toolName string
	lv       *live
}

// admitCall takes a call through the pipeline up to its forwarding: route,
// kill switch, policy, upstream, and the durable call record. A call it
// answers itself (refused, or a tunnel's machine list) has fwd nil and the
// answer in out and err.
func (s *session) admitCall(ctx context.Context, params toolCall, after *func(undelivered string)) (c *callRun, fwd *forwarding, out json.RawMessage, err error) {
	c = s.newCallRun(ctx, params)
	if st, tun := s.g.listMachinesOf(params.Name); st != nil {
		out, err = c.listMachines(st, tun, after)
		return c, nil, out, err
	}
	st, toolName, lv, err := c.admit()
	if err != nil {
		var ta *toolAnswer
		if errors.As(err, &ta) {
			return c, nil, ta.raw, nil // refused, recorded, answered as a tool error
		}
		return c, nil, nil, err // refused and recorded
	}
	rcpt, err := c.recordForwarded()
	if err != nil {
		return c, nil, nil, err
	}
	return c, &forwarding{rcpt: rcpt, st: st, toolName: toolName, lv: lv}, nil, nil
}

// finish ends a forwarded call: its result record (exactly one per
// forwarded call), metrics, and the agent's answer.
func (c *callRun) finish(fwd *forwarding, res json.RawMessage, sent bool, cctx context.Context, callErr error, after *func(undelivered string)) (json.RawMessage, error) {
	s, g := c.s, c.s.g
	result := &record.Result{Call: receiptIndex(fwd.rcpt), Session: s.id, LatencyMicros: time.Since(c.start).Microseconds()}
	out, outErr := c.outcome(result, fwd.st, fwd.lv, fwd.toolName, res, callErr, sent, cctx)
	g.metricCall(fwd.st.name, c.rec.Decision, result.Outcome, time.Since(c.start))
	s.tools.CallsChanged() // the call may change what list_tools allows this session
	c.appendResult(result, after)
	if refill := fwd.lv.refill.Swap(nil); refill != nil {
		// The first call to a warm spare: its replacement is made once
		// the answer is on its way.
		if after != nil && *after != nil {
			answered := *after
			*after = func(undelivered string) {
				answered(undelivered)
				(*refill)()
			}
		} else {
			(*refill)()
		}
	}
	return out, outErr
}

// callRun is one tools/call on its way through relay: its call record as it
// is filled in, and whether the policy has decided it yet.
type callRun struct {
	s      *session
	ctx    context.Context
	params toolCall
	args   json.RawMessage
	start  time.Time
	rec    *record.Call
	// decided: a refusal from here on is counted under the decision (deny
	// if the policy failed), not "none".
	decided bool
	// checked: the upstream's result was part of a line checked strictly
	// on arrival (upstream.WithChecked): it is not checked again.
	checked bool
}

// newCallRun starts the call record of params.
func (s *session) newCallRun(ctx context.Context, params toolCall) *callRun {
	args := params.Args
	if len(args) == 0 || string(args) == "null" {
		args = json.RawMessage("{}")
	}
	rec := &record.Call{Session: s.id, Agent: s.principal, Tool: params.Name, Decision: record.DecisionDeny, PolicyMode: ModeNone}
	rec.Args = s.g.log.Commit(args)
	if params.ID.IsValid() {
		// The id as sent (a string, or an integer: rpcwire refuses others),
		// so that a record is matched to the agent's request.
		rec.RequestID, _ = json.Marshal(params.ID.Raw())
	}
	return &callRun{s: s, ctx: ctx, params: params, args: args, start: time.Now(), rec: rec}
}

// refuse records the call as refused and returns the fault, or -32063 if
// the record cannot be written. In the metrics, a call refused before the
// policy was asked has decision "none" (no policy denied it), and the
// outcome names the fault the agent is answered (refusalOutcome):
// kill_switch, upstream_unavailable, gateway_fault for an audit log that
// failed, refused for the rest.
func (c *callRun) refuse(err *jsonrpc.Error) error {
	g, rec := c.s.g, c.rec
	rec.Outcome, rec.Reason = record.OutcomeRefused, err.Message
	decision := rec.Decision
	if !c.decided {
		decision = DecisionNone
	}
	if aerr := g.record(c.ctx, rec); aerr != nil { // written even if ctx has ended
		err = fault(CodeAuditUnavailable, "the audit log cannot record calls (%v): every call is refused until an operator fixes it", aerr)
	}
	g.metricCall(rec.Upstream, decision, refusalOutcome(err.Code), 0)
	c.s.tools.CallsChanged()
	return err
}

// admit checks the call, routes it, has the policy decide it and reaches
// its upstream; a call refused on the way is recorded as refused, and the
// error is the agent's answer.
func (c *callRun) admit() (*upState, string, *live, error) {
	s, g, ctx, params, rec := c.s, c.s.g, c.ctx, c.params, c.rec
	if err := c.checkArgs(); err != nil {
		return nil, "", nil, err
	}
	st, toolName, entry := s.route(params.Name)
	if st == nil {
		return nil, "", nil, c.refuse(fault(CodeUnknownTool, "unknown tool %q; call tools/list to see the tools this gateway exposes", params.Name))
	}
	rec.Upstream, rec.UpstreamTool, rec.EvidenceClass = st.name, toolName, st.expectedClass()
	tun, isTunnel := st.opts.Upstream.(*upstream.Tunnel)
	if isTunnel {
		routed, machine, why := machines.Route(tun, c.args)
		rec.Machine = machine
		if why != "" {
			// Answered as a tool error, which an agent reads and acts on
			// (the live machines are listed), and recorded as refused.
			rec.Outcome, rec.Reason = record.OutcomeRefused, why
			if aerr := g.record(ctx, rec); aerr != nil {
				return nil, "", nil, fault(CodeAuditUnavailable, "the audit log cannot record calls (%v): every call is refused until an operator fixes it", aerr)
			}
			g.metricCall(rec.Upstream, DecisionNone, "refused", 0)
			s.tools.CallsChanged()
			return nil, "", nil, &toolAnswer{raw: toolError(why)}
		}
		c.args = routed
	}
	if g.ks.Engaged() {
		return nil, "", nil, c.refuse(fault(CodeKillSwitch, "the kill switch is engaged: an operator has stopped all tool calls; retry when it is cleared"))
	}
	if err := c.decide(st, toolName, entry); err != nil {
		return nil, "", nil, err
	}
	if entry == nil {
		// The upstream is known but its catalog is not loaded (it could not
		// be started so far): try again, re-measured.
		upstream.Waiting(ctx)
		if err := st.loadFor(ctx, s); err != nil {
			if se := sessionEndOf(ctx); se != nil {
				return nil, "", nil, c.refuse(se.fault())
			}
			if cf := s.credentialFault(err); cf != nil {
				return nil, "", nil, c.refuse(cf)
			}
			return nil, "", nil, c.refuse(fault(CodeUpstreamUnavailable, "%v", err))
		}
		if _, _, entry = s.route(params.Name); entry == nil {
			return nil, "", nil, c.refuse(fault(CodeUnknownTool, "unknown tool %q: upstream %q has no such tool; call tools/list to see the tools this gateway exposes", params.Name, st.name))
		}
	}
	uctx := ctx
	if isTunnel {
		uctx = upstream.WithMachine(ctx, rec.Machine) // a session's first connection starts there
	}
	lv, err := s.upstreamFor(uctx, st.name)
	if err != nil {
		if se := sessionEndOf(ctx); se != nil {
			return nil, "", nil, c.refuse(se.fault()) // its session ended while the upstream started
		}
		if cf := s.credentialFault(err); cf != nil {
			return nil, "", nil, c.refuse(cf)
		}
		return nil, "", nil, c.refuse(fault(CodeUpstreamUnavailable, "%v", err))
	}
	rec.EvidenceClass = lv.conn.Class
	if !lv.allows(toolName) {
		return nil, "", nil, c.refuse(fault(CodeToolDrifted, "tool %q of upstream %q no longer matches its pinned definition and is refused; an operator must review it and update the pin (cmcp spawn-digest --tools)", toolName, st.name))
	}
	return st, toolName, lv, nil
}

// checkArgs refuses a call while the gateway shuts down, and one whose
// arguments are not an object or whose arguments or _meta hold text that
// is not UTF-8.
func (c *callRun) checkArgs() error {
	if c.s.g.closing.Load() {
		return c.refuse(fault(CodeShuttingDown, "the gateway is shutting down; reconnect and retry"))
	}
	if a := bytes.TrimLeft(c.args, " \t\r\n"); len(a) == 0 || a[0] != '{' {
		return c.refuse(fault(jsonrpc.CodeInvalidParams, "tools/call arguments must be a JSON object (MCP), not %s; nothing was forwarded", callwire.Kind(a)))
	}
	// The fronts refuse such text in the whole message (refuseAmbiguousCall);
	// this holds for any other way a call gets here.
	for _, part := range []struct {
		b     []byte
		where jsontext.Pointer
	}{{c.args, "/params/arguments"}, {c.params.Meta, "/params/_meta"}} {
		if rpcwire.MayBeNotUTF8(part.b) {
			if where, what, bad := rpcwire.NotUTF8(part.b); bad {
				return c.refuse(fault(jsonrpc.CodeInvalidParams, "%s", notUTF8Why(part.where+where, what)))
			}
		}
	}
	return nil
}

// decide asks the policy about the call and notes its decision in the
// call record; a refusing decision is recorded and returned.
func (c *callRun) decide(st *upState, toolName string, entry *catalog.Entry) error {
	s, g, ctx, params, rec := c.s, c.s.g, c.ctx, c.params, c.rec
	var annotations *mcp.ToolAnnotations
	if entry != nil && entry.Tool != nil {
		annotations = entry.Tool.Annotations
	}
	dec, err := g.decider.Decide(ctx, DecisionRequest{Principal: s.principal, Tool: params.Name, UpstreamTool: toolName, Upstream: st.name,
		EvidenceClass: rec.EvidenceClass, Machine: rec.Machine, Args: c.args, Session: s.info(), Annotations: annotations})
	c.decided = true // from here on a refusal is counted under the decision (deny if the policy failed)
	if err != nil {
		return c.refuse(fault(CodeDenied, "the policy could not decide this call (%v): refused", err))
	}
	rec.Decision, rec.PolicyIDs, rec.PolicyMode, rec.PolicyBundle, rec.PolicyInput = dec.Effect, dec.PolicyIDs, dec.Mode, dec.Bundle, dec.Input
	if rec.Decision == "" {
		rec.Decision = record.DecisionDeny
	}
	if g.opts.Metrics != nil {
		g.opts.Metrics.Decision(rec.Decision, rec.PolicyMode)
	}
	if dec.Refuses() {
		return c.refuse(decide.DeniedFault(params.Name, s.principal, dec))
	}
	if dec.Effect != record.DecisionAllow && dec.Mode == ModeAdvisory {
		s.advise(ctx, params.Name, dec)
	}
	return nil
}

// recordForwarded makes the forwarded call record durable, even if the
// agent cancels meanwhile (a cancelled ctx would leave the call without
// one), and never after kill_switch_on (see SetKillSwitch).
func (c *callRun) recordForwarded() (auditlog.Receipt, error) {
	g, rec := c.s.g, c.rec
	g.ks.RLock()
	if g.ks.Engaged() {
		g.ks.RUnlock()
		return auditlog.Receipt{}, c.refuse(fault(CodeKillSwitch, "the kill switch is engaged: an operator has stopped all tool calls; retry when it is cleared"))
	}
	rec.Outcome = record.OutcomeForwarded
	rcpt, err := g.log.Append(context.WithoutCancel(c.ctx), rec)
	g.ks.RUnlock()
	if err != nil {
		g.metricCall(rec.Upstream, rec.Decision, OutcomeGatewayFault, 0)
		g.logger.Error("audit append failed; call refused", "tool", c.params.Name, "err", err)
		return rcpt, fault(CodeAuditUnavailable, "the audit log cannot record calls (%v): the call was not forwarded; every call is refused until an operator fixes it", err)
	}
	return rcpt, nil
}

// forward sends the call upstream, bounded by the call timeout, unless the
// agent cancelled it while its record was written (sent false).
func (c *callRun) forward(lv *live, toolName string) (res json.RawMessage, sent bool, cctx context.Context, callErr error) {
	c.forwardWith(lv, toolName, false, func(r json.RawMessage, s bool, cc context.Context, err error) {
		res, sent, cctx, callErr = r, s, cc, err
	})
	return res, sent, cctx, callErr
}

// forwardThen is forward whose end runs done (see relayThen).
func (c *callRun) forwardThen(lv *live, toolName string, done func(res json.RawMessage, sent bool, cctx context.Context, callErr error)) {
	c.forwardWith(lv, toolName, true, done)
}

// forwardWith sends the call and runs done with its end: if async, in the
// goroutine Conn.RawCallThen picks; otherwise before it returns.
func (c *callRun) forwardWith(lv *live, toolName string, async bool, done func(json.RawMessage, bool, context.Context, error)) {
	ctx, g := c.ctx, c.s.g
	if err := ctx.Err(); err != nil { // cancelled while its record was written: not sent
		done(nil, false, ctx, err)
		return
	}
	upTok, release := lv.track(ctx, c.s, c.params.Progress)
	cctx, cancel := context.WithTimeout(ctx, g.opts.CallTimeout)
	end := func(res json.RawMessage, callErr error) {
		cancel()
		release()
		done(res, true, cctx, callErr)
	}
	conn := lv.conn
	if c.rec.Machine != "" && conn.Machine != c.rec.Machine {
		// The session's connection is on another machine of the
		// tunnel upstream: the call goes to a session of its own there.
		var err error
		if conn, err = lv.conn.OnMachine(cctx, c.rec.Machine); err != nil {
			end(nil, err)
			return
		}
	}
	uctx := upstream.WithChecked(cctx, &c.checked)
	b, err := toolsCallParams(toolName, c.args, callwire.SpliceMeta(c.params.Meta, upTok))
	switch {
	case err != nil:
		end(nil, err)
	case async:
		conn.RawCallThen(uctx, "tools/call", b, end)
	default:
		end(conn.RawCall(uctx, "tools/call", b))
	}
}

// outcome fills in the result record of a forwarded call and returns the
// agent's answer: the upstream's result, its error, or the gateway's fault.
func (c *callRun) outcome(result *record.Result, st *upState, lv *live, toolName string, res json.RawMessage, callErr error, sent bool, cctx context.Context) (json.RawMessage, error) {
	s, g, ctx := c.s, c.s.g, c.ctx
	var out json.RawMessage
	var outErr error
	switch {
	case callErr == nil:
		res = callwire.OneLine(res)
		// The commitment is to the exact bytes the agent receives.
		result.Result = g.log.Commit(res)
		isError, read := false, false
		if c.checked {
			isError, read = callwire.CheckedIsError(res)
		}
		var err error
		if !read {
			isError, err = callwire.ResultIsError(res)
		}
		if err != nil {
			f := fault(CodeUpstreamFailed, "upstream %q answered %q with a result that is not a tools/call result (%v); it was not forwarded", st.name, toolName, err)
			result.Outcome, result.ErrorCode, result.Reason = record.ResultUpstreamError, f.Code, f.Message
			outErr = f
			break
		}
		out = res
		result.Outcome = record.ResultOK
		if isError {
			result.Outcome = record.ResultIsError
		}
	case sessionEndOf(ctx) != nil:
		// Cut by its session's end (the gateway's shutdown, an idle
		// timeout, a withdrawn token, the agent's DELETE): answered with
		// the end's fault, which the result record names.
		se := sessionEndOf(ctx)
		f := se.fault()
		when := "while it ran upstream; it was cancelled there"
		if !sent {
			when = "before it was sent upstream"
		}
		result.Outcome, result.ErrorCode = record.ResultCancelled, f.Code
		result.Reason = fmt.Sprintf("the gateway cut the call %s: its session ended (%s)", when, se.why)
		outErr = f
	case !sent:
		result.Outcome, result.Reason = record.ResultCancelled, "the agent cancelled the call before it was sent upstream"
		outErr = ctx.Err()
	case ctx.Err() != nil:
		result.Outcome, result.Reason = record.ResultCancelled, "the agent cancelled the call"
		outErr = ctx.Err()
	case errors.Is(cctx.Err(), context.DeadlineExceeded):
		result.Outcome = record.ResultGatewayFault
		f := fault(CodeUpstreamTimeout, "upstream %q did not answer %q within %s; the call was cancelled upstream", st.name, toolName, g.opts.CallTimeout)
		result.ErrorCode, result.Reason = f.Code, f.Message
		outErr = f
	default:
		outErr = s.upstreamError(lv, callErr)
		result.Outcome = record.ResultUpstreamError
		var we *jsonrpc.Error
		if errors.As(outErr, &we) {
			result.ErrorCode, result.Reason = we.Code, we.Message
			if b, err := json.Marshal(we); err == nil {
				result.Result = g.log.Commit(b)
			}
		}
	}
	return out, outErr
}

// appendResult appends the result record after the response is on its
// way: only the call record must be durable before anything happens. With
// after set, the caller appends it by calling *after once it has written
// the response; otherwise it is appended in the background. Shutdown
// waits for these appends before the log is sealed; if one fails the
// writer is broken and every further call is refused at its call record.
func (c *callRun) appendResult(result *record.Result, after *func(undelivered string)) {
	g, ctx := c.s.g, c.ctx
	g.results.Add(1)
	appendResult := func(undelivered string) {
		defer g.results.Done()
		if undelivered != "" {
			result.Reason = joinReason(result.Reason, "the answer was not delivered: "+undelivered)
		}
		if _, err := g.log.Append(context.WithoutCancel(ctx), result); err != nil {
			g.logger.Error("audit append of a result failed; further calls will be refused", "tool", c.params.Name, "call", result.Call, "err", err)
		}
	}
	if after != nil {
		*after = appendResult
	} else {
		go appendResult("")
	}
}

// toolsCallParams are the params of tools/call sent upstream as a raw
// call (both kinds of upstream connection make them), whose result comes
// back as its exact bytes. meta is the _meta object to send (empty: none).
func toolsCallParams(tool string, args, meta json.RawMessage) (json.RawMessage, error) {
	name, err := json.Marshal(tool)
	if err != nil {
		return nil, err
	}
	b := make([]byte, 0, len(args)+len(meta)+len(name)+32)
	b = append(b, '{')
	if len(meta) > 0 {
		b = append(append(append(b, `"_meta":`...), meta...), ',')
	}
	b = append(append(b, `"name":`...), name...)
	b = append(append(append(b, `,"arguments":`...), args...), '}')
	return b, nil
}

// route maps an exposed tool name to its upstream, the upstream's tool name
// and the catalog entry. The upstream is found even when the tool is not in
// the catalog (an upstream that could not be started yet), so that the
// refusal can say which upstream is unavailable and why.
func (s *session) route(name string) (*upState, string, *catalog.Entry) {
	if e, ok := s.g.Catalog().Lookup(name); ok {
		return s.g.ups[e.Upstream], e.Name, e
	}
	if len(s.g.order) == 1 {
		st := s.g.ups[s.g.order[0]]
		if !st.opts.Namespaced {
			if st.isLoaded() {
				return nil, "", nil
			}
			return st, name, nil
		}
	}
	up, tool, ok := catalog.SplitExposed(name)
	if !ok {
		return nil, "", nil
	}
	st := s.g.ups[up]
	if st == nil || st.isLoaded() {
		return nil, "", nil
	}
	return st, tool, nil
}

func receiptIndex(r auditlog.Receipt) int64 { return r.Index }

func (g *Gateway) metricCall(upstream, decision, outcome string, latency time.Duration) {
	if g.opts.Metrics != nil {
		g.opts.Metrics.CallDone(upstream, decision, outcome, latency)
	}
}
