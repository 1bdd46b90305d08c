//go:build !linux

package bench

import "syscall"

// withPdeathsig: only Linux has a parent-death signal.
func withPdeathsig(a *syscall.SysProcAttr) *syscall.SysProcAttr { return a }
