//go:build !linux

package logdir

import "os"

// Fdatasync flushes f to disk. Outside Linux it is a full fsync (on macOS
// os.File.Sync uses F_FULLFSYNC).
func Fdatasync(f *os.File) error { return f.Sync() }
