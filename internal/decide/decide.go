// Package decide is the policy stage of the pipeline: how a request
// becomes a Cedar decision and what follows from it. It holds the
// decision seam of the call pipeline (Decider, Decision, ListFilter,
// AllowAll), its Cedar implementation (Cedar: a tools/call as a Cedar
// request, tools/list filtered by list_tools), the denied fault agents
// are answered with, and the gate of resource, prompt and completion
// requests (Gate: decided, recorded durably before anything is
// forwarded). It reaches the gateway only through GateCore and
// GateSession.
package decide

import (
	"context"
	"encoding/json"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// Policy modes a Decision can carry. ModeNone is the gateway's own default
// (no policy configured: every call is allowed, and recorded as such).
const (
	ModeNone      = "none"
	ModeEnforcing = "enforcing"
	ModeAdvisory  = "advisory"
	ModeSilent    = "silent"
)

// SessionInfo describes the agent session a request belongs to.
type SessionInfo struct {
	ID            string
	Front         string // "http" or "stdio"
	ClientName    string
	ClientVersion string
	// Groups are the groups the agent's credential names (an OAuth
	// token's groups claim): Cedar Group parents beside policy.groups.
	Groups []string
}

// DecisionRequest is what a Decider is asked about one tools/call.
type DecisionRequest struct {
	Principal     string          // authenticated agent identity
	Tool          string          // exposed tool name
	UpstreamTool  string          // the upstream's own tool name
	Upstream      string          // upstream name
	EvidenceClass string          // the upstream's evidence class
	Machine       string          // the tunnel machine the call is routed to; empty for other upstreams
	Args          json.RawMessage // arguments as the agent sent them
	Session       SessionInfo
	// Annotations are the tool's pinned annotations; nil when the tool's
	// definition is not known yet (its upstream could not be started).
	Annotations *mcp.ToolAnnotations
}

// Decision is a Decider's answer. Its fields go into the call record as they
// are. A call is refused when Effect is "deny" and Mode is "enforcing" (or
// any mode other than advisory and silent, which record and forward).
type Decision struct {
	Effect    string   // "allow" or "deny"
	PolicyIDs []string // the policies that determined the effect
	Mode      string   // ModeNone, ModeEnforcing, ModeAdvisory, ModeSilent
	Bundle    digest.Digest
	Reason    string // shown to the agent on a refusal
	// Input is what the decision used beyond the request, recorded in the
	// call record for replay (nil for AllowAll).
	Input *record.PolicyInput
}

// Refuses reports whether the decision stops the call.
func (d Decision) Refuses() bool {
	return d.Effect != "allow" && d.Mode != ModeAdvisory && d.Mode != ModeSilent
}

// Decider decides every tools/call. The policy engine implements it; the
// gateway's default is AllowAll. An error refuses the call (fail closed).
type Decider interface {
	Decide(ctx context.Context, req DecisionRequest) (Decision, error)
}

// AllowAll is the decider used when no policy is configured: it allows every
// call and says so in the call record (mode "none", decision "allow").
type AllowAll struct{}

// Decide implements Decider.
func (AllowAll) Decide(context.Context, DecisionRequest) (Decision, error) {
	return Decision{Effect: "allow", Mode: ModeNone}, nil
}

// ListFilter chooses which tools an agent sees in tools/list. The policy
// engine implements it (action list_tools); nil shows every catalog tool.
// Filtering the list never replaces deciding the call.
type ListFilter interface {
	FilterTools(ctx context.Context, principal string, session SessionInfo, tools []*mcp.Tool) []*mcp.Tool
}
