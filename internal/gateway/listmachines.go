package gateway

import (
	"encoding/json"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/catalog"
	"github.com/confidential-mcp/cmcp/internal/tunnel"
	"github.com/confidential-mcp/cmcp/internal/upstream"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// ListMachinesTool is the name, at a tunnel upstream, of the gateway's own
// tool that lists the upstream's live machines: exposed as
// "<upstream>__list_machines", answered by the gateway, decided by the
// policy and recorded like any call. It shadows a tool of that name the
// machines' server may have.
const ListMachinesTool = "list_machines"

// listMachinesOf returns the tunnel upstream whose list_machines tool is
// named name, or nil.
func (g *Gateway) listMachinesOf(name string) (*upState, *upstream.Tunnel) {
	up, tool, ok := catalog.SplitExposed(name)
	if !ok || tool != ListMachinesTool {
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

var listMachinesSchema = json.RawMessage(`{"type":"object","properties":{}}`)

// listMachinesEntry is the list_machines tool of tunnel upstream up as a
// catalog entry (not in the catalog: the gateway answers it).
func listMachinesEntry(up string) *catalog.Entry {
	no := false
	t := &mcp.Tool{Name: up + catalog.Separator + ListMachinesTool,
		Description: "Lists the machines connected for upstream " + up + " (id, name, connected since, last heartbeat, host facts). Give a machine's id as the machineId argument of " + up + "'s tools.",
		InputSchema: listMachinesSchema, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: &no}}
	b, _ := json.Marshal(t)
	d := digest.Bytes(b)
	return &catalog.Entry{Exposed: t.Name, Upstream: up, Name: ListMachinesTool, Pin: d, Definition: d, Tool: t}
}

// withMachineID is t with an optional machineId string property added to
// its input schema (the gateway's: it reads and removes it, see
// routeMachine). The pinned definition stays the upstream's.
func withMachineID(t *mcp.Tool, up string) *mcp.Tool {
	b, err := json.Marshal(t.InputSchema)
	if err != nil {
		return t
	}
	var schema map[string]any
	if json.Unmarshal(b, &schema) != nil || schema == nil {
		return t
	}
	props, _ := schema["properties"].(map[string]any)
	if props == nil {
		props = map[string]any{}
	}
	if _, ok := props[MachineArgument]; ok {
		return t
	}
	props[MachineArgument] = map[string]any{"type": "string",
		"description": "the id of the machine to run on (" + up + catalog.Separator + ListMachinesTool + " lists them); needed when several machines are connected"}
	schema["properties"] = props
	c := *t
	c.InputSchema = schema
	return &c
}

// listMachines answers a call to a tunnel upstream's list_machines tool:
// checked, decided by the policy and recorded like any call, answered
// from the live tunnels as JSON text.
func (c *callRun) listMachines(st *upState, tun *upstream.Tunnel, after *func(undelivered string)) (json.RawMessage, error) {
	s, g, rec := c.s, c.s.g, c.rec
	if err := c.checkArgs(); err != nil {
		return nil, err
	}
	rec.Upstream, rec.UpstreamTool, rec.EvidenceClass = st.name, ListMachinesTool, upstream.ClassTunnel
	if g.killed.Load() {
		return nil, c.refuse(fault(CodeKillSwitch, "the kill switch is engaged: an operator has stopped all tool calls; retry when it is cleared"))
	}
	if err := c.decide(st, ListMachinesTool, listMachinesEntry(st.name)); err != nil {
		return nil, err
	}
	rcpt, err := c.recordForwarded()
	if err != nil {
		return nil, err
	}
	machines := []tunnel.Info{}
	for _, m := range tun.Hub().Machines(tun.Name()) {
		machines = append(machines, m.Info())
	}
	text, _ := json.Marshal(struct {
		Upstream string        `json:"upstream"`
		Machines []tunnel.Info `json:"machines"`
	}{st.name, machines})
	res, _ := json.Marshal(&mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(text)}}})
	result := &auditlog.Result{Call: receiptIndex(rcpt), Session: s.id, LatencyMicros: time.Since(c.start).Microseconds(),
		Outcome: auditlog.ResultOK, Result: g.log.Commit(res)}
	g.metricCall(st.name, rec.Decision, result.Outcome, time.Since(c.start))
	s.callsChanged()
	c.appendResult(result, after)
	return res, nil
}

// exposedTool is the definition a session registers for entry e: a tunnel
// upstream's tools get the machineId property.
func (g *Gateway) exposedTool(e *catalog.Entry) *mcp.Tool {
	if st := g.ups[e.Upstream]; st != nil && e.Name != ListMachinesTool {
		if _, ok := st.opts.Upstream.(*upstream.Tunnel); ok {
			return withMachineID(e.Tool, e.Upstream)
		}
	}
	return e.Tool
}
