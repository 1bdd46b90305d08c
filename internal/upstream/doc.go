// Package upstream connects the gateway to the MCP servers behind it: stdio
// children that it measures and spawns itself, and Streamable HTTP servers
// that it dials with TLS pinned to their public key. Every upstream carries
// the evidence class of how it was identified.
package upstream
