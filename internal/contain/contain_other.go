//go:build !linux

package contain

import (
	"syscall"
	"time"
)

// Setup: no subreaper or cgroup outside Linux (stdio upstreams need Linux).
func Setup() Info { return Info{Mode: ModeNone, Why: "not Linux"} }

// Current is the containment in force.
func Current() Info { return Info{Mode: ModeNone, Why: "not Linux"} }

// Group is the cgroup of one child (none here).
type Group struct{}

// NewGroup returns nil: no cgroups here.
func NewGroup(string) (*Group, error) { return nil, nil }

// Path is "".
func (g *Group) Path() string { return "" }

// Apply does nothing.
func (g *Group) Apply(*syscall.SysProcAttr) {}

// Kill does nothing.
func (g *Group) Kill(time.Duration) error { return nil }

// KillPath does nothing.
func KillPath(string) {}

// Starting returns a function that does nothing.
func Starting() func() { return func() {} }

// OwnLocked does nothing.
func OwnLocked(int) {}

// Disown does nothing.
func Disown(int) {}

// KillOrphans kills nothing.
func KillOrphans(func(int) bool) int { return 0 }
