package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/confidential-mcp/cmcp/internal/rpcwire"
	"github.com/confidential-mcp/cmcp/internal/upstream"
)

// MachineArgument is the argument of a tunnel upstream's tools that picks
// the machine a call goes to. The gateway reads it and removes it: the
// machine's server never sees it.
const MachineArgument = "machineId"

// routeMachine reads and removes arguments.machineId of a call to a tunnel
// upstream and picks its machine: the one named, or the only live one.
// why, if not empty, is the tool error the agent is answered with (a
// missing id with several machines live, an unknown id, none live): it
// lists the live machines.
func routeMachine(t *upstream.Tunnel, args json.RawMessage) (out json.RawMessage, machine, why string) {
	out = args
	var id []byte
	found := false
	if bytes.Contains(args, []byte(MachineArgument)) {
		b := make([]byte, 0, len(args))
		b = append(b, '{')
		ok := rpcwire.EachMember(args, func(name, value []byte) {
			if string(name) == MachineArgument {
				id, found = value, true
				return
			}
			if len(b) > 1 {
				b = append(b, ',')
			}
			b = append(append(append(append(b, '"'), name...), `":`...), value...)
		})
		if !ok {
			return nil, "", "the arguments' member names hold escape sequences, so machineId cannot be read with certainty; send them without escapes"
		}
		out = append(b, '}')
	}
	live := t.LiveMachines()
	list := "none is connected"
	if len(live) > 0 {
		list = "live machines: " + strings.Join(live, ", ")
	}
	if found {
		var s string
		if err := json.Unmarshal(id, &s); err != nil || s == "" {
			return nil, "", fmt.Sprintf("machineId must be a machine id string; %s", list)
		}
		if !slices.Contains(live, s) {
			return nil, s, fmt.Sprintf("machine %q of upstream %q is not connected; %s", s, t.Name(), list)
		}
		return out, s, ""
	}
	switch len(live) {
	case 0:
		return nil, "", fmt.Sprintf("upstream %q has no machine connected; start `cmcp connect` on a machine that serves it", t.Name())
	case 1:
		return out, live[0], ""
	}
	return nil, "", fmt.Sprintf("upstream %q runs on several machines: give the machineId argument; %s", t.Name(), list)
}

// toolError is a tools/call result with isError and text.
func toolError(text string) json.RawMessage {
	b, _ := json.Marshal(map[string]any{"content": []any{map[string]string{"type": "text", "text": "cmcp: " + text}}, "isError": true})
	return b
}

// toolAnswer is admit's way to answer a call with a tool result (already
// recorded as refused) instead of a fault.
type toolAnswer struct{ raw json.RawMessage }

func (a *toolAnswer) Error() string { return "answered as a tool error" }
