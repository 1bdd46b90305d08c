package gateway

import (
	"time"
)

// Call outcomes, as they appear in the outcome label of cmcp_calls_total.
const (
	OutcomeOK            = "ok"             // the upstream answered with a result
	OutcomeIsError       = "is_error"       // the upstream answered with isError: true
	OutcomeUpstreamError = "upstream_error" // the upstream answered with a JSON-RPC error or died
	OutcomeGatewayFault  = "gateway_fault"  // the gateway failed the call: the audit log could not record it (-32063), or the upstream did not answer in time (-32066)
	OutcomeRefused       = "refused"        // not forwarded: policy, drift, unknown tool, invalid arguments, shutting down
	OutcomeKillSwitch    = "kill_switch"    // not forwarded: the operator's kill switch is engaged
	// OutcomeUpstreamUnavailable: not forwarded, the upstream could not
	// be started or reached (-32062: a binary that does not match its
	// pin, an exit at start, a TLS key that does not match, ...).
	OutcomeUpstreamUnavailable = "upstream_unavailable"
	// OutcomeCancelled: forwarded or about to be, then cancelled by the
	// agent or cut by its session's end (the result record says which).
	OutcomeCancelled = "cancelled"
)

// refusalOutcome is the outcome label of a call that was not forwarded
// and was answered with the gateway fault code: the label names the
// answer the agent got, so an audit log that could not record a refusal
// counts as gateway_fault whatever refused the call first.
func refusalOutcome(code int64) string {
	switch code {
	case CodeKillSwitch:
		return OutcomeKillSwitch
	case CodeUpstreamUnavailable:
		return OutcomeUpstreamUnavailable
	case CodeAuditUnavailable:
		return OutcomeGatewayFault
	}
	return OutcomeRefused
}

// DecisionNone is the decision label of cmcp_calls_total for a call refused
// before the policy was asked (kill switch, unknown tool, invalid
// arguments, shutting down): no policy denied it. The other values are the
// policy's decisions, "allow" and "deny".
const DecisionNone = "none"

// Metrics is where the core counts what it does (Options.Metrics):
// *metrics.Registry implements it. The values of the labels are the
// core's: DecisionNone and the policy's decisions, the Outcome constants,
// the session bound reached (httpfront.LimitTotal, LimitPerAgent).
type Metrics interface {
	// CallDone counts one finished tools/call; latency is the time the
	// gateway spent on it (zero for a call refused before forwarding).
	CallDone(upstream, decision, outcome string, latency time.Duration)
	// Decision counts one policy decision (allow/deny) in a policy mode.
	Decision(decision, mode string)
	// UpstreamHealth sets whether an upstream is available.
	UpstreamHealth(upstream string, up bool)
	// Spawn counts one attempt to start an upstream child, by result.
	Spawn(upstream, result string)
	// SessionRefused counts a new session refused at a bound.
	SessionRefused(limit string)
}
