package server

import (
	"math"
	"runtime/debug"
	"testing"
)

func TestTuneGC(t *testing.T) {
	prevPct := debug.SetGCPercent(100)
	prevLim := debug.SetMemoryLimit(math.MaxInt64)
	t.Cleanup(func() {
		debug.SetGCPercent(prevPct)
		debug.SetMemoryLimit(prevLim)
	})

	TuneGC([]string{"PATH=/bin"})
	if got := debug.SetGCPercent(100); got != ServeGCPercent {
		t.Errorf("GC percent = %d, want %d", got, ServeGCPercent)
	}
	if got := debug.SetMemoryLimit(math.MaxInt64); got != ServeMemoryLimit {
		t.Errorf("memory limit = %d, want %d", got, ServeMemoryLimit)
	}

	// The operator's choice wins.
	TuneGC([]string{"GOGC=50", "GOMEMLIMIT=1GiB"})
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("GOGC set: GC percent changed to %d", got)
	}
	if got := debug.SetMemoryLimit(math.MaxInt64); got != math.MaxInt64 {
		t.Errorf("GOMEMLIMIT set: memory limit changed to %d", got)
	}
}
