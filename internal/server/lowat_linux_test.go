package server

import (
	"net"
	"testing"

	"github.com/confidential-mcp/cmcp/internal/front/httpfront"
	"golang.org/x/sys/unix"
)

// TestServeListenerBoundsUnsentBytes: the connections cmcp serve's MCP
// listener accepts queue at most httpfront.NotSentLowat bytes unsent
// (TCP_NOTSENT_LOWAT), so that a write of an answer goes on as the agent
// reads (TestUnreadAnswerEndsItsSession shows what that changes).
func TestServeListenerBoundsUnsentBytes(t *testing.T) {
	ln, err := listenMCP(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}, "127.0.0.1:0", false)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dialed := make(chan net.Conn, 1)
	go func() {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Error(err)
		}
		dialed <- c
	}()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if d := <-dialed; d != nil {
		defer d.Close()
	}
	tc, ok := c.(*net.TCPConn)
	if !ok {
		t.Fatalf("accepted a %T", c)
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var gerr error
	if err := raw.Control(func(fd uintptr) { v, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_NOTSENT_LOWAT) }); err != nil || gerr != nil {
		t.Fatal(err, gerr)
	}
	if v != httpfront.NotSentLowat {
		t.Fatalf("TCP_NOTSENT_LOWAT of an accepted connection: %d, want %d", v, httpfront.NotSentLowat)
	}
}
