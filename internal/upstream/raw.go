package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// rawIDPrefix starts the ids of requests sent with RawCall (an
// rpcwire.Pending per connection): their responses are taken off the wire
// by the read loop, in wire order with the notifications before them, and
// handed back as the exact bytes the upstream sent.
const rawIDPrefix = "cmcp-"

// cancelWriteWait bounds how long notifications/cancelled for a call that
// ended waits for a child that does not read its stdin.
const cancelWriteWait = time.Second

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

type checkedKey struct{}

// checkedMark is the Extra of a response to a raw call whose whole line
// passed the strict decoder (rpcwire.DecodeFast: valid JSON, valid UTF-8,
// no repeated member names at any depth).
type checkedMark struct{}

// WithChecked returns a context with which a raw call sets *checked to
// whether the result it returns was part of a line checked strictly when
// it arrived (a stdio child's answer that rpcwire.DecodeFast took), so
// that the caller need not check the result again. A result it does not
// vouch for (another kind of connection, or a line only go-sdk's decoder
// took) leaves *checked false.
func WithChecked(ctx context.Context, checked *bool) context.Context {
	return context.WithValue(ctx, checkedKey{}, checked)
}

// setChecked reports resp's strictness to the caller of a raw call.
func setChecked(ctx context.Context, resp *jsonrpc.Response) {
	if p, _ := ctx.Value(checkedKey{}).(*bool); p != nil {
		_, *p = resp.Extra.(checkedMark)
	}
}

// RawCallThen is RawCall whose end runs done instead of returning: on a
// stdio child's connection, in the child's read loop once the answer is
// read (no goroutine waits for it), in the goroutine of ctx's end
// (context.AfterFunc: the upstream is sent notifications/cancelled first),
// or in the goroutine of the connection's failure; on other connections,
// and when the request cannot be sent, in the caller's goroutine before
// RawCallThen returns. done runs exactly once, and may block its goroutine
// for as long as it takes: a child's read loop reads its next line once
// done returns (back-pressure on that connection alone).
func (c *Conn) RawCallThen(ctx context.Context, method string, params json.RawMessage, done func(json.RawMessage, error)) {
	switch {
	case c.rawThen != nil:
		c.rawThen(ctx, method, params, done)
	case c.raw != nil:
		done(c.raw(ctx, method, params))
	default:
		done(nil, ErrRawUnsupported)
	}
}

// CanRawCall reports whether RawCall works on this connection.
func (c *Conn) CanRawCall() bool { return c.raw != nil }

func (c *childConn) rawCall(ctx context.Context, method string, params json.RawMessage) (json.RawMessage, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	params, err := c.oneLine(method, params)
	if err != nil {
		return nil, err
	}
	id, ch, err := c.raw.Register()
	if err != nil {
		return nil, err
	}
	b := encodeRequest(id, method, params)
	if err := c.child.write(ctx, b); err != nil {
		c.raw.Forget(id)
		return nil, c.writeFailed(err)
	}
	Waiting(ctx)
	select {
	case resp, ok := <-ch:
		if !ok {
			return nil, c.raw.ErrOf(id)
		}
		if resp.Error != nil {
			return nil, resp.Error
		}
		setChecked(ctx, resp)
		return resp.Result, nil
	case <-ctx.Done():
		c.raw.Forget(id)
		c.sendCancelled(ctx, id)
		return nil, ctx.Err()
	}
}

// rawCallThen is rawCall with its end in done (Conn.RawCallThen): the
// read loop runs it with the answer; ctx's end, through context.AfterFunc,
// or the connection's failure without one. Whichever takes the request
// out of the table (rpcwire.Pending) runs done, so it runs once.
func (c *childConn) rawCallThen(ctx context.Context, method string, params json.RawMessage, done func(json.RawMessage, error)) {
	if err := ctx.Err(); err != nil {
		done(nil, err)
		return
	}
	params, err := c.oneLine(method, params)
	if err != nil {
		done(nil, err)
		return
	}
	w := &rawWait{}
	id, err := c.raw.RegisterFunc(func(resp *jsonrpc.Response, err error) {
		w.ended()
		switch {
		case err != nil:
			done(nil, err)
		case resp.Error != nil:
			done(nil, resp.Error)
		default:
			setChecked(ctx, resp)
			done(resp.Result, nil)
		}
	})
	if err != nil {
		done(nil, err)
		return
	}
	if err := c.child.write(ctx, encodeRequest(id, method, params)); err != nil {
		if c.raw.Forget(id) {
			done(nil, c.writeFailed(err))
		}
		return
	}
	Waiting(ctx)
	w.watch(context.AfterFunc(ctx, func() {
		if c.raw.Forget(id) {
			c.sendCancelled(ctx, id)
			done(nil, ctx.Err())
		}
	}))
}

// rawWait stops the watch on a raw call's context (rawCallThen) once the
// call has ended, whichever of the two comes first.
type rawWait struct {
	mu    sync.Mutex
	over  bool
	unset func() bool
}

// watch keeps stop, the end of the watch, to call when the call ends; if
// it has ended already, it is called now.
func (w *rawWait) watch(stop func() bool) {
	w.mu.Lock()
	if w.over {
		w.mu.Unlock()
		stop()
		return
	}
	w.unset = stop
	w.mu.Unlock()
}

// ended notes the call's end and stops the watch, if there is one.
func (w *rawWait) ended() {
	w.mu.Lock()
	w.over = true
	stop := w.unset
	w.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// writeFailed is the error of a raw call whose request could not be
// written: the connection's failure if it failed, else the write's.
func (c *childConn) writeFailed(err error) error {
	if f := c.raw.Err(); f != nil {
		return f
	}
	return fmt.Errorf("upstream %q: write stdin: %w", c.child.name, err)
}

// sendCancelled tells the child that the raw call id ended with ctx. The
// child may be the reason the call ended: the notification waits for its
// stdin a moment only.
func (c *childConn) sendCancelled(ctx context.Context, id string) {
	n := cancelledNotification(id, ctx.Err())
	nctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cancelWriteWait)
	_ = c.child.write(nctx, n)
	cancel()
}

// oneLine returns params as one line (see below), or why it cannot be.
func (c *childConn) oneLine(method string, params json.RawMessage) (json.RawMessage, error) {
	// The child reads one message a line. Line breaks between the params'
	// tokens (an agent on HTTP may indent its request) would cut the
	// request into lines, and a server that reads line by line, as the
	// TypeScript and Python SDKs' do, would take a line that holds a whole
	// message of its own (an array element, say) for a request the agent
	// sent it past the policy and the audit log: they go, nothing else.
	if bytes.ContainsAny(params, "\r\n") {
		var b bytes.Buffer
		if err := json.Compact(&b, params); err != nil {
			return nil, fmt.Errorf("upstream %q: %s params are not JSON: %w", c.child.name, method, err)
		}
		params = b.Bytes()
	}
	return params, nil
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
