package gateway

import (
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/confidential-mcp/cmcp/internal/front/httpfront"
	"github.com/confidential-mcp/cmcp/internal/route"
)

// JSON-RPC error codes of gateway faults. They are stable: agents and tests
// may rely on them. Upstream errors are passed through with their own codes.
const (
	CodeUnknownTool         = -32060                        // the tool is not in this gateway's catalog
	CodeDenied              = -32061                        // the policy denied the call
	CodeUpstreamUnavailable = route.CodeUpstreamUnavailable // the upstream could not be started or reached (digest mismatch, exit at start, ...)
	CodeAuditUnavailable    = -32063                        // the audit log could not record the call: refused, never run unrecorded
	CodeKillSwitch          = -32064                        // an operator engaged the kill switch
	CodeToolDrifted         = -32065                        // the tool's definition no longer matches its pin
	CodeUpstreamTimeout     = -32066                        // the upstream did not answer within the per-call timeout
	CodeUpstreamFailed      = route.CodeUpstreamFailed      // the upstream died or broke the protocol during the call
	CodeShuttingDown        = -32068                        // the gateway is shutting down
	CodeTooManySessions     = httpfront.CodeTooManySessions // a session bound is reached (HTTP 429 for the agent's own, 503 for the gateway's)
	// CodeResourceNotFound answers resources/read when no upstream has the
	// resource (MCP's resource-not-found code).
	CodeResourceNotFound = route.CodeResourceNotFound
	// CodeNotRoutable: a request a shared stdio upstream sent to an agent
	// (sampling, elicitation, roots) while calls of several agent sessions
	// were in flight on it; nothing on a stdio server's request says which
	// call it belongs to, so it is sent to none rather than to a guess.
	CodeNotRoutable = -32070
	// CodeSessionEnded answers a call still running when its session
	// ended for another reason than the gateway's shutdown (which is
	// CodeShuttingDown): its idle timeout, its token withdrawn by SIGHUP,
	// the agent's HTTP DELETE or its closing the stdio connection. The
	// call was cancelled upstream.
	CodeSessionEnded = -32071
)

func fault(code int, format string, args ...any) *jsonrpc.Error {
	return &jsonrpc.Error{Code: int64(code), Message: "cmcp: " + fmt.Sprintf(format, args...)}
}

// joinReason joins two parts of a record's reason.
func joinReason(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}
