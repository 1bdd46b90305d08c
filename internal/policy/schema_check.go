package policy

import (
	"fmt"
	"time"

	"github.com/cedar-policy/cedar-go"
	"github.com/cedar-policy/cedar-go/x/exp/schema/validate"
)

// checkEntityModel validates the gateway's entity model against a bundle's
// schema: a sample agent, group, tool and upstream, and a call_tool and a
// list_tools request with empty arguments, must all conform. A schema that
// declares other attributes, other types or other actions would let policies
// validate against a model the gateway never builds.
func checkEntityModel(v *validate.Validator) error {
	for _, act := range []Action{ActionCallTool, ActionListTools} {
		r := &Request{
			Action: act, Agent: "sample-agent", Groups: []string{"sample-group"},
			Tool: "up__tool", ToolName: "tool", Upstream: "up", EvidenceClass: "spawn-measured",
			Annotations: DefaultAnnotations,
			Session:     Session{ID: "s", Calls: 1, ToolsUsed: []string{"up__tool"}},
			Time:        time.Unix(0, 0),
		}
		req, e, err := build(r)
		if err != nil {
			return err
		}
		for _, ent := range []cedar.Entity{e.agent, {UID: e.groups[0]}, e.tool, e.upstream} {
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
