package upstream

import "syscall"

// withPdeathsig has the kernel kill the child when the gateway dies.
func withPdeathsig(a *syscall.SysProcAttr) *syscall.SysProcAttr {
	a.Pdeathsig = syscall.SIGKILL
	return a
}
