package bench

import "syscall"

// withPdeathsig has the kernel kill the process when the benchmark dies.
func withPdeathsig(a *syscall.SysProcAttr) *syscall.SysProcAttr {
	a.Pdeathsig = syscall.SIGKILL
	return a
}
