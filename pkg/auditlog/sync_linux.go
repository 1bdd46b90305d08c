package auditlog

import (
	"os"
	"syscall"
)

// testHookSynced, if set (by tests), is told of every successful fdatasync.
var testHookSynced func(*os.File)

// fdatasync flushes f's data (and the size change of an append) to disk.
func fdatasync(f *os.File) error {
	for {
		err := syscall.Fdatasync(int(f.Fd()))
		if err != syscall.EINTR {
			if testHookSynced != nil && err == nil {
				testHookSynced(f)
			}
			return err
		}
	}
}
