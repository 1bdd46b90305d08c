// Package faults holds the JSON-RPC error codes of the gateway's own
// faults and builds those errors, for every stage of the pipeline that
// answers an agent (the core, the router, the policy adapter, the relay
// to the agent). The codes are stable: agents and tests may rely on them,
// and docs/errors.md lists them. Upstream errors are passed through with
// their own codes.
package faults

import (
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// The gateway's fault codes.
const (
	UnknownTool         = -32060 // the tool is not in this gateway's catalog
	Denied              = -32061 // the policy denied the call
	UpstreamUnavailable = -32062 // the upstream could not be started or reached (digest mismatch, exit at start, ...)
	AuditUnavailable    = -32063 // the audit log could not record the call: refused, never run unrecorded
	KillSwitch          = -32064 // an operator engaged the kill switch
	ToolDrifted         = -32065 // the tool's definition no longer matches its pin
	UpstreamTimeout     = -32066 // the upstream did not answer within the per-call timeout
	UpstreamFailed      = -32067 // the upstream died or broke the protocol during the call
	ShuttingDown        = -32068 // the gateway is shutting down
	// ResourceNotFound answers resources/read when no upstream has the
	// resource (MCP's resource-not-found code).
	ResourceNotFound = -32002
	// NotRoutable: a request a shared stdio upstream sent to an agent
	// (sampling, elicitation, roots) while calls of several agent sessions
	// were in flight on it; nothing on a stdio server's request says which
	// call it belongs to, so it is sent to none rather than to a guess.
	NotRoutable = -32070
	// SessionEnded answers a call still running when its session ended
	// for another reason than the gateway's shutdown (which is
	// ShuttingDown): its idle timeout, its token withdrawn by SIGHUP, the
	// agent's HTTP DELETE or its closing the stdio connection. The call
	// was cancelled upstream.
	SessionEnded = -32071
)

// New is the gateway's fault with code: its message starts "cmcp: ".
func New(code int, format string, args ...any) *jsonrpc.Error {
	return &jsonrpc.Error{Code: int64(code), Message: "cmcp: " + fmt.Sprintf(format, args...)}
}
