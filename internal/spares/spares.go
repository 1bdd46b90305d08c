// Package spares keeps warm spares: a bounded number of values (upstream
// connections, started, measured and initialised) made ahead of demand,
// each handed out at most once and never taken back, and refilled in the
// background. A spare that went bad while it waited is dropped rather
// than handed out; a drain (a configuration reload, a pin change) drops
// every spare, including those still being made, so nothing made under
// the old terms is handed out under the new ones.
package spares

import (
	"context"
	"sync"
	"time"
)

// Funcs are what a Pool does with its values.
type Funcs[T any] struct {
	// Make makes one spare. It must give up when ctx ends.
	Make func(ctx context.Context) (T, error)
	// Drop disposes of a spare that is not handed out, saying why.
	Drop func(v T, reason string)
	// Unusable, if set, says why a ready spare may no longer be handed
	// out (a child that exited while it waited, whose file changed), or
	// is "".
	Unusable func(v T) string
	// Reserve, if set, takes room for one more spare in the bounds of what
	// spares stand for (sessions, children), or reports false: none is
	// made then. Release gives the room back once the spare is handed
	// out or dropped, or its Make failed.
	Reserve func() bool
	Release func()
	// RefillAfter, if set, delays the replacement of a spare Take hands
	// out by up to that long, unless Fill is called first (by the taker,
	// once its first use of the spare is over): made at once, the
	// replacement competes for the CPU with that first use.
	RefillAfter time.Duration
}

// Backoff bounds of the refill after a failed Make: the first retry waits
// FirstRetry, each further failure twice as long, up to MaxRetry.
const (
	FirstRetry = time.Second
	MaxRetry   = 30 * time.Second
)

// Pool holds up to n ready spares.
type Pool[T any] struct {
	n  int
	fn Funcs[T]

	ctx    context.Context // ends at Close: cuts spares being made
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	ready   []T
	making  int    // Makes running
	gen     uint64 // bumped by Drain: a Make of an older generation is dropped
	closed  bool
	retryAt time.Time // no Make before (after a failure)
	delay   time.Duration
	timer   *time.Timer
}

// New returns a pool of n spares (n > 0) and starts filling it.
func New[T any](n int, fn Funcs[T]) *Pool[T] {
	ctx, cancel := context.WithCancel(context.Background())
	p := &Pool[T]{n: n, fn: fn, ctx: ctx, cancel: cancel}
	p.Fill()
	return p
}

// Take hands out the oldest ready spare, if any (never one it handed out
// before), and starts making its replacement: at once if there was none,
// else by Funcs.RefillAfter at the latest.
func (p *Pool[T]) Take() (T, bool) {
	v, ok := p.take()
	if ok && p.fn.RefillAfter > 0 {
		time.AfterFunc(p.fn.RefillAfter, p.Fill)
	} else {
		p.Fill()
	}
	return v, ok
}

func (p *Pool[T]) take() (T, bool) {
	for {
		p.mu.Lock()
		if len(p.ready) == 0 || p.closed {
			p.mu.Unlock()
			var zero T
			return zero, false
		}
		v := p.ready[0]
		var zero T
		p.ready[0] = zero
		p.ready = p.ready[1:]
		p.mu.Unlock()
		p.release()
		why := ""
		if p.fn.Unusable != nil {
			why = p.fn.Unusable(v)
		}
		if why == "" {
			return v, true
		}
		p.fn.Drop(v, "the warm spare was not handed out: "+why)
	}
}

// Ready is the number of spares ready to be handed out.
func (p *Pool[T]) Ready() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.ready)
}

// Fill starts making spares until n are ready or being made, unless a
// failed Make is being backed off from or Room says no.
func (p *Pool[T]) Fill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	if wait := time.Until(p.retryAt); wait > 0 {
		if p.timer == nil {
			p.timer = time.AfterFunc(wait, func() {
				p.mu.Lock()
				p.timer = nil
				p.mu.Unlock()
				p.Fill()
			})
		}
		return
	}
	for len(p.ready)+p.making < p.n {
		if p.fn.Reserve != nil && !p.fn.Reserve() {
			return
		}
		p.making++
		gen := p.gen
		p.wg.Add(1)
		go p.make(gen)
	}
}

func (p *Pool[T]) make(gen uint64) {
	defer p.wg.Done()
	v, err := p.fn.Make(p.ctx)
	p.mu.Lock()
	p.making--
	if err != nil || p.closed || gen != p.gen {
		p.release()
	}
	switch {
	case err != nil:
		if p.delay == 0 {
			p.delay = FirstRetry
		} else {
			p.delay = min(2*p.delay, MaxRetry)
		}
		p.retryAt = time.Now().Add(p.delay)
		p.mu.Unlock()
		p.Fill() // schedules the retry
		return
	case p.closed:
		p.mu.Unlock()
		p.fn.Drop(v, "the gateway is stopping")
		return
	case gen != p.gen:
		p.mu.Unlock()
		p.fn.Drop(v, "made before the configuration changed")
		p.Fill()
		return
	}
	p.delay, p.retryAt = 0, time.Time{}
	p.ready = append(p.ready, v)
	p.mu.Unlock()
}

// Drain drops every ready spare with reason; spares being made are
// dropped when they are done. The pool then fills again.
func (p *Pool[T]) Drain(reason string) {
	p.mu.Lock()
	old := p.ready
	p.ready = nil
	p.gen++
	p.delay, p.retryAt = 0, time.Time{}
	p.mu.Unlock()
	for _, v := range old {
		p.release()
		p.fn.Drop(v, reason)
	}
	p.Fill()
}

func (p *Pool[T]) release() {
	if p.fn.Release != nil {
		p.fn.Release()
	}
}

// Close drops every spare with reason, cuts those being made and waits
// for them. Nothing is handed out or made afterwards.
func (p *Pool[T]) Close(reason string) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.wg.Wait()
		return
	}
	p.closed = true
	old := p.ready
	p.ready = nil
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
	p.mu.Unlock()
	p.cancel()
	for _, v := range old {
		p.release()
		p.fn.Drop(v, reason)
	}
	p.wg.Wait()
}
