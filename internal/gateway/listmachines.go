package gateway

import (
	"encoding/json"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/catalog"
	"github.com/confidential-mcp/cmcp/internal/machines"
	"github.com/confidential-mcp/cmcp/internal/upstream"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// The gateway's side of a tunnel upstream's machines (internal/machines):
// the list_machines call and the machineId property of the exposed tools.

// listMachinesOf returns the tunnel upstream whose list_machines tool is
// named name, or nil.
func (g *Gateway) listMachinesOf(name string) (*upState, *upstream.Tunnel) {
	up, tool, ok := catalog.SplitExposed(name)
	if !ok || tool != machines.Tool {
		return nil, nil
	}
	st := g.ups[up]
	if st == nil {
		return nil, nil
	}
	tun, ok := st.opts.Upstream.(*upstream.Tunnel)
	if !ok {
		return nil, nil
	}
	return st, tun
}

// listMachines answers a call to a tunnel upstream's list_machines tool:
// checked, decided by the policy and recorded like any call, answered
// from the live tunnels as JSON text.
func (c *callRun) listMachines(st *upState, tun *upstream.Tunnel, after *func(undelivered string)) (json.RawMessage, error) {
	s, g, rec := c.s, c.s.g, c.rec
	if err := c.checkArgs(); err != nil {
		return nil, err
	}
	rec.Upstream, rec.UpstreamTool, rec.EvidenceClass = st.name, machines.Tool, upstream.ClassTunnel
	if g.ks.Engaged() {
		return nil, c.refuse(fault(CodeKillSwitch, "the kill switch is engaged: an operator has stopped all tool calls; retry when it is cleared"))
	}
	if err := c.decide(st, machines.Tool, machines.Entry(st.name)); err != nil {
		return nil, err
	}
	rcpt, err := c.recordForwarded()
	if err != nil {
		return nil, err
	}
	res := machines.Answer(st.name, tun)
	result := &record.Result{Call: receiptIndex(rcpt), Session: s.id, LatencyMicros: time.Since(c.start).Microseconds(),
		Outcome: record.ResultOK, Result: g.log.Commit(res)}
	g.metricCall(st.name, rec.Decision, result.Outcome, time.Since(c.start))
	s.tools.CallsChanged()
	c.appendResult(result, after)
	return res, nil
}

// exposedTool is the definition a session registers for entry e: a tunnel
// upstream's tools get the machineId property.
func (g *Gateway) exposedTool(e *catalog.Entry) *mcp.Tool {
	if st := g.ups[e.Upstream]; st != nil && e.Name != machines.Tool {
		if _, ok := st.opts.Upstream.(*upstream.Tunnel); ok {
			return machines.WithArgument(e.Tool, e.Upstream)
		}
	}
	return e.Tool
}

// toolError is a tools/call result with isError and text.
func toolError(text string) json.RawMessage {
	b, _ := json.Marshal(map[string]any{"content": []any{map[string]string{"type": "text", "text": "cmcp: " + text}}, "isError": true})
	return b
}

// toolAnswer is admit's way to answer a call with a tool result (already
// recorded as refused) instead of a fault.
type toolAnswer struct{ raw json.RawMessage }

func (a *toolAnswer) Error() string { return "answered as a tool error" }
