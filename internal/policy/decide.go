package policy

import (
	"fmt"
	"slices"
	"strings"

	"github.com/cedar-policy/cedar-go"
)

// Mode says what the gateway does with a deny.
type Mode string

// The policy modes.
const (
	// Enforcing refuses a denied call with a JSON-RPC error naming the
	// determining policies. The default.
	Enforcing Mode = "enforcing"
	// Advisory records the deny and forwards the call.
	Advisory Mode = "advisory"
	// Silent records the decision and shows nothing to the agent.
	Silent Mode = "silent"
)

// ParseMode parses a mode name; the empty string is Enforcing.
func ParseMode(s string) (Mode, error) {
	switch Mode(s) {
	case "", Enforcing:
		return Enforcing, nil
	case Advisory, Silent:
		return Mode(s), nil
	}
	return "", fmt.Errorf("unknown policy mode %q (want enforcing, advisory or silent)", s)
}

// Decision is the outcome of one evaluation.
type Decision struct {
	Allow bool `json:"allow"`
	// PolicyIDs are the determining policies, in bundle order: the permits
	// that allowed, or the forbids that denied (including a forbid that could
	// not be evaluated). Empty for a default deny (no permit matched) and for
	// a request that could not be built.
	PolicyIDs []string `json:"policy_ids,omitempty"`
	// Errors are evaluation errors, "<policy id>: <message>", in bundle
	// order, and a request that could not be built (arguments past a limit).
	Errors []string `json:"errors,omitempty"`
	// Reason is one sentence for the agent and the operator.
	Reason string `json:"reason"`
}

// Decide evaluates the request against the bundle.
//
// Cedar skips a policy whose evaluation errors (for instance a string
// compared as a number). For a permit that is already fail-closed. For a
// forbid it would let a malformed argument slip past the rule meant to stop
// it, so Decide counts a forbid that errors as a forbid that matched: the
// call is denied and the forbid is among the determining policies.
func (b *Bundle) Decide(r *Request) Decision {
	use := allContext
	if b.use != nil {
		use = *b.use
	}
	use.types = b.argTypes
	req, ents, err := buildFor(r, use)
	if err != nil {
		return Decision{Errors: []string{err.Error()}, Reason: "denied: " + err.Error()}
	}
	dec, diag := cedar.Authorize(b.set, ents, req)
	var d Decision
	var errForbids []string
	for _, e := range diag.Errors {
		d.Errors = append(d.Errors, string(e.PolicyID)+": "+evalError(e.Message))
		if b.forbids[e.PolicyID] {
			errForbids = append(errForbids, string(e.PolicyID))
		}
	}
	for _, rs := range diag.Reasons {
		d.PolicyIDs = append(d.PolicyIDs, string(rs.PolicyID))
	}
	d.Allow = dec == cedar.Allow
	if len(errForbids) > 0 {
		if d.Allow {
			d.Allow = false
			d.PolicyIDs = nil
		}
		d.PolicyIDs = append(d.PolicyIDs, errForbids...)
	}
	d.PolicyIDs = b.sortIDs(d.PolicyIDs)
	slices.Sort(d.Errors)
	switch {
	case d.Allow:
		d.Reason = "permitted by " + strings.Join(d.PolicyIDs, ", ")
	case len(errForbids) > 0:
		d.Reason = "denied by " + strings.Join(d.PolicyIDs, ", ") + " (a forbid that cannot be evaluated counts as matching)"
	case len(d.PolicyIDs) > 0:
		d.Reason = "denied by " + strings.Join(d.PolicyIDs, ", ")
	default:
		d.Reason = "denied: no policy permits it (default deny)"
	}
	return d
}

// evalError is the text of a Cedar evaluation error as the decision (and
// so the call record) holds it. Cedar's messages name the policy's own
// attributes and types and the request's entities, except its integer
// overflows, which quote their operands ("integer overflow while
// attempting to multiply" and the two numbers): those may be argument
// values, which the call record holds only as a commitment, so the
// operands are cut.
func evalError(msg string) string {
	if strings.HasPrefix(msg, "integer overflow") {
		if i := strings.IndexByte(msg, '`'); i >= 0 {
			return strings.TrimSpace(msg[:i])
		}
	}
	return msg
}

func (b *Bundle) sortIDs(ids []string) []string {
	if len(ids) < 2 {
		return ids
	}
	slices.SortFunc(ids, func(x, y string) int { return b.index[x] - b.index[y] })
	return slices.Compact(ids)
}

// DependsOnArguments reports whether the decision for r may depend on its
// arguments: r is a call_tool and either the bundle checks the argument
// types its schema declares (argtypes.go), which it does at every call,
// whatever the tool, once some policy reads context.arguments, so a call
// to any tool that sends a declared argument with another type is denied;
// or some policy that reads context.arguments (or merely names
// "arguments") has a scope that matches r's principal, action and
// resource. When it is false, Decide gives the same answer whatever the
// arguments (other than arguments past the limits or not a JSON object,
// which deny with an "arguments: " error: replay reads the payload of a
// call recorded with one). Replay uses it to tell the calls it can check
// without the payloads from those it cannot: a decision it cannot make
// without them is reported as not replayable, never guessed.
func (b *Bundle) DependsOnArguments(r *Request) bool {
	if r.Action != ActionCallTool {
		return false
	}
	if b.argTypes != nil && len(b.argTypes.attrs) > 0 {
		return true
	}
	if empty(b.argScopes) {
		return false
	}
	// Scopes do not read the context.
	req, ents, err := buildScope(r)
	if err != nil {
		return true
	}
	dec, _ := cedar.Authorize(b.argScopes, ents, req)
	return dec == cedar.Allow
}

// DependsOnURI reports whether the decision for r (a read_resource) may
// depend on its URI: some policy that reads context.uri (or merely names
// "uri") has a scope that matches r's principal, action and resource. When
// it is false, Decide gives the same answer whatever the URI. Replay uses it
// to tell the resource reads it can check without the payload vault (the
// log holds only a commitment to the URI) from those it cannot.
func (b *Bundle) DependsOnURI(r *Request) bool {
	if r.Action != ActionReadResource || empty(b.uriScopes) {
		return false
	}
	req, ents, err := buildScope(r)
	if err != nil {
		return true
	}
	dec, _ := cedar.Authorize(b.uriScopes, ents, req)
	return dec == cedar.Allow
}

// empty reports whether ps holds no policy.
func empty(ps *cedar.PolicySet) bool {
	for range ps.All() {
		return false
	}
	return true
}
