//go:build !linux

package upstream

import "syscall"

// withPdeathsig: only Linux has a parent-death signal. Elsewhere a child
// outlives a gateway that is killed with SIGKILL; on a clean shutdown the
// gateway still kills the child's process group.
func withPdeathsig(a *syscall.SysProcAttr) *syscall.SysProcAttr { return a }
