package logdir

import (
	"os"
	"syscall"
)

// TestHookSynced, if set (by tests), is told of every successful fdatasync.
var TestHookSynced func(*os.File)

// Fdatasync flushes f's data (and the size change of an append) to disk.
func Fdatasync(f *os.File) error {
	for {
		err := syscall.Fdatasync(int(f.Fd()))
		if err != syscall.EINTR {
			if TestHookSynced != nil && err == nil {
				TestHookSynced(f)
			}
			return err
		}
	}
}
