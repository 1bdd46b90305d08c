package gateway

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// CodeKillSwitch is the JSON-RPC error code of a request refused because the
// operator engaged the kill switch. It is stable: agents may match on it.
const CodeKillSwitch = -32030

// KillSwitch makes every call fail closed while it is engaged. The zero
// value is disengaged and ready to use. Engaged is a single atomic load, so
// the call path can check it on every request.
type KillSwitch struct {
	state atomic.Pointer[killState]
}

type killState struct {
	since  time.Time
	actor  string
	reason string
}

// KillStatus is the switch's state as the admin endpoint reports it.
type KillStatus struct {
	Engaged bool      `json:"engaged"`
	Since   time.Time `json:"since,omitzero"`
	Actor   string    `json:"actor,omitzero"`
	Reason  string    `json:"reason,omitzero"`
}

// Engage stops all calls. It reports false if the switch was already
// engaged (the first engagement's time and reason are kept).
func (k *KillSwitch) Engage(actor, reason string) bool {
	return k.state.CompareAndSwap(nil, &killState{since: time.Now().UTC(), actor: actor, reason: reason})
}

// Clear lets calls through again. It reports false if the switch was not
// engaged.
func (k *KillSwitch) Clear() bool {
	return k.state.Swap(nil) != nil
}

// Engaged reports whether calls are stopped.
func (k *KillSwitch) Engaged() bool { return k.state.Load() != nil }

// Status returns the current state.
func (k *KillSwitch) Status() KillStatus {
	s := k.state.Load()
	if s == nil {
		return KillStatus{}
	}
	return KillStatus{Engaged: true, Since: s.since, Actor: s.actor, Reason: s.reason}
}

// Check returns nil while the switch is clear, and otherwise the JSON-RPC
// error (CodeKillSwitch) the agent receives. The operator's reason is not
// repeated to the agent.
func (k *KillSwitch) Check() error {
	s := k.state.Load()
	if s == nil {
		return nil
	}
	return &jsonrpc.Error{
		Code: CodeKillSwitch,
		Message: fmt.Sprintf("cmcp: the gateway's kill switch has been engaged by its operator since %s: "+
			"no call reaches any upstream until the operator clears it", s.since.Format(time.RFC3339)),
	}
}

// upstreamMethods are the MCP methods that reach an upstream, besides
// tools/call (which the call pipeline checks itself, so that its refusal is
// recorded as a call record).
var upstreamMethods = map[string]bool{
	"resources/read":        true,
	"resources/subscribe":   true,
	"resources/unsubscribe": true,
	"prompts/get":           true,
	"completion/complete":   true,
}

// Middleware refuses, while the switch is engaged, every request other than
// tools/call that would reach an upstream. Listing, ping and the handshake
// keep working, so an agent learns why its calls fail instead of timing out.
func (k *KillSwitch) Middleware() mcp.Middleware {
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if upstreamMethods[method] {
				if err := k.Check(); err != nil {
					return nil, err
				}
			}
			return next(ctx, method, req)
		}
	}
}
