package credential

import (
	"errors"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/confidential-mcp/cmcp/internal/faults"
)

// Fault is the answer to an agent whose call err refused because its
// identity has to sign in at the upstream's authorization server first
// (an *AuthorizationRequiredError): the MCP URL elicitation (-32042) if
// urlMode (the agent's client declared URL elicitation), else the
// gateway's upstream-unavailable fault, whose message names the sign-in
// link. Nil if err is not that.
func Fault(err error, urlMode bool) *jsonrpc.Error {
	var ar *AuthorizationRequiredError
	if !errors.As(err, &ar) {
		return nil
	}
	if urlMode {
		var je *jsonrpc.Error
		if errors.As(ar.Elicitation(), &je) {
			// The message (also the call record's reason) without the
			// link, which only the elicitation carries.
			e := *je
			e.Message = fmt.Sprintf("upstream %q: %s has to sign in at the upstream's authorization server first; a URL elicitation with the sign-in link was sent", ar.Upstream, ar.Identity)
			return &e
		}
	}
	return faults.New(faults.UpstreamUnavailable, "%v", ar)
}
