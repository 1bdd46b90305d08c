package server

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"sync"
)

// Garbage collector settings of `cmcp serve` (see TuneGC).
const (
	ServeGCPercent = 300
	// ServeMemoryLimit is the soft memory limit while the live heap is
	// small; the limit rises with the live heap (see TuneGC).
	ServeMemoryLimit = 16 << 20
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
// few MiB; at the default GOGC=100 that is a collection every ten calls.
// GOGC=300 cut the gateway's CPU per call by about a quarter in
// scripts/bench.sh; a soft memory limit keeps the heap from growing to
// four times the live heap while that is small: with 8 sessions, 16 MiB
// took the peak RSS from about 37 to 31 MiB (BENCHMARKS.md). The limit
// is not fixed: after every collection it is raised to what the Go
// runtime holds besides the heap plus twice the live heap, when that is
// more, so a live heap near the limit (many sessions, large messages) is
// collected at most as often as GOGC=100 would, never continuously.
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
		hook.mu.Lock()
		hook.set = ServeMemoryLimit
		if !hook.armed {
			hook.armed = true
			armGCHook(ServeMemoryLimit)
		}
		hook.mu.Unlock()
	}
}

// hook is the state of the limit's adjustment: set is the limit it
// last set; one set by anyone else (debug.SetMemoryLimit) ends it.
var hook struct {
	mu    sync.Mutex
	armed bool
	set   int64
}

// gcSentinel is garbage whose finalizer runs after the collection that
// found it: large enough not to share a tiny-allocator block.
type gcSentinel struct {
	_ *byte
	_ [16]byte
}

// armGCHook has limitAfterGC run after the next collection, and again
// after each one after that.
func armGCHook(base int64) {
	s := &gcSentinel{}
	runtime.SetFinalizer(s, func(*gcSentinel) {
		hook.mu.Lock()
		defer hook.mu.Unlock()
		if debug.SetMemoryLimit(-1) != hook.set {
			hook.armed = false // someone else set it: theirs now
			return
		}
		hook.set = limitAfterGC(base)
		debug.SetMemoryLimit(hook.set)
		armGCHook(base)
	})
}

var gcSamples = []string{
	"/gc/heap/live:bytes",
	"/memory/classes/total:bytes",
	"/memory/classes/heap/objects:bytes",
	"/memory/classes/heap/unused:bytes",
	"/memory/classes/heap/free:bytes",
	"/memory/classes/heap/released:bytes",
}

// limitAfterGC is the soft memory limit after a collection: base, or
// the runtime's memory besides the heap (stacks, metadata) plus twice the
// live heap, whichever is more.
func limitAfterGC(base int64) int64 {
	s := make([]metrics.Sample, len(gcSamples))
	for i, n := range gcSamples {
		s[i].Name = n
	}
	metrics.Read(s)
	v := make([]int64, len(s))
	for i := range s {
		if s[i].Value.Kind() != metrics.KindUint64 {
			return base
		}
		v[i] = int64(s[i].Value.Uint64())
	}
	live, total := v[0], v[1]
	nonHeap := total - v[2] - v[3] - v[4] - v[5]
	return max(base, nonHeap+2*live)
}
