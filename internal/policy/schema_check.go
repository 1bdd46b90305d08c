package policy

import (
	"fmt"
	"time"

	"github.com/cedar-policy/cedar-go"
	"github.com/cedar-policy/cedar-go/x/exp/schema/validate"
)

// checkEntityModel validates the gateway's entity model against a bundle's
// schema: a sample agent, group, tool and upstream, and a request of every
// action (call_tool with empty arguments, list_tools, read_resource with a
// URI, get_prompt with a prompt name), must all conform. A schema that
// declares other attributes, other types or other actions would let
// policies validate against a model the gateway never builds.
func checkEntityModel(v *validate.Validator) error {
	for _, act := range []Action{ActionCallTool, ActionListTools, ActionReadResource, ActionGetPrompt} {
		r := &Request{
			Action: act, Agent: "sample-agent", Groups: []string{"sample-group"},
			Tool: "up__tool", ToolName: "tool", Upstream: "up", EvidenceClass: "spawn-measured",
			Annotations: DefaultAnnotations,
			Session:     Session{ID: "s", Calls: 1, ToolsUsed: []string{"up__tool"}},
			Time:        time.Unix(0, 0),
		}
		switch act {
		case ActionReadResource:
			r.Tool, r.ToolName, r.Annotations, r.URI = "", "", Annotations{}, "file:///sample"
		case ActionGetPrompt:
			r.Tool, r.ToolName, r.Annotations, r.Prompt = "", "", Annotations{}, "sample"
		}
		req, e, err := build(r)
		if err != nil {
			return err
		}
		ents := []cedar.Entity{e.agent, {UID: e.groups[0]}, e.upstream}
		if !act.OnUpstream() {
			ents = append(ents, e.tool)
		}
		for _, ent := range ents {
			if err := v.Entity(ent); err != nil {
				return fmt.Errorf("entity %s: %w", ent.UID, err)
			}
		}
		if err := v.Request(req); err != nil {
			return fmt.Errorf("%s request: %w", act, err)
		}
	}
	return nil
}
