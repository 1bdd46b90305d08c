//go:build !linux

package auditlog

import "os"

// fdatasync flushes f to stable storage. Outside Linux there is no
// fdatasync; (*os.File).Sync is fsync, or F_FULLFSYNC on macOS.
func fdatasync(f *os.File) error { return f.Sync() }
