package server

import (
	"runtime/debug"
	"strings"
)

// Garbage collector settings of `cmcp serve` (see TuneGC).
const (
	ServeGCPercent   = 300
	ServeMemoryLimit = 24 << 20
)

// TuneGC sets the garbage collector for a serving gateway, unless the
// operator chose settings through GOGC or GOMEMLIMIT in environ.
//
// Every MCP message the go-sdk decodes allocates a fresh 32 KiB read buffer
// (its JSON decoder's minimum). cmcp's own stdio transports decode without
// it (internal/rpcwire), but the go-sdk still decodes each call four
// (serve --stdio) to seven (Streamable HTTP) times in the gateway — the
// front end's request and _meta, the upstream client's result twice — so
// a call leaves ~150–250 KiB of short-lived garbage over a live heap of a
// few MiB; at the default GOGC=100 that is a collection every ten calls. GOGC=300 with a 24 MiB soft memory limit cut the gateway's CPU per
// call by about a quarter in scripts/bench.sh (stdio and HTTP upstreams,
// interval durability), at a peak RSS of about 35 MiB with 8 sessions. The
// limit is soft: a larger live heap (big messages) is still served, with
// more frequent collection.
func TuneGC(environ []string) {
	var gogc, memlimit bool
	for _, kv := range environ {
		gogc = gogc || strings.HasPrefix(kv, "GOGC=")
		memlimit = memlimit || strings.HasPrefix(kv, "GOMEMLIMIT=")
	}
	if !gogc {
		debug.SetGCPercent(ServeGCPercent)
	}
	if !memlimit {
		debug.SetMemoryLimit(ServeMemoryLimit)
	}
}
