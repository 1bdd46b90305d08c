package server

import (
	"math"
	"runtime"
	"runtime/debug"
	"testing"
	"time"
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
	// At least the base limit: a collection meanwhile may have raised it
	// for this test binary's live heap.
	if got := debug.SetMemoryLimit(math.MaxInt64); got < ServeMemoryLimit || got == math.MaxInt64 {
		t.Errorf("memory limit = %d, want %d or more (and a limit)", got, ServeMemoryLimit)
	}

	// The operator's choice wins.
	TuneGC([]string{"GOGC=50", "GOMEMLIMIT=1GiB"})
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("GOGC set: GC percent changed to %d", got)
	}
	runtime.GC() // the adjustment, if armed, sees a limit it did not set and stops
	runtime.GC()
	if got := debug.SetMemoryLimit(math.MaxInt64); got != math.MaxInt64 {
		t.Errorf("GOMEMLIMIT set: memory limit changed to %d", got)
	}
}

// TestServeMemoryLimitFollowsTheLiveHeap: the soft memory limit of a
// serving gateway rises above a live heap that outgrows it (to twice the
// live heap and the runtime's other memory), so a large live heap is not
// collected continuously, and comes back to ServeMemoryLimit once the heap
// is small again.
func TestServeMemoryLimitFollowsTheLiveHeap(t *testing.T) {
	prevPct := debug.SetGCPercent(100)
	prevLim := debug.SetMemoryLimit(math.MaxInt64)
	t.Cleanup(func() {
		debug.SetGCPercent(prevPct)
		debug.SetMemoryLimit(prevLim)
	})
	TuneGC([]string{"PATH=/bin"})
	const big = 48 << 20
	live := make([]byte, big)
	for i := range live {
		live[i] = 1
	}
	waitLimit(t, "with a 48 MiB live heap", func(l int64) bool { return l >= 2*big })
	runtime.KeepAlive(live)
	live = nil
	waitLimit(t, "once the heap is small again", func(l int64) bool { return l < 2*big })
	if l := debug.SetMemoryLimit(-1); l < ServeMemoryLimit {
		t.Errorf("limit %d below the base %d", l, ServeMemoryLimit)
	}
}

// waitLimit collects until the memory limit satisfies ok (the adjustment
// runs in a finalizer, after a collection).
func waitLimit(t *testing.T, when string, ok func(int64) bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		runtime.GC()
		l := debug.SetMemoryLimit(-1)
		if ok(l) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the memory limit stayed %d MiB", when, l>>20)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
