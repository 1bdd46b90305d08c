//go:build !linux

package pid1

import "io"

// Run does nothing outside Linux: cmcp runs as process 1 of a PID namespace
// only in a Linux container.
func Run(io.Writer) (code int, done bool) { return 0, false }
