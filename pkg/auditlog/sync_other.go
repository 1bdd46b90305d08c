//go:build !linux

package auditlog

import "os"

// fdatasync flushes f to disk. Outside Linux it is a full fsync (on macOS
// os.File.Sync uses F_FULLFSYNC).
func fdatasync(f *os.File) error { return f.Sync() }
