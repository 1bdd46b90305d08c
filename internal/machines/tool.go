package machines

import (
	"encoding/json"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/catalog"
	"github.com/confidential-mcp/cmcp/internal/tunnel"
	"github.com/confidential-mcp/cmcp/internal/upstream"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// Tool is the name, at a tunnel upstream, of the gateway's own tool that
// lists the upstream's live machines: exposed as
// "<upstream>__list_machines", answered by the gateway, decided by the
// policy and recorded like any call. It shadows a tool of that name the
// machines' server may have.
const Tool = "list_machines"

var listSchema = json.RawMessage(`{"type":"object","properties":{}}`)

// Entry is the list_machines tool of tunnel upstream up as a catalog
// entry (not in the catalog: the gateway answers it).
func Entry(up string) *catalog.Entry {
	no := false
	t := &mcp.Tool{Name: up + catalog.Separator + Tool,
		Description: "Lists the machines connected for upstream " + up + " (id, name, connected since, last heartbeat, host facts). Give a machine's id as the machineId argument of " + up + "'s tools.",
		InputSchema: listSchema, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: &no}}
	b, _ := json.Marshal(t)
	d := digest.Bytes(b)
	return &catalog.Entry{Exposed: t.Name, Upstream: up, Name: Tool, Pin: d, Definition: d, Tool: t}
}

// WithArgument is t with an optional machineId string property added to
// its input schema (the gateway's: it reads and removes it, see Route).
// The pinned definition stays the upstream's.
func WithArgument(t *mcp.Tool, up string) *mcp.Tool {
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
	if _, ok := props[Argument]; ok {
		return t
	}
	props[Argument] = map[string]any{"type": "string",
		"description": "the id of the machine to run on (" + up + catalog.Separator + Tool + " lists them); needed when several machines are connected"}
	schema["properties"] = props
	c := *t
	c.InputSchema = schema
	return &c
}

// Answer is the tools/call result of list_machines at tunnel upstream
// tun (named up): its live machines as JSON text.
func Answer(up string, tun *upstream.Tunnel) json.RawMessage {
	machines := []tunnel.Info{}
	for _, m := range tun.Hub().Machines(tun.Name()) {
		machines = append(machines, m.Info())
	}
	text, _ := json.Marshal(struct {
		Upstream string        `json:"upstream"`
		Machines []tunnel.Info `json:"machines"`
	}{up, machines})
	res, _ := json.Marshal(&mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(text)}}})
	return res
}
