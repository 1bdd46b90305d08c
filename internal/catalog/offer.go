package catalog

import (
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// An Offer is what the gateway offers agents besides its tools: the
// capabilities and instructions of its upstreams, merged. The zero Offer
// is not ready for use: make one with NewOffer.
type Offer struct {
	caps         *mcp.ServerCapabilities
	instructions []string
	single       bool // one upstream: its instructions are not prefixed
}

// NewOffer starts the offer of a gateway with upstreams upstreams: tools
// (which change) and logging, whatever the upstreams declare.
func NewOffer(upstreams int) *Offer {
	//lint:ignore SA1019 go-sdk deprecates MCP logging (SEP-2577) with no replacement; clients still use it
	caps := &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{ListChanged: true}, Logging: &mcp.LoggingCapabilities{}}
	return &Offer{caps: caps, single: upstreams == 1}
}

// Add merges what upstream name declared when it was initialised (init,
// nil if it has not been): its instructions, prefixed with its name unless
// it is the only upstream, and its prompts, resources (and their
// subscriptions) and completions, which the gateway forwards. Prompts and
// resources are offered as changing: the set of upstreams serving them can.
func (o *Offer) Add(name string, init *mcp.InitializeResult) {
	if init == nil {
		return
	}
	if init.Instructions != "" {
		if o.single {
			o.instructions = append(o.instructions, init.Instructions)
		} else {
			o.instructions = append(o.instructions, fmt.Sprintf("Upstream %q (tools prefixed %s%s): %s", name, name, Separator, init.Instructions))
		}
	}
	uc := init.Capabilities
	if uc == nil {
		return
	}
	if uc.Prompts != nil {
		if o.caps.Prompts == nil {
			o.caps.Prompts = &mcp.PromptCapabilities{}
		}
		o.caps.Prompts.ListChanged = true
	}
	if uc.Resources != nil {
		if o.caps.Resources == nil {
			o.caps.Resources = &mcp.ResourceCapabilities{}
		}
		o.caps.Resources.ListChanged = true
		o.caps.Resources.Subscribe = o.caps.Resources.Subscribe || uc.Resources.Subscribe
	}
	if uc.Completions != nil {
		o.caps.Completions = &mcp.CompletionCapabilities{}
	}
}

// Capabilities are the merged capabilities.
func (o *Offer) Capabilities() *mcp.ServerCapabilities { return o.caps }

// Instructions are the merged instructions, one paragraph an upstream.
func (o *Offer) Instructions() string { return strings.Join(o.instructions, "\n\n") }
