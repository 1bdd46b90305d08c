//go:build !linux

package httpfront

import "net"

// setNotSentLowat does nothing where TCP_NOTSENT_LOWAT is not set this way.
func setNotSentLowat(*net.TCPConn, int) {}
