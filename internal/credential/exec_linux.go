package credential

import "syscall"

// helperAttr puts a helper in its own process group, killed if the gateway dies.
func helperAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
