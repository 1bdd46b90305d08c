// Package sessionbounds holds the bounds on open agent sessions that the
// configuration (server.max_sessions, server.max_sessions_per_agent) and
// the HTTP front both apply: their defaults, how an unset bound follows
// from the other, the count of open sessions held against them (Slots),
// and the start-up warning when the process may open too few files for
// them.
package sessionbounds

// The defaults. A live session holds memory and descriptors (a child per
// per-session stdio upstream); see config.DefaultMaxSessions.
const (
	DefaultTotal    = 256
	DefaultPerAgent = 64
)

// Resolve returns the bound in all and the bound per agent for the values
// set (0 or less: unset). Unset, the bound per agent is DefaultPerAgent or
// the bound in all, whichever is less.
func Resolve(total, perAgent int) (int, int) {
	t := DefaultTotal
	if total > 0 {
		t = total
	}
	p := min(DefaultPerAgent, t)
	if perAgent > 0 {
		p = perAgent
	}
	return t, p
}

// PerAgentInherited reports whether the bound per agent follows from the
// bound in all (per agent unset, and the bound in all below the default
// per agent): then raising the bound in all raises it. At or above the
// default it is the default, which only setting the bound per agent
// raises.
func PerAgentInherited(total, perAgent int) bool {
	t, _ := Resolve(total, perAgent)
	return perAgent <= 0 && t < DefaultPerAgent
}
