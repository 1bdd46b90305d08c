package rpcwire

import (
	"context"
	"io"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// Inbox hands the messages of a connection's read loop to its Read calls,
// for the mcp.Connection implementations of cmcp's stdio transports. The
// read loop calls Deliver for each message and Fail once when it stops;
// Read returns the messages in order, then the failure; Close ends both.
type Inbox struct {
	incoming chan jsonrpc.Message
	closed   chan struct{}
	once     sync.Once

	mu  sync.Mutex
	err error
}

// NewInbox returns an open Inbox.
func NewInbox() *Inbox {
	return &Inbox{incoming: make(chan jsonrpc.Message), closed: make(chan struct{})}
}

// Deliver waits until a Read takes msg; it returns false if the Inbox was
// closed first (the read loop should stop).
func (b *Inbox) Deliver(msg jsonrpc.Message) bool {
	select {
	case b.incoming <- msg:
		return true
	case <-b.closed:
		return false
	}
}

// Fail ends the stream: every later Read returns err. Call it once, from the
// read loop.
func (b *Inbox) Fail(err error) {
	b.mu.Lock()
	b.err = err
	b.mu.Unlock()
	close(b.incoming)
}

// Read returns the next message, the read loop's failure once it stopped,
// io.EOF after Close, or the context's error.
func (b *Inbox) Read(ctx context.Context) (jsonrpc.Message, error) {
	select {
	case msg, ok := <-b.incoming:
		if !ok {
			b.mu.Lock()
			defer b.mu.Unlock()
			return nil, b.err
		}
		return msg, nil
	case <-b.closed:
		return nil, io.EOF
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Close makes Read and Deliver return; it reports whether this call closed
// the Inbox (so the caller releases its resources once).
func (b *Inbox) Close() bool {
	first := false
	b.once.Do(func() { close(b.closed); first = true })
	return first
}
