package auditlog

import (
	"os"
	"syscall"
)

// fdatasync flushes f's data (and the size change of an append) to disk.
func fdatasync(f *os.File) error {
	for {
		err := syscall.Fdatasync(int(f.Fd()))
		if err != syscall.EINTR {
			return err
		}
	}
}
