// Package machines is how agents reach the machines of a tunnel upstream
// (machines that dialled in with cmcp connect): the gateway's own
// list_machines tool (its definition and its answer) and the machineId
// argument that routes a call to one machine (added to the schema of the
// upstream's tools, read and removed from a call's arguments). The call
// pipeline decides and records list_machines like any call.
package machines

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/confidential-mcp/cmcp/internal/rpcwire"
	"github.com/confidential-mcp/cmcp/internal/upstream"
)

// Argument is the argument of a tunnel upstream's tools that picks
// the machine a call goes to. The gateway reads it and removes it: the
// machine's server never sees it.
const Argument = "machineId"

// Route reads and removes arguments.machineId of a call to a tunnel
// upstream and picks its machine: the one named, or the only live one.
// why, if not empty, is the tool error the agent is answered with (a
// missing id with several machines live, an unknown id, none live): it
// lists the live machines.
func Route(t *upstream.Tunnel, args json.RawMessage) (out json.RawMessage, machine, why string) {
	out = args
	var id []byte
	found := false
	if bytes.Contains(args, []byte(Argument)) {
		b := make([]byte, 0, len(args))
		b = append(b, '{')
		ok := rpcwire.EachMember(args, func(name, value []byte) {
			if string(name) == Argument {
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
