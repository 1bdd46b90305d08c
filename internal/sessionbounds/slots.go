package sessionbounds

import (
	"fmt"
	"log/slog"
	"sync"
	"syscall"
)

// Which bound refused a session (Slots.Take): the metric's limit label.
const (
	LimitTotal    = "total"
	LimitPerAgent = "per_agent"
)

// Slots counts the HTTP front's open sessions, in all and per identity,
// against server.max_sessions and server.max_sessions_per_agent. A slot
// is taken before a session is created and given back when it ends (or,
// if no session came of its request, when the request is done), so that
// requests racing to open sessions cannot pass the bound together. The
// zero Slots is ready for use.
type Slots struct {
	mu    sync.Mutex
	total int
	per   map[string]int
	// released, if set, runs after a slot is given back.
	released func()
}

// Take reserves a slot for a new session of who. It returns the function
// that gives the slot back (once, however often it is called), or the
// bound that is reached (LimitTotal, LimitPerAgent) and how many sessions
// hold it.
func (ss *Slots) Take(who string, maxTotal, maxPer int) (release func(), limit string, open int) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	switch {
	case ss.per[who] >= maxPer:
		return nil, LimitPerAgent, ss.per[who]
	case ss.total >= maxTotal:
		return nil, LimitTotal, ss.total
	}
	if ss.per == nil {
		ss.per = map[string]int{}
	}
	ss.total++
	ss.per[who]++
	return sync.OnceFunc(func() {
		ss.mu.Lock()
		ss.total--
		if ss.per[who]--; ss.per[who] == 0 {
			delete(ss.per, who)
		}
		released := ss.released
		ss.mu.Unlock()
		if released != nil {
			released()
		}
	}), "", 0
}

// Open is how many slots are taken.
func (ss *Slots) Open() int {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.total
}

// OnRelease sets f to run after each slot is given back (the gateway's
// warm spares refill into the room).
func (ss *Slots) OnRelease(f func()) {
	ss.mu.Lock()
	ss.released = f
	ss.mu.Unlock()
}

// WarnFileLimit logs a warning when the process may open fewer files than
// maxSessions sessions could need with perSession per-session stdio
// upstreams (about four descriptors per child, one per connection), so an
// operator learns of it at start, not from a failing call.
func WarnFileLimit(logger *slog.Logger, maxSessions, perSession int) {
	var lim syscall.Rlimit
	if perSession == 0 || syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) != nil {
		return
	}
	need := uint64(maxSessions)*uint64(1+4*perSession) + 64
	if lim.Cur < need {
		logger.Warn(fmt.Sprintf("server.max_sessions (%d) with %d per-session stdio upstream(s) may need about %d file descriptors, more than this process may open (%d): raise the limit (ulimit -n, systemd LimitNOFILE=) or lower server.max_sessions",
			maxSessions, perSession, need, lim.Cur))
	}
}
