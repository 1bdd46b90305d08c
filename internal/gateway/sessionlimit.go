package gateway

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"syscall"
)

// sessionSlots counts the HTTP front's open sessions, in all and per
// identity, against server.max_sessions and server.max_sessions_per_agent.
// A slot is taken before a session is created and given back when it ends
// (or, if no session came of its request, when the request is done), so
// that requests racing to open sessions cannot pass the bound together.
type sessionSlots struct {
	mu    sync.Mutex
	total int
	per   map[string]int
	// released, if set, runs after a slot is given back (warm spares
	// refill into the room).
	released func()
}

// Which bound refused a session: the metric's limit label.
const (
	limitTotal    = "total"
	limitPerAgent = "per_agent"
)

// take reserves a slot for a new session of who. It returns the function
// that gives the slot back (once, however often it is called), or the
// bound that is reached and how many sessions hold it.
func (ss *sessionSlots) take(who string, maxTotal, maxPer int) (release func(), limit string, open int) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	switch {
	case ss.per[who] >= maxPer:
		return nil, limitPerAgent, ss.per[who]
	case ss.total >= maxTotal:
		return nil, limitTotal, ss.total
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

// refuseSession answers a request that would open a session past a bound:
// 429 when it is the agent's own bound, 503 when it is the gateway's, with
// a JSON-RPC error saying what to do. It is logged (at most once a second,
// with a count) and counted in cmcp_sessions_refused_total. inherited: the
// bound per agent is unset and so is server.max_sessions (SessionBounds),
// which the operator must raise to raise it.
func (g *Gateway) refuseSession(w http.ResponseWriter, r *http.Request, who, limit string, open int, idle string, inherited bool, warn *everySecond) {
	status, code := http.StatusTooManyRequests, CodeTooManySessions
	why := fmt.Sprintf("agent %q already has as many open sessions as server.max_sessions_per_agent allows (%d): end the sessions you no longer use (HTTP DELETE with their Mcp-Session-Id; %s), or ask the gateway's operator to raise server.max_sessions_per_agent", who, open, idle)
	if inherited {
		why = fmt.Sprintf("agent %q already has as many open sessions as server.max_sessions allows (%d; server.max_sessions_per_agent is unset, so one agent may hold them all): end the sessions you no longer use (HTTP DELETE with their Mcp-Session-Id; %s), or ask the gateway's operator to raise server.max_sessions", who, open, idle)
	}
	if limit == limitTotal {
		status = http.StatusServiceUnavailable
		why = fmt.Sprintf("the gateway already has as many open sessions as server.max_sessions allows (%d): retry later (%s), or ask the gateway's operator to raise server.max_sessions", open, idle)
	}
	if ok, quiet := warn.allow(); ok {
		g.logger.Warn("refused a new session: "+limit+" session bound reached", "agent", who, "open", open, "status", status, "refused_since_last_warning", quiet)
	}
	if m := g.opts.Metrics; m != nil {
		m.SessionRefused(limit)
	}
	dropBody(w, r)
	b, _ := json.Marshal("cmcp: " + why)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"jsonrpc":"2.0","id":null,"error":{"code":%d,"message":%s}}`+"\n", code, b)
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
