package policy

import "testing"

// TestEntityCacheKeysDoNotCollide: the built principals and tools are
// cached by keys whose parts cannot run together: an agent whose name ends
// in NUL and a group name is not the agent of that name in that group.
func TestEntityCacheKeysDoNotCollide(t *testing.T) {
	b := load(t, "../../examples/policy/allow-list")
	tool := Request{Action: ActionCallTool, Tool: "db__drop", ToolName: "drop", Upstream: "db", EvidenceClass: "tls-pinned", Annotations: DefaultAnnotations}
	ops := tool
	ops.Agent, ops.Groups = "cert:CN=bob", []string{"ops", "staff"}
	if d := b.Decide(&ops); !d.Allow {
		t.Fatalf("ops member denied: %+v", d)
	}
	mallory := tool
	mallory.Agent, mallory.Groups = "cert:CN=bob\x00ops", []string{"staff"} // not in ops
	if d := b.Decide(&mallory); d.Allow {
		t.Fatalf("agent %q in group staff only was allowed by %v: decided as another principal", mallory.Agent, d.PolicyIDs)
	}
}
