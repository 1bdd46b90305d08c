// Package upstream connects the gateway to the MCP servers behind it. A stdio
// upstream is a child process that the gateway spawns itself: it resolves the
// command, measures the bytes it is about to execute through the descriptor
// it executes (or a sealed memfd copy of them, with Sealed), refuses
// anything that does not match its pin, and then owns the child's whole life (environment, process group,
// parent-death signal, bounded stderr, strict stdout framing, SIGTERM then
// SIGKILL). Every upstream, whatever its transport, is reached through the
// Upstream interface and yields an MCP client session pinned to a protocol
// version that keeps logging, sampling and elicitation working through the
// gateway.
package upstream
