package upstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// rawIDPrefix starts the ids of requests sent with RawCall. go-sdk's client
// numbers its requests with integers, so the two never collide.
const rawIDPrefix = "cmcp-"

// rawCalls is the request table of one stdio connection for calls made
// outside the MCP client: their responses are taken off the wire by the
// read loop, in wire order with the notifications before them, and handed
// back as the exact bytes the upstream sent.
type rawCalls struct {
	mu      sync.Mutex
	next    uint64
	pending map[string]chan *jsonrpc.Response
	err     error // the connection failed: every call fails with this
}

// register returns a fresh request id and the channel its response arrives on.
func (r *rawCalls) register() (string, chan *jsonrpc.Response, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return "", nil, r.err
	}
	if r.pending == nil {
		r.pending = map[string]chan *jsonrpc.Response{}
	}
	r.next++
	id := rawIDPrefix + strconv.FormatUint(r.next, 10)
	ch := make(chan *jsonrpc.Response, 1)
	r.pending[id] = ch
	return id, ch, nil
}

func (r *rawCalls) forget(id string) {
	r.mu.Lock()
	delete(r.pending, id)
	r.mu.Unlock()
}

// deliver takes resp if it answers a raw call (a late answer to a call that
// was given up is dropped); it reports whether resp was one of ours.
func (r *rawCalls) deliver(resp *jsonrpc.Response) bool {
	id, ok := resp.ID.Raw().(string)
	if !ok || !strings.HasPrefix(id, rawIDPrefix) {
		return false
	}
	r.mu.Lock()
	ch := r.pending[id]
	delete(r.pending, id)
	r.mu.Unlock()
	if ch != nil {
		ch <- resp
	}
	return true
}

// fail ends every pending call and every later one with err.
func (r *rawCalls) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err == nil {
		r.err = err
	}
	for id, ch := range r.pending {
		close(ch)
		delete(r.pending, id)
	}
}

func (r *rawCalls) failure() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// ErrRawUnsupported is returned by Conn.RawCall on connections that cannot
// make raw calls (callers use the MCP client session instead).
var ErrRawUnsupported = errors.New("raw calls are not supported on this connection")

// RawCall sends one request with params (a JSON object, sent verbatim) and
// returns the upstream's result exactly as it sent it, or its JSON-RPC
// error as a *jsonrpc.Error. If ctx ends first, the upstream is sent
// notifications/cancelled for the request and ctx.Err() is returned. A
// connection that fails (the child exits or desynchronises) fails the
// call with the reason.
func (c *Conn) RawCall(ctx context.Context, method string, params json.RawMessage) (json.RawMessage, error) {
	if c.raw == nil {
		return nil, ErrRawUnsupported
	}
	return c.raw(ctx, method, params)
}

// CanRawCall reports whether RawCall works on this connection.
func (c *Conn) CanRawCall() bool { return c.raw != nil }

func (c *childConn) rawCall(ctx context.Context, method string, params json.RawMessage) (json.RawMessage, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	id, ch, err := c.raw.register()
	if err != nil {
		return nil, err
	}
	b := encodeRequest(id, method, params)
	if err := c.child.write(b); err != nil {
		c.raw.forget(id)
		if f := c.raw.failure(); f != nil {
			return nil, f
		}
		return nil, fmt.Errorf("upstream %q: write stdin: %w", c.child.name, err)
	}
	select {
	case resp, ok := <-ch:
		if !ok {
			return nil, c.raw.failure()
		}
		if resp.Error != nil {
			return nil, resp.Error
		}
		return resp.Result, nil
	case <-ctx.Done():
		c.raw.forget(id)
		n := cancelledNotification(id, ctx.Err())
		_ = c.child.write(n)
		return nil, ctx.Err()
	}
}

// encodeRequest writes a JSON-RPC request with a raw-call id and params
// (a JSON object, copied verbatim).
func encodeRequest(id, method string, params json.RawMessage) []byte {
	m, _ := json.Marshal(method)
	b := make([]byte, 0, len(params)+len(m)+len(id)+48)
	b = append(b, `{"jsonrpc":"2.0","id":"`...)
	b = append(b, id...)
	b = append(b, `","method":`...)
	b = append(b, m...)
	b = append(b, `,"params":`...)
	b = append(b, params...)
	b = append(b, '}')
	return b
}

// cancelledNotification is notifications/cancelled for the raw call id,
// giving why (ctxErr is the call context's error).
func cancelledNotification(id string, ctxErr error) []byte {
	reason := "the request was cancelled"
	if errors.Is(ctxErr, context.DeadlineExceeded) {
		reason = "the gateway's per-call timeout expired"
	}
	n, _ := json.Marshal(struct {
		JSONRPC string `json:"jsonrpc"`
		Method  string `json:"method"`
		Params  any    `json:"params"`
	}{"2.0", "notifications/cancelled", map[string]string{"requestId": id, "reason": reason}})
	return n
}
