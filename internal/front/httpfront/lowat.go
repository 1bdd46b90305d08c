package httpfront

import "net"

// NotSentLowat is how many bytes a connection of the HTTP front may hold
// queued and not yet sent (TCP_NOTSENT_LOWAT, Linux). Without it the kernel
// takes megabytes of an answer at once (autotuned send buffers), then lets
// a blocked write go on only once about a third of that has drained: an
// agent reading a large answer slowly but steadily made no progress a
// write could see for longer than WriteStallTimeout, and was cut. With it,
// each write of a response goes on as soon as the agent has read a little.
const NotSentLowat = 128 << 10

// lowatListener sets NotSentLowat on every connection it accepts.
type lowatListener struct{ net.Listener }

// LowWatermarkListener wraps the HTTP front's TCP listener (under TLS, if
// any) so that writing an answer progresses as the agent reads it
// (NotSentLowat). server.Serve uses it; so should anything that serves
// the front (New) on its own listener.
func LowWatermarkListener(ln net.Listener) net.Listener { return lowatListener{ln} }

func (l lowatListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		setNotSentLowat(tc, NotSentLowat)
	}
	return c, err
}
