package gateway

import (
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/confidential-mcp/cmcp/internal/faults"
	"github.com/confidential-mcp/cmcp/internal/front/httpfront"
)

// JSON-RPC error codes of gateway faults (internal/faults). They are
// stable: agents and tests may rely on them. Upstream errors are passed
// through with their own codes.
const (
	CodeUnknownTool         = faults.UnknownTool
	CodeDenied              = faults.Denied
	CodeUpstreamUnavailable = faults.UpstreamUnavailable
	CodeAuditUnavailable    = faults.AuditUnavailable
	CodeKillSwitch          = faults.KillSwitch
	CodeToolDrifted         = faults.ToolDrifted
	CodeUpstreamTimeout     = faults.UpstreamTimeout
	CodeUpstreamFailed      = faults.UpstreamFailed
	CodeShuttingDown        = faults.ShuttingDown
	CodeTooManySessions     = httpfront.CodeTooManySessions // a session bound is reached (HTTP 429 for the agent's own, 503 for the gateway's)
	CodeResourceNotFound    = faults.ResourceNotFound
	CodeNotRoutable         = faults.NotRoutable
	CodeSessionEnded        = faults.SessionEnded
)

func fault(code int, format string, args ...any) *jsonrpc.Error {
	return faults.New(code, format, args...)
}

// joinReason joins two parts of a record's reason.
func joinReason(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}
