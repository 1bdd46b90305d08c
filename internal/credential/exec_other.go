//go:build !linux

package credential

import "syscall"

// helperAttr puts a helper in its own process group.
func helperAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
