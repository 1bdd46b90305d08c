package upstream

import "golang.org/x/sys/unix"

// waitExited waits until the child pid has exited, without reaping it (it
// stays a zombie until cmd.Wait). It reports false if it could not wait.
func waitExited(pid int) bool {
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err != unix.EINTR {
			return err == nil
		}
	}
}
