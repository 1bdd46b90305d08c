package spares

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// ledger records what a pool made and dropped.
type ledger struct {
	mu      sync.Mutex
	made    int
	dropped map[int]string
	dead    map[int]bool
}

func (l *ledger) funcs(gate <-chan struct{}) Funcs[int] {
	l.dropped, l.dead = map[int]string{}, map[int]bool{}
	return Funcs[int]{
		Make: func(ctx context.Context) (int, error) {
			if gate != nil {
				select {
				case <-gate:
				case <-ctx.Done():
					return 0, ctx.Err()
				}
			}
			l.mu.Lock()
			defer l.mu.Unlock()
			l.made++
			return l.made, nil
		},
		Drop: func(v int, reason string) {
			l.mu.Lock()
			defer l.mu.Unlock()
			if _, twice := l.dropped[v]; twice {
				panic("dropped twice")
			}
			l.dropped[v] = reason
		},
		Unusable: func(v int) string {
			l.mu.Lock()
			defer l.mu.Unlock()
			if l.dead[v] {
				return "it ended"
			}
			return ""
		},
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestSparesAreHandedOutOnceAndRefilled: a pool of 2 makes 2, hands each
// out once (never again), makes a replacement for each taken, and never
// holds more than 2.
func TestSparesAreHandedOutOnceAndRefilled(t *testing.T) {
	var l ledger
	p := New(2, l.funcs(nil))
	defer p.Close("test done")
	waitFor(t, "2 ready", func() bool { return p.Ready() == 2 })
	seen := map[int]bool{}
	for range 10 {
		waitFor(t, "a spare", func() bool { return p.Ready() > 0 })
		v, ok := p.Take()
		if !ok {
			t.Fatal("no spare")
		}
		if seen[v] {
			t.Fatalf("spare %d handed out twice", v)
		}
		seen[v] = true
		if n := p.Ready(); n > 2 {
			t.Fatalf("%d ready, bound 2", n)
		}
	}
	waitFor(t, "refilled", func() bool { return p.Ready() == 2 })
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.made != 12 {
		t.Fatalf("made %d, want 12 (10 taken, 2 ready)", l.made)
	}
}

// TestSpareThatEndedIsNotHandedOut: a spare that went bad while it waited
// is dropped, with the reason, and the next one handed out.
func TestSpareThatEndedIsNotHandedOut(t *testing.T) {
	var l ledger
	p := New(2, l.funcs(nil))
	defer p.Close("test done")
	waitFor(t, "2 ready", func() bool { return p.Ready() == 2 })
	l.mu.Lock()
	l.dead[1], l.dead[2] = true, true
	l.mu.Unlock()
	if v, ok := p.Take(); ok {
		t.Fatalf("took %d, which ended", v)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dropped[1] == "" || l.dropped[2] == "" {
		t.Fatalf("dropped %v", l.dropped)
	}
}

// TestDrainDropsSparesMadeBeforeIt: a drain (a reload) drops the ready
// spares and one still being made when it came, so only spares made after
// it are handed out.
func TestDrainDropsSparesMadeBeforeIt(t *testing.T) {
	var l ledger
	gate := make(chan struct{})
	p := New(1, l.funcs(gate))
	defer p.Close("test done")
	gate <- struct{}{} // the first is made
	waitFor(t, "1 ready", func() bool { return p.Ready() == 1 })
	v, _ := p.Take() // its replacement is now waiting at the gate
	if v != 1 {
		t.Fatalf("took %d", v)
	}
	p.Drain("configuration reloaded")
	gate <- struct{}{} // the old generation's spare: dropped
	gate <- struct{}{} // the new one's: kept
	waitFor(t, "1 ready", func() bool { return p.Ready() == 1 })
	v, _ = p.Take()
	l.mu.Lock()
	defer l.mu.Unlock()
	if v != 3 || l.dropped[2] == "" {
		t.Fatalf("took %d, dropped %v; want 3 taken and 2 dropped", v, l.dropped)
	}
}

// TestSparesAreCountedInTheirBounds: no spare is made without room in
// the bound (Reserve), and the room is given back when a spare is handed
// out or dropped.
func TestSparesAreCountedInTheirBounds(t *testing.T) {
	var l ledger
	var mu sync.Mutex
	used, bound := 0, 0
	fn := l.funcs(nil)
	fn.Reserve = func() bool {
		mu.Lock()
		defer mu.Unlock()
		if used >= bound {
			return false
		}
		used++
		return true
	}
	fn.Release = func() {
		mu.Lock()
		defer mu.Unlock()
		used--
	}
	p := New(3, fn)
	defer p.Close("test done")
	time.Sleep(50 * time.Millisecond)
	if p.Ready() != 0 {
		t.Fatal("a spare was made without room")
	}
	mu.Lock()
	bound = 2
	mu.Unlock()
	p.Fill()
	waitFor(t, "2 ready", func() bool { return p.Ready() == 2 })
	time.Sleep(50 * time.Millisecond)
	if p.Ready() != 2 {
		t.Fatalf("%d ready with room for 2", p.Ready())
	}
	mu.Lock()
	bound = 0 // sessions took the room: no refill
	mu.Unlock()
	p.Take()
	p.Drain("reload")
	mu.Lock()
	defer mu.Unlock()
	if used != 0 {
		t.Fatalf("%d reservations held after every spare left", used)
	}
}

// TestFailedMakeBacksOff: a Make that fails is retried after FirstRetry,
// not in a loop.
func TestFailedMakeBacksOff(t *testing.T) {
	var calls atomic.Int32
	p := New(1, Funcs[int]{
		Make: func(context.Context) (int, error) {
			calls.Add(1)
			return 0, errors.New("upstream down")
		},
		Drop: func(int, string) {},
	})
	defer p.Close("test done")
	time.Sleep(300 * time.Millisecond)
	if n := calls.Load(); n != 1 {
		t.Fatalf("%d attempts within 300ms, want 1 (retry after %v)", n, FirstRetry)
	}
}

// TestCloseDropsAndCutsSpares: Close drops the ready spares, cuts the one
// being made (its Make's context ends) and waits for it.
func TestCloseDropsAndCutsSpares(t *testing.T) {
	var l ledger
	gate := make(chan struct{})
	p := New(2, l.funcs(gate))
	gate <- struct{}{}
	waitFor(t, "1 ready", func() bool { return p.Ready() == 1 })
	p.Close("stopping")
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dropped[1] != "stopping" || l.made != 1 {
		t.Fatalf("made %d, dropped %v", l.made, l.dropped)
	}
	if _, ok := p.Take(); ok {
		t.Fatal("took a spare after Close")
	}
}

// TestRefillWaitsForTheTaker: with RefillAfter, taking a spare does not
// start its replacement (which would compete for the CPU with the spare's
// first use): the taker's Fill does, or RefillAfter. Without a ready
// spare, Take starts one at once.
func TestRefillWaitsForTheTaker(t *testing.T) {
	var l ledger
	fn := l.funcs(nil)
	fn.RefillAfter = time.Hour
	p := New(2, fn)
	defer p.Close("test done")
	waitFor(t, "2 ready", func() bool { return p.Ready() == 2 })
	making := func() int {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.making + len(p.ready)
	}
	if _, ok := p.Take(); !ok {
		t.Fatal("no spare")
	}
	if n := making(); n != 1 {
		t.Fatalf("%d spares ready or being made right after a Take, want 1: the replacement did not wait", n)
	}
	p.Fill() // the taker's first use is over
	waitFor(t, "the replacement", func() bool { return p.Ready() == 2 })
	for range 2 {
		if _, ok := p.Take(); !ok {
			t.Fatal("no spare")
		}
	}
	if _, ok := p.Take(); ok {
		t.Fatal("a third spare out of a pool of 2 with no refill")
	}
	if n := making(); n == 0 {
		t.Fatal("a Take that found no spare did not start one")
	}
}
